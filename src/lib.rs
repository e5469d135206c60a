//! dlock: a distributed lock manager.
//!
//! This crate holds what every dlock program shares:
//!
//! - [`proto`]: the wire types generated from `proto/dlock.proto`, the contract
//!   between clients and the server (see `docs/PROTOCOL.md`).
//! - [`codec`]: the length-prefixed framing those messages travel in.
//! - [`duration`]: how durations are written on every dlock command line.
//! - [`Client`] (`client.rs`), [`LockGuard`] (`guard.rs`), [`Error`]
//!   (`error.rs`): the client library. One connection serves many tasks;
//!   requests are pipelined. `link.rs`: one connection's writer and reader,
//!   `dial.rs`: finding the server or the cluster's leader,
//!   and against a cluster the session resumed across reconnects
//!   ([`Event`], [`Servers`]). `enqueue.rs`: the two-phase acquire
//!   ([`Client::enqueue`], [`Enqueued`], [`Queued`]).
//! - [`Election`] (`election.rs`): leader election on a key, its
//!   [`Leadership`] and observers of the [`Leader`]; [`KeyState`]
//!   (`inspect.rs`): what Inspect and Watch report, as Rust types.
//! - [`safety`]: when a held lock must be given up, judged from the client's
//!   side alone ([`Lost`]); [`Limits`] (`limits.rs`): what the server allows.
//! - [`token_file`]: the access-token file format.
//! - `raw` (feature `raw`): a client that speaks raw frames, for tests,
//!   `dlock-bench` and `dlock-torture`.
//! - `proc_sample` (feature `proc-sample`): CPU time and memory of a process
//!   from /proc, for the same tools.
//! - [`tls`]: TLS settings from PEM files (rustls, ring); `transport.rs`
//!   the client's stream, TCP or TLS.
//!
//! The daemon lives in the `dlock-server` crate, the `dlock` command in
//! `dlock-client`.

#![warn(missing_docs)]

mod client;
pub mod codec;
mod dial;
pub mod duration;
mod election;
mod enqueue;
mod error;
mod event;
mod guard;
mod inspect;
mod jitter;
mod keys;
mod limits;
mod link;
mod liveness;
#[cfg(feature = "proc-sample")]
pub mod proc_sample;
#[cfg(feature = "raw")]
pub mod raw;
pub mod safety;
mod servers;
pub mod tls;
pub mod token_file;
mod transport;

pub use client::{Client, ClientOptions, LockOptions, LockWait};
pub use election::{Election, Leader, Leadership};
pub use enqueue::{Enqueued, Queued};
pub use error::{Disconnect, Error, Result};
pub use event::Event;
pub use guard::{LockGuard, LockParts};
pub use inspect::{Holder, KeyState, Overview};
pub use keys::{IntoKeys, Keys};
pub use limits::{LimitError, Limits};
pub use safety::Lost;
pub use servers::Servers;

/// Wire types generated from `proto/dlock.proto`.
#[allow(missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/dlock.rs"));
}

/// Protocol version this crate speaks and the server answers with.
pub const PROTOCOL_VERSION: u32 = 2;

/// Default address of the server: loopback only, so a fresh install is not
/// reachable from the network until the operator says so.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7436";

/// Longest value a hold may carry (Lock's and Proclaim's `value`), in
/// bytes: an identity or an address, not data.
pub const MAX_VALUE_LEN: usize = 1024;

/// Default maximum frame body size in bytes, the original dlock's limit.
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024;

/// Largest response frame the client accepts. Responses echo keys (Inspect,
/// busy lists), so this allows for a maximal request's worth and more.
pub const MAX_RESPONSE_FRAME: usize = 4 * 1024 * 1024;
