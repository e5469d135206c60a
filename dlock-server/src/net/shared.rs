//! What every connection of a server shares: the service and the TLS
//! settings of the client port. One value per server, behind an `Arc`; the
//! accept loop, the connections, the fuzz harness and the pipeline tests
//! all build it the same way.

use crate::net::tls::Tls;
use crate::ops::config::Config;
use crate::service::Service;
use std::sync::Arc;

/// State every connection shares.
#[derive(Debug)]
pub struct Shared {
    /// The requests' service, over the server's engine.
    pub service: Arc<Service>,
    /// TLS on the client port, when configured.
    pub tls: Option<Tls>,
}

impl Shared {
    /// A server's shared state around `service`.
    pub fn new(service: Arc<Service>) -> Shared {
        Shared { service, tls: None }
    }

    /// The shared state of a server with TLS on its client port.
    pub fn with_tls(mut self, tls: Option<Tls>) -> Shared {
        self.tls = tls;
        self
    }

    /// The options the server runs with.
    pub fn config(&self) -> &Config {
        self.service.config()
    }
}
