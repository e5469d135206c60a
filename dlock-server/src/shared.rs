//! What every connection of a server shares: the lock state, the
//! configuration and the access tokens. One value per server, behind an
//! `Arc`; the accept loop, the connections, the fuzz harness and the
//! pipeline tests all build it the same way.

use crate::auth::Tokens;
use crate::config::Config;
use crate::db::Db;
use crate::replicated::Replicated;
use crate::table::TableLimits;
use std::sync::Arc;

/// State every connection shares.
#[derive(Debug)]
pub struct Shared {
    /// The lock state.
    pub db: Db,
    /// Limits and options.
    pub config: Config,
    /// Accepted access tokens.
    pub tokens: Tokens,
    /// On a cluster node: where requests that need the table go. The `db`
    /// then only counts connections.
    pub cluster: Option<Arc<Replicated>>,
}

impl Shared {
    /// A server's shared state around `db`.
    pub fn new(db: Db, config: Config, tokens: Tokens) -> Shared {
        Shared {
            db,
            config,
            tokens,
            cluster: None,
        }
    }

    /// The shared state of a cluster node.
    pub fn with_cluster(mut self, node: Arc<Replicated>) -> Shared {
        self.cluster = Some(node);
        self
    }

    /// The table limits `config` sets.
    pub fn table_limits(config: &Config) -> TableLimits {
        TableLimits {
            max_waiters: config.max_waiters,
            max_held_keys: config.max_held_keys,
        }
    }
}
