//! dlock: a distributed lock manager; this crate is its client library.
//!
//! - [`Client`]: one client shared by any number of tasks; each lock is
//!   taken on a connection of its own, so tasks take turns on a key as
//!   processes do, and everything else is pipelined. Against a cluster the
//!   session is resumed across reconnects ([`Event`], [`Servers`]).
//! - [`LockGuard`]: a held lock, its fencing token and its safety deadline
//!   ([`safety`], [`Lost`]); [`Client::enqueue`]: the two-phase acquire
//!   ([`Enqueued`], [`Queued`]); [`Election`]: leader election on a key.
//! - [`KeyState`] and [`Overview`]: what Inspect and Watch report.
//! - [`proto`], [`codec`], [`duration`], [`tls`], [`token_file`] and the
//!   protocol's constants are the `dlock-proto` crate's, re-exported.
//! - `raw` (feature `raw`): a client of raw frames to one node, for `dlock
//!   cluster`, tests and load tools.
//!
//! The modules below are listed by floor, bottom up: a file imports only
//! from its floor and below. docs/ARCHITECTURE.md draws the floors and maps
//! every file; the daemon is the `dlock-server` crate, the `dlock` command
//! `dlock-client`.

#![warn(missing_docs)]

// The floors, bottom up; a file imports only from its floor and below
// (tests/layers.rs keeps it so, and docs/ARCHITECTURE.md draws them).
// 1. What a caller sets and what the library reports, without I/O.
mod backoff;
mod disconnect;
mod error;
mod event;
mod inspect;
mod keys;
mod options;
mod request;
pub mod rules;
pub mod safety;
mod servers;
// 2. One stream to a node: TCP or TLS, Hello, finding the leader.
mod dial;
#[cfg(feature = "raw")]
pub mod raw;
mod transport;
// 3. A connection kept alive: writer and reader tasks, sessions resumed,
//    silent nodes probed.
mod link;
mod liveness;
// 4. The owner pool: a connection per lock.
mod owners;
// 5. The public client.
mod client;
// 6. What callers hold: locks, their guards, two-phase acquires, elections.
mod election;
mod enqueue;
mod guard;
mod lock;

pub use client::Client;
pub use election::{Election, Leader, Leadership};
pub use enqueue::{Enqueued, Queued};
pub use error::{Disconnect, Error, Result};
pub use event::Event;
pub use guard::{LockGuard, LockParts};
pub use inspect::{Holder, KeyState, Overview};
pub use keys::{IntoKeys, Keys};
pub use options::{ClientOptions, LockOptions, LockWait};
pub use safety::Lost;
pub use servers::Servers;

pub use dlock_proto::{
    codec, duration, proto, tls, token_file, LimitError, Limits, DEFAULT_ADDR, DEFAULT_MAX_FRAME,
    MAX_RESPONSE_FRAME, MAX_VALUE_LEN, PROTOCOL_VERSION,
};
