//! A TCP forwarder that a test can freeze: the failure a network partition
//! or a stuck middlebox looks like from both ends. While frozen, both sockets
//! stay open and nothing gets through, in either direction: no bytes, no
//! FIN, no RST. Thawed, everything held back is delivered. Severed, every
//! connection is reset (RST, as a path that broke, not a clean close) and new
//! ones are refused until healed: a client cut off from its server. Delayed,
//! every byte arrives late by the same time: a slow path. A reset from
//! either end is passed on as a reset (after what was sent before it), a
//! clean close as a clean close. (A reset is told from a clean close by the
//! socket's state, not by the read alone: see `was_reset`.)
//!
//! Clients connect to [`FreezableProxy::addr`]; each connection is forwarded
//! to the upstream address given at start.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A running forwarder on an ephemeral loopback port.
#[derive(Debug)]
pub struct FreezableProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    severed: watch::Sender<bool>,
    delay: watch::Sender<Duration>,
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
        let (delay, _) = watch::channel(Duration::ZERO);
        let gate = frozen.clone();
        let cut = severed.clone();
        let lag = delay.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cut.borrow() {
                    reset(&client);
                    continue;
                }
                let gate = gate.subscribe();
                let mut cut = cut.subscribe();
                let lag = lag.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let broken = CancellationToken::new();
                    let reset_both = tokio::select! {
                        _ = async {
                            tokio::join!(
                                forward(&mut cr, &mut sw, gate.clone(), lag.clone(), &broken),
                                forward(&mut sr, &mut cw, gate, lag, &broken)
                            )
                        } => false,
                        // One end reset its connection: so does the other
                        // end's, as a path passes a reset on. (Also when
                        // both directions finished in the same turn and
                        // select! took the join: hence the check after.)
                        _ = broken.cancelled() => true,
                        _ = cut.wait_for(|severed| *severed) => true,
                    } || broken.is_cancelled();
                    if reset_both {
                        reset(cr.as_ref());
                        reset(sr.as_ref());
                        // A write half dropped sends a FIN first, which
                        // the other end would read as a clean close.
                        cw.forget();
                        sw.forget();
                    }
                });
            }
        });
        FreezableProxy {
            addr,
            frozen,
            severed,
            delay,
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

    /// Holds every byte read from now on for `d` before passing it on, in
    /// both directions (a slow path: latency, not loss); zero ends it.
    pub fn delay(&self, d: Duration) {
        self.delay.send_replace(d);
    }

    /// Accepts connections again after [`FreezableProxy::sever`].
    pub fn heal(&self) {
        self.severed.send_replace(false);
    }
}

/// Makes the socket's close a reset: no linger, no FIN.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Whether the end `half` reads from reset the connection. Linux reports a
/// reset once, to whichever call on the socket comes first: when the
/// other direction's write to the same socket took it, the read that
/// follows returns 0, as after a clean close. Passing that on as a FIN
/// would tell a cluster node that its client closed cleanly, and the node
/// would end the session the client is about to resume (a torture run saw
/// exactly that). The socket's TCP state still tells: a reset leaves it
/// closed, a clean close leaves it waiting for this side's own close.
fn was_reset(half: &OwnedReadHalf) -> bool {
    tcp_state(half.as_ref()) == Some(TCP_CLOSE)
}

/// `TCP_CLOSE` in the kernel's `tcp_states.h`: no connection at all.
const TCP_CLOSE: u8 = 7;

/// The kernel's TCP state of `stream` (`tcp_states.h`), if it can be read.
#[cfg(target_os = "linux")]
fn tcp_state(stream: &TcpStream) -> Option<u8> {
    use std::os::fd::AsRawFd;
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is the open socket `stream` borrows; the
    // kernel writes at most `len` bytes into `info`, which is that large
    // and zeroed, so every field is initialised whatever it writes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // SAFETY: zeroed above and possibly overwritten by the kernel: every
    // bit pattern is a valid `tcp_info` (integers only).
    (rc == 0).then(|| unsafe { info.assume_init() }.tcpi_state)
}

/// Elsewhere the read alone decides (a reset the write took is missed).
#[cfg(not(target_os = "linux"))]
fn tcp_state(_stream: &TcpStream) -> Option<u8> {
    None
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Chunks read but not yet passed on, per direction: a bound on what a
/// delayed path holds (the reader then waits, as a full link would).
const IN_FLIGHT: usize = 64;

/// What one read from a side brought.
enum Chunk {
    Data(Vec<u8>),
    /// A clean close (FIN): passed on as one.
    End,
    /// A reset or other error: passed on as a reset of the whole
    /// connection, never as a clean close, which a cluster node takes as
    /// the client ending its session.
    Reset,
}

/// Copies one direction, checking the gate before each read and each write,
/// so bytes already read are held back while frozen. A reader and a writer
/// joined by a bounded queue, each chunk stamped with when it may go: a
/// delay adds latency without holding back the reads behind it. A reset
/// read from `from` is delivered in order, by cancelling `broken`.
async fn forward(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    gate: watch::Receiver<bool>,
    lag: watch::Receiver<Duration>,
    broken: &CancellationToken,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Chunk)>(IN_FLIGHT);
    let mut read_gate = gate.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if read_gate.wait_for(|frozen| !frozen).await.is_err() {
                return;
            }
            let chunk = match from.read(&mut buf).await {
                Ok(0) if was_reset(from) => Chunk::Reset,
                Ok(0) => Chunk::End,
                Ok(n) => Chunk::Data(buf[..n].to_vec()),
                Err(_) => Chunk::Reset,
            };
            let last = !matches!(chunk, Chunk::Data(_));
            let due = Instant::now() + *lag.borrow();
            if tx.send((due, chunk)).await.is_err() || last {
                return;
            }
        }
    };
    let mut write_gate = gate;
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if write_gate.wait_for(|frozen| !frozen).await.is_err() {
                return;
            }
            match chunk {
                Chunk::Data(bytes) => {
                    // The end written to broke (it reset, most likely):
                    // so does the path, both ways.
                    if to.write_all(&bytes).await.is_err() {
                        broken.cancel();
                        return;
                    }
                }
                Chunk::End => {
                    let _ = to.shutdown().await;
                    return;
                }
                Chunk::Reset => {
                    broken.cancel();
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Both ends of a loopback connection: (the peer, the proxy's side).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let peer = TcpStream::connect(addr).await.expect("connect");
        let (ours, _) = listener.accept().await.expect("accept");
        (peer, ours)
    }

    #[tokio::test]
    async fn a_reset_that_a_write_learned_of_first_is_still_told_from_a_clean_close() {
        let (peer, ours) = pair().await;
        reset(&peer);
        drop(peer);
        let (mut rd, mut wr) = ours.into_split();
        // A write fails once the reset is in, and takes its error.
        let mut failed = false;
        for _ in 0..1000 {
            if wr.write_all(b"answer").await.is_err() {
                failed = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(failed, "writes to a reset connection fail");
        // So the read says what it says after a clean close...
        let n = rd
            .read(&mut [0u8; 8])
            .await
            .expect("no error left to report");
        assert_eq!(n, 0);
        // ...and only the socket's state tells the two apart.
        assert!(was_reset(&rd));
    }

    #[tokio::test]
    async fn a_clean_close_is_not_taken_for_a_reset() {
        let (mut peer, ours) = pair().await;
        peer.shutdown().await.expect("shutdown");
        let (mut rd, _wr) = ours.into_split();
        assert_eq!(rd.read(&mut [0u8; 8]).await.expect("read"), 0);
        assert!(!was_reset(&rd));
    }
}
