//! A TCP forwarder that a test can freeze: the failure a network partition
//! or a stuck middlebox looks like from both ends. While frozen, both sockets
//! stay open and nothing gets through, in either direction: no bytes, no
//! FIN, no RST. Thawed, everything held back is delivered. Severed, every
//! connection is reset (RST, as a path that broke, not a clean close) and new
//! ones are refused until healed: a client cut off from its server.
//!
//! Clients connect to [`FreezableProxy::addr`]; each connection is forwarded
//! to the upstream address given at start.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running forwarder on an ephemeral loopback port.
#[derive(Debug)]
pub struct FreezableProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    severed: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl FreezableProxy {
    /// Starts forwarding `127.0.0.1:0` → `upstream`.
    ///
    /// # Panics
    /// If no loopback port can be bound: a broken test machine.
    pub async fn start(upstream: SocketAddr) -> FreezableProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("bound listener has an address");
        let (frozen, _) = watch::channel(false);
        let (severed, _) = watch::channel(false);
        let gate = frozen.clone();
        let cut = severed.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cut.borrow() {
                    reset(&client);
                    continue;
                }
                let gate = gate.subscribe();
                let mut cut = cut.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                forward(&mut cr, &mut sw, gate.clone()),
                                forward(&mut sr, &mut cw, gate)
                            )
                        } => {}
                        _ = cut.wait_for(|severed| *severed) => {
                            reset(cr.as_ref());
                            reset(sr.as_ref());
                        }
                    }
                });
            }
        });
        FreezableProxy {
            addr,
            frozen,
            severed,
            accept,
        }
    }

    /// The address as `ip:port`.
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }

    /// Stops all traffic through existing and new connections.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Lets traffic through again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Resets every connection through the proxy, both ways, and refuses
    /// new ones (with a reset) until [`FreezableProxy::heal`].
    pub fn sever(&self) {
        self.severed.send_replace(true);
    }

    /// Accepts connections again after [`FreezableProxy::sever`].
    pub fn heal(&self) {
        self.severed.send_replace(false);
    }
}

/// Makes the socket's close a reset: no linger, no FIN.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(std::time::Duration::ZERO));
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies one direction, checking the gate before each read and each write,
/// so bytes already read are held back while frozen.
async fn forward(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
