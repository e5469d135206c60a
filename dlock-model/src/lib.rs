//! dlock's client–session protocol as a model that
//! [stateright](https://docs.rs/stateright) checks over every interleaving
//! of a small cluster: two clients contend for one key through a cluster
//! of a few nodes, over connections that are delayed, reset, closed and
//! resumed elsewhere, with leaders that are deposed. The clients decide what they believe with the library's
//! own rules (`dlock::rules`); the cluster's state is the server's own lock
//! table (`dlock_server::table`). See docs/RELIABILITY.md, "The
//! client–session model", for what is modelled, what is abstracted, how to
//! run it and how to read a trace.
//!
//! Layout:
//! - [`tick`]: the model's time;
//! - [`config`]: sizes, durations, bounds, and the re-introduced [`Bug`]s;
//! - [`table`]: the replicated lock table, hashable;
//! - [`cluster`]: nodes, terms and who answers what;
//! - [`network`]: requests, answers and a client's connection;
//! - [`sessions`]: what a node keeps of connections, and ends with them;
//! - [`client`]: a client's beliefs, by the real rules;
//! - [`model`]: the state, the actions and the properties;
//! - [`replication`]: a second, smaller model: Raft's replication with a
//!   log per node, votes and commits, which justifies the one log of
//!   [`cluster`];
//! - [`ownership`]: a third: tasks sharing one client, and which of their
//!   locks a grant belongs to;
//! - [`trace`]: a counterexample as a numbered timeline;
//! - [`check`]: one run of the checker, with its counts.

pub mod check;
pub mod client;
pub mod cluster;
pub mod config;
pub mod model;
pub mod network;
pub mod ownership;
pub mod replication;
pub mod sessions;
pub mod table;
pub mod tick;
pub mod trace;

pub use config::{Bug, Config};
pub use model::{SessionModel, State};
