//! Finding a node to talk to: [`Dial`] (where and how a client connects)
//! and [`establish`], which connects to a server, or to a cluster's leader
//! by following `NotLeader` answers, asks its limits (Hello) and, on a
//! cluster, opens or resumes the session; the link (`link.rs`) takes the
//! stream from there.

use crate::backoff::Backoff;
use crate::codec::{encode_frame, FrameCodec};
use crate::error::{Disconnect, Error, Result};
use crate::event::Event;
use crate::options::ClientOptions;
use crate::proto::{Request, RequestType, Response, ResponseStatus};
use crate::servers::Servers;
use crate::transport::{self, Stream};
use crate::Limits;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// What every link of a client needs to connect: where, how, and whom to
/// tell about reconnects. Holds no connection, so links may share it
/// without keeping each other alive.
#[derive(Debug)]
pub(crate) struct Dial {
    pub(crate) servers: Servers,
    pub(crate) options: ClientOptions,
    /// The node that last opened or resumed a session: tried first, since
    /// it was the leader.
    leader: Mutex<Option<String>>,
    /// Nodes a probe found silent and that have not answered since: tried
    /// last (see `liveness.rs`).
    suspects: Mutex<Vec<String>>,
    pub(crate) events: broadcast::Sender<Event>,
}

/// Events kept for a slow reader of [`crate::Client::events`] before the
/// oldest are dropped (it then sees `Lagged`).
const EVENTS_KEPT: usize = 64;

impl Dial {
    pub(crate) fn new(servers: Servers, options: ClientOptions) -> Dial {
        Dial {
            servers,
            options,
            leader: Mutex::new(None),
            suspects: Mutex::new(Vec::new()),
            events: broadcast::channel(EVENTS_KEPT).0,
        }
    }

    pub(crate) fn token(&self) -> String {
        self.options.access_token.clone().unwrap_or_default()
    }

    fn leader(&self) -> Option<String> {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops trying `addr` first: it did not answer.
    fn forget_leader(&self, addr: &str) {
        let mut leader = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    fn set_leader(&self, addr: &str) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr.to_owned());
    }

    /// Marks `addr` as found silent (tried last, and no longer first as
    /// the leader), or as answering again.
    pub(crate) fn suspect(&self, addr: &str, silent: bool) {
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        suspects.retain(|a| a != addr);
        if silent {
            suspects.push(addr.to_owned());
            drop(suspects);
            self.forget_leader(addr);
        }
    }

    fn is_suspect(&self, addr: &str) -> bool {
        let suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        suspects.iter().any(|a| a == addr)
    }
}

/// A stream to a node, ready for the writer and the reader.
pub(crate) struct Established {
    pub(crate) stream: Stream,
    pub(crate) addr: String,
    pub(crate) limits: Option<Limits>,
    /// The session opened or resumed, and its TTL; `None` on a single
    /// server.
    pub(crate) session: Option<(u64, Duration)>,
    /// When the last request of the handshake was sent: the server had the
    /// connection (and the session) alive no earlier.
    pub(crate) acked_from: Instant,
}

/// Why one node did not serve the link.
enum NodeError {
    /// Not the leader; it named the leader's address, if it knows one.
    NotLeader(Option<String>),
    /// The cluster no longer knows the session.
    SessionGone,
    /// Nothing to retry on any node: access denied, a bad answer.
    Fatal(Error),
    /// Down, slow, or unwilling now; `answered` if it said so.
    Failed { error: Error, answered: bool },
}

/// Connects to a node among `dial`'s servers before `deadline`: on a
/// cluster the leader, opening a session (`session` 0) or resuming
/// `session`. The last known leader goes first, then the servers in order,
/// each leader a node names right after it.
///
/// `persist`: keep going round the servers until the deadline (a session
/// to resume). Otherwise (a new link) stop after a round in which no node
/// answered at all, so a dead server is reported at once.
pub(crate) async fn establish(
    dial: &Dial,
    session: u64,
    deadline: Instant,
    persist: bool,
) -> Result<Established> {
    let mut attempts: Vec<(String, Error)> = Vec::new();
    let mut pause = Backoff::new(Duration::from_millis(20), MAX_PAUSE);
    loop {
        let mut queue: VecDeque<String> = dial.leader().into_iter().collect();
        // A node found silent goes last: it may cost a whole attempt's time.
        let (quiet, live): (Vec<&String>, Vec<&String>) = dial
            .servers
            .addrs()
            .iter()
            .partition(|a| dial.is_suspect(a));
        for a in live.into_iter().chain(quiet) {
            if !queue.contains(a) {
                queue.push_back(a.clone());
            }
        }
        let mut tried: Vec<String> = Vec::new();
        let mut answered = false;
        while let Some(addr) = queue.pop_front() {
            if tried.contains(&addr) {
                continue;
            }
            tried.push(addr.clone());
            let now = Instant::now();
            if now >= deadline && !attempts.is_empty() {
                break;
            }
            // A node that accepts but never answers (paused, overloaded)
            // must not use up the time the others could answer in.
            let per_node = match dial.servers.addrs().len() {
                0 | 1 => dial.options.connect_timeout,
                n => (dial.options.connect_timeout / n as u32).max(MIN_ATTEMPT),
            };
            let limit = per_node
                .min(deadline.saturating_duration_since(now))
                .max(Duration::from_millis(1));
            let outcome = match tokio::time::timeout(limit, try_node(dial, &addr, session)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(NodeError::Failed {
                    error: Error::ConnectTimeout {
                        addr: addr.clone(),
                        timeout: limit,
                    },
                    answered: false,
                }),
            };
            match outcome {
                Ok(est) => {
                    if est.session.is_some() {
                        dial.set_leader(&est.addr);
                    }
                    return Ok(est);
                }
                Err(NodeError::NotLeader(leader)) => {
                    answered = true;
                    let text = match &leader {
                        Some(l) => format!("not the leader (the leader is {l})"),
                        None => crate::error::NO_LEADER_KNOWN.to_owned(),
                    };
                    attempts.push((addr, Error::Protocol(text)));
                    if let Some(l) = leader {
                        queue.push_front(l);
                    }
                }
                Err(NodeError::SessionGone) => {
                    return Err(Error::ConnectionLost(Disconnect::SessionEnded));
                }
                Err(NodeError::Fatal(e)) => return Err(e),
                Err(NodeError::Failed { error, answered: a }) => {
                    answered |= a;
                    if !a {
                        // A dead old leader must not cost every round its
                        // connect time.
                        dial.forget_leader(&addr);
                    }
                    attempts.push((addr, error));
                }
            }
        }
        let give_up = Instant::now() >= deadline || (!persist && !answered);
        if give_up {
            return Err(unreachable(attempts));
        }
        // An election takes a few heartbeats: do not hammer the nodes, nor
        // arrive in step with every other client of the old leader.
        let wake = (Instant::now() + pause.pause()).min(deadline);
        tokio::time::sleep_until(wake).await;
        pause.grow();
        // Keep the report to the latest round of each address.
        let keep = attempts
            .len()
            .saturating_sub(4 * dial.servers.addrs().len().max(1));
        attempts.drain(..keep);
    }
}

/// Shortest time one node gets to answer when there are several.
const MIN_ATTEMPT: Duration = Duration::from_millis(500);

/// Longest pause between rounds of the nodes: an election takes a few
/// hundred milliseconds at best, and every pause adds to the failover.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// The error for a connect that found no node: with one attempt, that
/// attempt's own error (what a client of a single server always got).
fn unreachable(mut attempts: Vec<(String, Error)>) -> Error {
    if attempts.len() == 1 {
        if let Some((_, e)) = attempts.pop() {
            return e;
        }
    }
    let mut seen: Vec<(String, String)> = Vec::new();
    // The latest reason for each address, in the order first tried.
    for (addr, e) in attempts {
        let why = match e {
            Error::Connect { source, .. } => source.to_string(),
            Error::ConnectTimeout { timeout, .. } => {
                format!("no answer within {}", crate::duration::format(timeout))
            }
            Error::Protocol(text) => text,
            e => e.to_string(),
        };
        match seen.iter_mut().find(|(a, _)| *a == addr) {
            Some(entry) => entry.1 = why,
            None => seen.push((addr, why)),
        }
    }
    Error::Unreachable { attempts: seen }
}

/// Connects to `addr`, asks its limits and, on a cluster node, opens or
/// resumes the session there.
async fn try_node(
    dial: &Dial,
    addr: &str,
    session: u64,
) -> std::result::Result<Established, NodeError> {
    let options = &dial.options;
    let token = dial.token();
    let mut stream = transport::connect(addr, options, |s| configure(s, options))
        .await
        .map_err(|source| connect_error(addr, source, session))?;
    // Until the node has answered, an attempt given up (its time ran out,
    // `establish` dropped it) ends with a reset: a clean close would end a
    // session the node may just have resumed for it, under the feet of the
    // next attempt (docs/PROTOCOL.md, "Cluster").
    stream.reset_on_close(true);
    let hello_sent = Instant::now();
    let limits = hello(&mut stream, &token).await.map_err(|e| match e {
        e @ Error::AccessDenied(_) => NodeError::Fatal(e),
        // Which address misbehaved: a cluster's list may hold one wrong port.
        Error::Protocol(why) => NodeError::Fatal(Error::Protocol(format!("{addr}: {why}"))),
        // A dlock server refuses with General only a frame that is no
        // request, which Hello is: this is a port that cannot serve
        // clients at all, and says so (a cluster node's peer port names
        // its client port), so it is a wrong port as the one above.
        Error::Server {
            status: ResponseStatus::General,
            text,
        } => NodeError::Fatal(Error::Protocol(format!("{addr}: {text}"))),
        e @ Error::ServerSpeaksTls if session == 0 => NodeError::Fatal(e),
        // TLS 1.3 ends the client's handshake before the server checks
        // the client's certificate: its refusal is the first thing read.
        Error::ConnectionLost(Disconnect::Read(e))
            if transport::tls_failure(&e).is_some_and(transport::TlsFailure::is_the_clients) =>
        {
            // The Arc is this exchange's alone; the copy keeps kind and text.
            let source =
                Arc::try_unwrap(e).unwrap_or_else(|e| std::io::Error::new(e.kind(), e.to_string()));
            connect_error(addr, source, session)
        }
        error => NodeError::Failed {
            error,
            answered: false,
        },
    })?;
    if !limits.is_some_and(|l| l.resumable_sessions) {
        if session == 0 && dial.servers.addrs().len() > 1 {
            return Err(NodeError::Fatal(Error::NotOneCluster {
                addr: addr.to_owned(),
            }));
        }
        if session != 0 {
            return Err(NodeError::Failed {
                error: Error::Protocol("not a cluster node: it cannot resume a session".into()),
                answered: true,
            });
        }
        stream.reset_on_close(false);
        return Ok(Established {
            stream,
            addr: addr.to_owned(),
            limits,
            session: None,
            acked_from: hello_sent,
        });
    }
    let open = Request {
        version: crate::PROTOCOL_VERSION,
        // Beside Hello's id, outside the ranges of calls and heartbeats.
        id: u64::MAX - 1,
        access_token: token,
        r#type: RequestType::OpenSession as i32,
        session,
        session_ttl_micro: options
            .session_ttl
            .map_or(0, |t| crate::request::micros(t).max(1)),
        ..Request::default()
    };
    let sent = Instant::now();
    let resp = exchange(&mut stream, &open)
        .await
        .map_err(|error| NodeError::Failed {
            error,
            answered: false,
        })?;
    match ResponseStatus::try_from(resp.status) {
        Ok(ResponseStatus::Ok) => {
            // The link's to close now: cleanly when the client is done,
            // with a reset when the path broke (`link.rs`).
            stream.reset_on_close(false);
            Ok(Established {
                stream,
                addr: addr.to_owned(),
                limits,
                session: Some((resp.session, Duration::from_micros(resp.session_ttl_micro))),
                acked_from: sent,
            })
        }
        Ok(ResponseStatus::NotLeader) => Err(NodeError::NotLeader(
            Some(resp.leader_addr).filter(|a| !a.is_empty()),
        )),
        Ok(ResponseStatus::UnknownSession) if session != 0 => Err(NodeError::SessionGone),
        Ok(ResponseStatus::AccessDenied) => {
            Err(NodeError::Fatal(Error::AccessDenied(resp.error_text)))
        }
        Ok(ResponseStatus::InvalidArgument) => Err(NodeError::Fatal(Error::Server {
            status: ResponseStatus::InvalidArgument,
            text: resp.error_text,
        })),
        Ok(status) => Err(NodeError::Failed {
            error: Error::Server {
                status,
                text: resp.error_text,
            },
            answered: true,
        }),
        Err(_) => Err(NodeError::Fatal(Error::Protocol(format!(
            "unknown response status {}",
            resp.status
        )))),
    }
}

/// Why connecting to `addr` failed. A TLS setup that does not match the
/// server's, at the first connect, is the same on every node and is not
/// retried: it needs the user to change a flag, which the error names.
/// While a session resumes (`session` set) it is one node's trouble (a
/// certificate being changed, a port taken by something else): the other
/// nodes are tried, so that one bad node cannot end a session the rest of
/// the cluster keeps.
fn connect_error(addr: &str, source: std::io::Error, session: u64) -> NodeError {
    let error = match transport::tls_setup_error(addr, source) {
        Ok(error) => error,
        Err(source) => {
            return NodeError::Failed {
                error: Error::Connect {
                    addr: addr.to_string(),
                    source,
                },
                answered: false,
            }
        }
    };
    if session == 0 {
        NodeError::Fatal(error)
    } else {
        NodeError::Failed {
            error,
            answered: true,
        }
    }
}

/// Asks the server for its limits on a fresh connection.
pub(crate) async fn hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
) -> Result<Option<Limits>> {
    let req = Request {
        version: crate::PROTOCOL_VERSION,
        // Outside the range of call ids (counting up from 1) and heartbeat
        // ids (counting down below the maximum).
        id: u64::MAX,
        access_token: token.to_string(),
        r#type: RequestType::Hello as i32,
        ..Request::default()
    };
    let resp = exchange(stream, &req).await?;
    if resp.status == ResponseStatus::InvalidType as i32 {
        // A server that predates Hello.
        return Ok(None);
    }
    let resp = crate::request::check(resp)?;
    Ok(resp.limits.as_ref().map(Limits::from))
}

/// Sends `req` and reads its answer, before the stream is split between
/// the writer and the reader.
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    req: &Request,
) -> Result<Response> {
    let mut buf = BytesMut::new();
    encode_frame(req, &mut buf);
    write_flush(stream, &buf)
        .await
        .map_err(|e| Disconnect::Write(Arc::new(e)))?;
    buf.clear();
    let mut codec = FrameCodec::new(crate::MAX_RESPONSE_FRAME);
    let body = loop {
        if let Some(e) = transport::foreign_answer(&buf) {
            return Err(e);
        }
        if let Some(body) = tokio_util::codec::Decoder::decode(&mut codec, &mut buf)
            .map_err(|e| Error::Protocol(format!("bad answer to {:?}: {e}", req.r#type())))?
        {
            break body;
        }
        let read = stream.read_buf(&mut buf).await;
        if read.map_err(|e| Disconnect::Read(Arc::new(e)))? == 0 {
            return Err(Disconnect::Closed.into());
        }
    };
    prost::Message::decode(body)
        .map_err(|e| Error::Protocol(format!("undecodable answer to {:?}: {e}", req.r#type())))
}

/// See [`ClientOptions::keepalive`]. tokio exposes neither keepalive timing
/// nor TCP_USER_TIMEOUT, hence socket2.
pub(crate) fn configure(stream: &TcpStream, options: &ClientOptions) {
    let _ = stream.set_nodelay(true);
    let sock = socket2::SockRef::from(stream);
    let interval = (options.keepalive / 3).max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(options.keepalive)
        .with_interval(interval);
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let keepalive = keepalive.with_retries(3);
    let _ = sock.set_tcp_keepalive(&keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = sock.set_tcp_user_timeout(Some(options.keepalive + 3 * interval));
}

/// Writes all of `buf` and flushes: TLS may keep written records until a
/// flush (for TCP the flush is free).
pub(crate) async fn write_flush<W: AsyncWrite + Unpin>(
    wr: &mut W,
    buf: &[u8],
) -> std::io::Result<()> {
    wr.write_all(buf).await?;
    wr.flush().await
}
