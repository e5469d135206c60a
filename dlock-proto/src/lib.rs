//! dlock's wire contract, the bottom floor of every dlock program.
//!
//! - [`proto`]: the wire types generated from `proto/dlock.proto`, the
//!   contract between clients and the server (see `docs/PROTOCOL.md`).
//! - [`codec`]: the length-prefixed framing those messages travel in.
//! - [`Limits`] (`limits.rs`): what a server allows, as its Hello says.
//! - The protocol's constants: [`PROTOCOL_VERSION`], [`DEFAULT_ADDR`] and
//!   the frame and value limits.
//! - The notations every dlock program reads, so the server, the client
//!   library and the tools read them alike: [`duration`] (durations on
//!   command lines), [`token_file`] (the access-token file) and [`tls`]
//!   (certificates and keys in PEM files, rustls with ring).
//!
//! It holds no client and no server: the server (`dlock-server`) and the
//! client library (`dlock`) both build on it, and neither on the other.

#![warn(missing_docs)]

pub mod codec;
pub mod duration;
mod limits;
pub mod tls;
pub mod token_file;

pub use limits::{LimitError, Limits};

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
