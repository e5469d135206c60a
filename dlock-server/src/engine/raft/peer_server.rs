//! The listening side of the peer transport: accepts connections from the
//! other nodes and hands their RPCs to openraft.
//!
//! Whatever arrives that is not a well-formed hello from a node of this
//! cluster (garbage, an oversized first frame, a dlock client that dialled
//! the wrong port, a node with another cluster id, a hello meant for
//! another node id, a node bootstrapped with another `--initial-cluster`
//! list, see `initial_list`) closes that connection with one log line
//! (paced, for the list); nothing else changes. A dlock client is told
//! first, in its own protocol, that this is a peer port and where the
//! client port is, with or without TLS on it
//! (see [`PeerServer::client_answer`]). The number of connections is
//! capped, and a connection must say hello within [`wire::HELLO_TIMEOUT`],
//! so idle sockets cannot pile up.

use super::initial_list;
use super::paced::Paced;
use super::peer_tls::{self, PeerTls};
use super::standing;
use super::types::{NodeId, Raft};
use super::wire::{
    self, Format, Hello, HelloReply, PeerFrames, Reply, Request, Standing, WireError, PROTOCOL,
};
use openraft::raft::InstallSnapshotRequest;
use openraft::ServerState;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The first byte of a TLS handshake record, with which every TLS peer
/// opens a connection.
const TLS_HANDSHAKE: u8 = 0x16;

/// Peer connections served at once. A 5-node cluster uses about one per
/// peer for replication plus a few pooled for votes.
const MAX_CONNECTIONS: usize = 128;

/// What every connection task needs.
#[derive(Clone)]
pub(crate) struct PeerServer {
    pub(crate) raft: Raft,
    pub(crate) local: NodeId,
    pub(crate) cluster_id: Arc<str>,
    /// Mutual TLS, when the peer port has it.
    pub(crate) tls: Option<PeerTls>,
    /// The `--initial-cluster` list this node bootstrapped with, if known.
    pub(crate) initial_cluster: Option<Arc<str>>,
    /// When a peer's refused hello was last logged.
    pub(crate) refusals: Paced,
    /// When a connection that failed before its hello (TLS, a stranger's
    /// first frame) was last logged, by the address it came from: a node
    /// with the wrong TLS files dials again several times a second.
    pub(crate) strangers: Paced<IpAddr>,
    /// Whether this node stands as the leader (`quorum.rs`).
    pub(crate) standing: super::quorum::Standing,
}

impl PeerServer {
    /// Accepts peer connections until `stop` is cancelled; connection tasks
    /// run on `tasks` and end with `stop` too.
    pub(crate) async fn run(
        self,
        listener: TcpListener,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            // Taken before accepting, so a full server leaves new
            // connections in the kernel's backlog rather than accepting and
            // dropping them.
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                p = limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let (stream, addr) = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors and the like: pause rather
                        // than spin, then try again.
                        tracing::warn!(error = %e, "cannot accept a peer connection");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        }
                    }
                },
            };
            let server = self.clone();
            let stop = stop.clone();
            tasks.spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = server.handshake(stream, addr) => {}
                }
                drop(permit);
            });
        }
    }

    /// TLS, when the peer port has it, then the connection.
    async fn handshake(&self, tcp: TcpStream, addr: SocketAddr) {
        wire::tune(&tcp);
        let deadline = tokio::time::Instant::now() + wire::HELLO_TIMEOUT;
        let stream = match &self.tls {
            None => peer_tls::plain(tcp),
            Some(tls) => {
                // Every peer opens with a TLS handshake record. Anything
                // else is no peer; a dlock client without TLS is answered in
                // its own protocol, where a TLS alert would have it look for
                // a CA certificate instead of the right port.
                let mut first = [0u8; 1];
                match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
                    Ok(Ok(1)) if first[0] != TLS_HANDSHAKE => {
                        return self
                            .no_tls(wire::frame(peer_tls::plain(tcp)), addr, deadline)
                            .await
                    }
                    // A handshake, or a close the handshake will see.
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return self.stranger(addr, "peer connection failed", &e),
                    Err(_) => {
                        return self.stranger(
                            addr,
                            "peer TLS handshake timed out",
                            &"no handshake in time",
                        )
                    }
                }
                match tokio::time::timeout_at(deadline, tls.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let what =
                            "peer TLS handshake failed (a node with other --peer-tls-* files?)";
                        return self.stranger(addr, what, &e);
                    }
                    Err(_) => {
                        return self.stranger(
                            addr,
                            "peer TLS handshake timed out",
                            &"no handshake in time",
                        )
                    }
                }
            }
        };
        self.serve(wire::frame(stream), addr).await;
    }

    /// A connection without TLS at a TLS peer port: its first frame is
    /// read, a dlock client's answered, and the connection closed.
    async fn no_tls(&self, mut conn: PeerFrames, addr: SocketAddr, deadline: tokio::time::Instant) {
        let first = tokio::time::timeout_at(deadline, wire::recv_raw(&mut conn)).await;
        let answer = match first {
            Ok(Ok(frame)) => self.client_answer(&frame),
            _ => None,
        };
        let reason = match answer {
            Some(answer) => {
                // Best effort: the connection ends either way.
                let _ = wire::send_raw(&mut conn, answer).await;
                "a dlock client without TLS at the peer port (told where the client port is)"
            }
            None => "no TLS handshake (a node without --peer-tls-* files?)",
        };
        self.stranger(addr, "peer connection refused", &reason);
    }

    /// Logs what ended a connection from `addr` before a hello named its
    /// node (`what`, because of `why`), once a minute per address: a node
    /// with the wrong TLS files, or none, dials again several times a
    /// second for as long as it runs.
    fn stranger(&self, addr: SocketAddr, what: &str, why: &dyn std::fmt::Display) {
        if self.strangers.due(addr.ip()) {
            tracing::warn!(peer = %addr, reason = %why, "{what}; said again once a minute while this address tries");
        }
    }

    /// When `frame`, the first a connection sent, is a dlock client's
    /// request: a dlock answer to it (status `General`, as for a request
    /// the port cannot serve) saying that this is a cluster's peer port and
    /// naming the client port, for the client to show its user. A node
    /// never sends such a frame (its hello is JSON), so answering cannot
    /// disturb the peer protocol; no answer is owed, so a client of any
    /// version only reads it as a refusal.
    fn client_answer(&self, frame: &[u8]) -> Option<bytes::Bytes> {
        use dlock_proto::proto::{Request, RequestType, Response, ResponseStatus};
        let request = <Request as prost::Message>::decode(frame).ok()?;
        if request.r#type == 0 || RequestType::try_from(request.r#type).is_err() {
            return None;
        }
        let client_port = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .get_node(&self.local)
                .map(|n| n.client_addr.clone())
        };
        let instead = match client_port {
            Some(a) if !a.is_empty() => format!("a node's --listen; this node's is {a}"),
            _ => "a node's --listen".to_string(),
        };
        let answer = Response {
            request_id: request.id,
            status: ResponseStatus::General as i32,
            error_text: format!(
                "this is the peer port of dlock cluster node {}, where the nodes talk to \
                 each other (its --peer-listen): give dlock a client port instead ({instead})",
                self.local
            ),
            ..Response::default()
        };
        Some(prost::Message::encode_to_vec(&answer).into())
    }

    async fn serve(&self, mut conn: PeerFrames, addr: SocketAddr) {
        let (from, format) = match self.welcome(&mut conn).await {
            Ok(welcomed) => welcomed,
            Err(Refusal::Logged) => return,
            Err(Refusal::Other(why)) => {
                return self.stranger(addr, "peer connection refused", &why)
            }
        };
        wire::established(&mut conn);
        tracing::debug!(peer = %addr, node = from, ?format, "peer connected");
        if let Err(e) = self.requests(&mut conn, from, format).await {
            match e {
                WireError::Closed => {
                    tracing::debug!(peer = %addr, node = from, "peer closed the connection")
                }
                e => {
                    tracing::info!(peer = %addr, node = from, error = %e, "peer connection closed")
                }
            }
        }
    }

    /// Reads and checks the hello; returns the peer's node id and the
    /// format of the messages that follow.
    async fn welcome(&self, conn: &mut PeerFrames) -> Result<(NodeId, Format), Refusal> {
        let hello: Hello =
            match tokio::time::timeout(wire::HELLO_TIMEOUT, wire::recv_raw(conn)).await {
                Err(_) => return Err("no hello in time".into()),
                // A TLS record's length field reads as a frame far over the
                // hello's limit, and the codec leaves those bytes unread.
                Ok(Err(_)) if conn.read_buffer().starts_with(&[TLS_HANDSHAKE, 0x03]) => {
                    return Err("a TLS handshake at a peer port without TLS: a node with \
                                --peer-tls-* files dialled a node without them; give every \
                                node of the cluster the same peer TLS setting"
                        .into())
                }
                Ok(Err(e)) => return Err(format!("bad first frame: {e}").into()),
                Ok(Ok(frame)) => match super::encoding::decode(&frame) {
                    Ok(h) => h,
                    // Every dlock node, old or new, says its hello in JSON: a
                    // first frame that is no JSON is another program (a dlock
                    // client at the peer port, a scanner), never a newer dlock.
                    Err(super::encoding::CodecError::Unknown(b)) => {
                        if let Some(answer) = self.client_answer(&frame) {
                            // Best effort: the connection ends either way.
                            let _ = wire::send_raw(conn, answer).await;
                            return Err("a dlock client at the peer port (told where the client \
                                    port is)"
                                .into());
                        }
                        return Err(format!(
                        "first frame is not a peer hello (it starts with byte {b:#04x}, which no \
                         dlock hello does): a client or another program at the peer port?"
                    )
                        .into());
                    }
                    Err(e) => {
                        return Err(format!(
                        "first frame is not a peer hello ({e}): a client or another program at \
                         the peer port?"
                    )
                        .into())
                    }
                },
            };
        let refusal = if hello.protocol != PROTOCOL {
            Some(format!(
                "protocol {:?} from node {}, this node speaks {PROTOCOL:?}: these two versions of \
                 dlock-server cannot be nodes of one cluster; run versions that speak the same \
                 peer protocol on every node",
                hello.protocol, hello.from
            ))
        } else if *hello.cluster_id != *self.cluster_id {
            Some(format!(
                "cluster id {:?} from node {}, this node is in {:?}: give every node of one \
                 cluster the same --cluster-id (or node {} was given a peer address of another \
                 cluster's node)",
                hello.cluster_id, hello.from, self.cluster_id, hello.from
            ))
        } else if hello.to != self.local {
            Some(format!(
                "node {} dialled node {} {} {}: the peer address node {} has for node {} is \
                 node {}'s; correct it in node {}'s --initial-cluster (a running cluster's \
                 addresses: dlock cluster status)",
                hello.from,
                hello.to,
                standing::REACHED_ANOTHER,
                self.local,
                hello.from,
                hello.to,
                self.local,
                hello.from
            ))
        } else {
            initial_list::refusal(
                hello.from,
                hello.initial_cluster.as_deref(),
                self.local,
                self.initial_cluster.as_deref(),
            )
        };
        if let Some(why) = refusal {
            // A fresh dialler refused by a running cluster is the node
            // that is wrong, and stops (`standing`).
            let why = match self.running_cluster() {
                Some((leader, term)) => standing::refused_by_a_running_cluster(&why, leader, term),
                None => why,
            };
            crate::ops::metrics::peer_refused(true);
            if self.refusals.due(hello.from) {
                // Another list puts the cluster's safety at stake; the rest
                // only keep a node out.
                if initial_list::is_refusal(&why) {
                    tracing::error!(
                        node = hello.from,
                        "peer connection refused: {why}; said again once a minute while it dials"
                    );
                } else {
                    tracing::warn!(
                        node = hello.from,
                        "peer connection refused: {why}; said again once a minute while it dials"
                    );
                }
            }
            // Best effort: the dialler logs the reason too.
            let _ = wire::send(conn, Format::Json, &HelloReply::Refused(why)).await;
            return Err(Refusal::Logged);
        }
        let (reply, format) = match hello.binary {
            true => (HelloReply::WelcomeBinary, Format::Binary),
            false => (HelloReply::Welcome, Format::Json),
        };
        wire::send(conn, Format::Json, &reply)
            .await
            .map_err(|e| format!("cannot answer the hello: {e}"))?;
        Ok((hello.from, format))
    }

    async fn requests(
        &self,
        conn: &mut PeerFrames,
        from: NodeId,
        format: Format,
    ) -> Result<(), WireError> {
        loop {
            let request: Request = tokio::time::timeout(wire::IDLE_TIMEOUT, wire::recv(conn))
                .await
                .map_err(|_| WireError::Timeout)??;
            let reply = match request {
                Request::Append(rpc) => Reply::Append(self.raft.append_entries(rpc).await),
                Request::Vote(rpc) => Reply::Vote(self.raft.vote(rpc).await),
                Request::Snapshot {
                    vote,
                    meta,
                    offset,
                    done,
                } => {
                    // The chunk follows its header at once; a peer that
                    // stalls between them must not keep the slot forever.
                    let data = tokio::time::timeout(wire::IDLE_TIMEOUT, wire::recv_raw(conn))
                        .await
                        .map_err(|_| WireError::Timeout)??;
                    let end = offset.saturating_add(data.len() as u64);
                    if end > wire::MAX_SNAPSHOT {
                        return Err(WireError::TooLarge(
                            usize::try_from(end).unwrap_or(usize::MAX),
                        ));
                    }
                    let rpc = InstallSnapshotRequest {
                        vote,
                        meta,
                        offset,
                        data: data.to_vec(),
                        done,
                    };
                    Reply::Snapshot(self.raft.install_snapshot(rpc).await)
                }
                Request::Standing => Reply::Standing(self.standing(from)),
            };
            wire::send(conn, format, &reply).await?;
        }
    }
}

/// Why a hello was refused.
enum Refusal {
    /// Already logged (the initial list's, paced).
    Logged,
    /// For the caller to log.
    Other(String),
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal::Other(why)
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Refusal {
        Refusal::Other(why.to_owned())
    }
}

impl PeerServer {
    /// The leader this node knows and its term: `None` while it knows
    /// none (at a first start, before the first election).
    fn running_cluster(&self) -> Option<(NodeId, u64)> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.current_leader.map(|leader| (leader, m.current_term))
    }

    /// What this node knows of node `of`'s place in its cluster.
    fn standing(&self, of: NodeId) -> Standing {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let leader = m.current_leader.and_then(|id| {
            membership
                .get_node(&id)
                .map(|node| (id, node.peer_addr.clone()))
        });
        let leading = m.state == ServerState::Leader;
        let committed =
            m.membership_config.log_id().map(|l| l.index) <= m.last_applied.map(|l| l.index);
        let stands = leading && *self.standing.borrow() && committed;
        let acknowledged = match (&m.replication, leading) {
            (Some(r), true) => r.get(&of).copied().flatten().map(|l| l.index),
            _ => None,
        };
        Standing {
            term: m.current_term,
            leader,
            acknowledged,
            leading,
            stands,
            member: membership.get_node(&of).is_some(),
        }
    }
}
