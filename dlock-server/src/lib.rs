//! dlock-server: the dlock lock server.
//!
//! The layers, from the network down to the lock rules, are walked in
//! docs/ARCHITECTURE.md, the one layout table of this crate. In short:
//! [`net`] moves frames (server, connection, pipeline, TLS); [`service`]
//! answers every request once for both engines; [`engine`] keeps the table,
//! in memory or replicated on openraft; [`table`] holds the rules. [`ops`]
//! (config, access rules, metrics, reload, paced log lines) stands beside
//! them.
//!
//! `testing` and `fuzzing` are behind features of the same names so the
//! shipped server carries neither; tests, tools and `fuzz/` enable them.

#![warn(missing_docs)]

pub mod engine;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod net;
pub mod ops;
pub mod service;
pub mod table;
#[cfg(feature = "testing")]
pub mod testing;

pub use net::server::run;
pub use ops::config::{Config, LogFormat};

/// This build's version and the commit it was made from, as `--version`,
/// `dlock_build_info` and ClusterStatus give them: "0.1.0 (1a2b3c4d5e6f)".
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DLOCK_COMMIT"), ")");

/// The commit this build was made from (12 hex digits), or "unknown".
pub const COMMIT: &str = env!("DLOCK_COMMIT");
