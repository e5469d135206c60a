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
mod dial;
mod election;
mod enqueue;
mod error;
mod event;
mod guard;
mod inspect;
mod jitter;
mod keys;
mod link;
mod liveness;
#[cfg(feature = "proc-sample")]
pub mod proc_sample;
#[cfg(feature = "raw")]
pub mod raw;
pub mod safety;
mod servers;
mod transport;

pub use client::{Client, ClientOptions, LockOptions, LockWait};
pub use election::{Election, Leader, Leadership};
pub use enqueue::{Enqueued, Queued};
pub use error::{Disconnect, Error, Result};
pub use event::Event;
pub use guard::{LockGuard, LockParts};
pub use inspect::{Holder, KeyState, Overview};
pub use keys::{IntoKeys, Keys};
pub use safety::Lost;
pub use servers::Servers;

pub use dlock_proto::{
    codec, duration, proto, tls, token_file, LimitError, Limits, DEFAULT_ADDR, DEFAULT_MAX_FRAME,
    MAX_RESPONSE_FRAME, MAX_VALUE_LEN, PROTOCOL_VERSION,
};
