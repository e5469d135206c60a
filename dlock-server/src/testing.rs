//! A server for tests: bound to `127.0.0.1:0`, running in the caller's
//! runtime, stopped on request. Used by this workspace's integration tests
//! and available to anyone testing code against dlock, with the feature
//! `testing` (a dev-dependency's feature, so the shipped server has none of
//! it). [`proxy`] puts a forwarder the test can freeze between a client and
//! the server; [`nodes`] runs a cluster of real server processes, and
//! [`peer_links`] puts such a forwarder on every link between them.

pub mod nodes;
pub mod peer_links;
pub mod ports;
pub mod proxy;

use crate::Config;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running test server.
#[derive(Debug)]
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// Starts a server with `config` on an ephemeral loopback port
    /// (`config.listen` is not used). Limits are set as fields:
    /// `Config { max_keys: 3, ..Config::default() }`.
    ///
    /// # Panics
    /// If no loopback port can be bound: a broken test machine, not a
    /// condition to handle.
    pub async fn start(config: Config) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("local address of a bound listener");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::run(listener, config, async {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// The address as `ip:port`.
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }

    /// Shuts the server down as SIGTERM would and waits for it to finish.
    ///
    /// # Errors
    /// What `run` returned.
    ///
    /// # Panics
    /// If the server does not stop within a minute or its task panicked.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("server stops in time")
            .expect("server task did not panic")
    }
}
