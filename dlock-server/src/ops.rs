//! What operators set and read, beside the floors: flags and limits,
//! access rules, metrics and their HTTP port, SIGHUP reloads, paced log
//! lines, the local cluster a newcomer tries first, and the certificates TLS
//! needs. Each takes what it needs from the floors through a narrow handle
//! (a callback, a value), so none of them imports the network, the service
//! or an engine.

pub mod acl;
pub mod ask;
pub mod cert;
pub mod config;
pub mod file_lock;
pub mod limit_log;
pub mod local_cluster;
pub mod logging;
pub mod metrics;
pub mod metrics_http;
pub mod ports;
pub mod reload;
