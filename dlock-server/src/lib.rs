//! dlock-server: the dlock lock server.
//!
//! | module | owns |
//! |---|---|
//! | [`server`] | accept loop, connection limit, socket options, shutdown |
//! | [`connection`] | one client: the socket, timeouts, shutdown |
//! | [`pipeline`] | a connection's requests: framing in place, parking, output |
//! | [`handler`] | validation of one request and its response |
//! | [`db`] | the shared table behind a mutex, timers, wake-up delivery |
//! | [`clock`] | the one clock read that stamps the table's commands |
//! | [`table`] | the lock rules: a deterministic state machine, no I/O, no clock |
//! | [`keymap`] | the table's key map, compact at millions of keys |
//! | [`fence`] | where fencing tokens start so they never go backwards |
//! | [`acl`] | access control: tokens, certificate names, rules by key prefix |
//! | [`reload`] | SIGHUP: access rules (and certificates) re-read, connections kept |
//! | [`limit_log`] | log lines for limits reached, paced to one a second |
//! | [`metrics`] | Prometheus counts, cheap on the request path, and their encoding |
//! | [`metrics_http`] | the operator's HTTP port: `/metrics`, `/healthz`, `/readyz` |
//! | [`fuzzing`] | the request path without sockets, for fuzzing |
//! | [`config`] | flags, defaults and limits |
//! | [`tls`] | TLS on the client port: certificates, reload, client certificate names |
//! | [`transport`] | what a connection needs of its stream, TCP or TLS |
//! | [`testing`] | a server on an ephemeral loopback port, for tests |

#![warn(missing_docs)]

pub mod acl;
pub mod clock;
pub mod config;
pub mod connection;
pub mod db;
pub mod fence;
pub mod fuzzing;
pub mod handler;
pub mod keymap;
pub mod limit_log;
pub mod metrics;
pub mod metrics_http;
pub mod pipeline;
pub mod reload;
pub mod server;
pub mod table;
pub mod testing;
pub mod tls;
pub mod transport;

pub use config::{Config, LogFormat};
pub use server::run;
