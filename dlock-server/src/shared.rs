//! What every connection of a server shares: the lock state, the
//! configuration, the access rules and TLS settings. One value per server, behind an
//! `Arc`; the accept loop, the connections, the fuzz harness and the
//! pipeline tests all build it the same way.

use crate::acl::Access;
use crate::config::Config;
use crate::db::Db;
use crate::replicated::Replicated;
use crate::table::TableLimits;
use crate::tls::Tls;
use crate::watch::WatchPermits;
use std::sync::Arc;

/// State every connection shares.
#[derive(Debug)]
pub struct Shared {
    /// The lock state.
    pub db: Db,
    /// Limits and options.
    pub config: Config,
    /// Who may do what.
    pub access: Access,
    /// TLS on the client port, when configured.
    pub tls: Option<Tls>,
    /// On a cluster node: where requests that need the table go. The `db`
    /// then only counts connections.
    pub cluster: Option<Arc<Replicated>>,
    /// The bound on parked Watches (`--max-watchers`).
    pub watches: WatchPermits,
}

impl Shared {
    /// A server's shared state around `db`.
    pub fn new(db: Db, config: Config, access: Access) -> Shared {
        Shared {
            db,
            watches: WatchPermits::new(config.max_watchers),
            config,
            access,
            tls: None,
            cluster: None,
        }
    }

    /// The shared state of a server with TLS on its client port.
    pub fn with_tls(mut self, tls: Option<Tls>) -> Shared {
        self.tls = tls;
        self
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
