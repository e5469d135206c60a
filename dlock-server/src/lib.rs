//! dlock-server: the dlock lock server.
//!
//! | module | owns |
//! |---|---|
//! | [`server`] | accept loop, connection limit, socket options, shutdown |
//! | [`connection`] | one client: the socket, timeouts, shutdown |
//! | [`pending`] | a request answered later: a waiting Lock, a replicated command |
//! | [`pipeline`] | a connection's requests: framing in place, parking, output |
//! | [`shared`] | what every connection shares: lock state, config, tokens |
//! | [`owners`] | the owners a connection acts for: its own and its sessions |
//! | [`tickets`] | a connection's queued Enqueues, until their Wait |
//! | [`handler`] | validation of one request and its response |
//! | [`db`] | the shared table behind a mutex, timers, wake-up delivery |
//! | [`watch`] | Watch: long polls on a key's holder, woken by table changes |
//! | [`clock`] | the one clock read that stamps the table's commands |
//! | [`replicated`] | a cluster node's answers to clients: sessions, proposals |
//! | [`cluster`] | the table replicated on openraft: log, snapshots, peers |
//! | [`table`] | the lock rules: a deterministic state machine, no I/O, no clock |
//! | [`keymap`] | the table's key map, compact at millions of keys |
//! | [`fence`] | where fencing tokens start so they never go backwards |
//! | [`acl`] | access control: tokens, certificate names, rules by key prefix |
//! | [`reload`] | SIGHUP: access rules (and certificates) re-read, connections kept |
//! | [`limit_log`] | log lines for limits reached, paced to one a second |
//! | [`metrics`] | Prometheus counts, cheap on the request path, and their encoding |
//! | [`metrics_http`] | the operator's HTTP port: `/metrics`, `/healthz`, `/readyz` |
//! | [`tls`] | TLS on the client port: certificates, reload, client certificate names |
//! | [`transport`] | what a connection needs of its stream, TCP or TLS |
//! | `fuzzing` | the request path without sockets, for fuzzing (feature `fuzzing`) |
//! | [`config`] | flags, defaults and limits |
//! | `testing` | a server on an ephemeral loopback port, for tests (feature `testing`) |
//!
//! `testing` and `fuzzing` are behind features of the same names so the
//! shipped server carries neither; tests, tools and `fuzz/` enable them.

#![warn(missing_docs)]

pub mod acl;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod db;
pub mod fence;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod handler;
pub mod keymap;
pub mod limit_log;
pub mod metrics;
pub mod metrics_http;
pub mod owners;
pub mod pending;
pub mod pipeline;
pub mod reload;
pub mod replicated;
pub mod server;
pub mod shared;
pub mod table;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tickets;
pub mod tls;
pub mod transport;
pub mod watch;

pub use config::{Config, LogFormat};
pub use server::run;
