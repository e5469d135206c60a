//! The dialling side of the peer transport: openraft's network traits.
//!
//! openraft asks for a client per target (one per replication stream, one
//! per election round); all of them draw connections from one pool per
//! target, so a replication stream keeps one connection for as long as it
//! runs and votes reuse an idle one. A connection goes back to the pool only
//! after a complete request/reply exchange; one that failed, or whose RPC
//! openraft abandoned on its own timeout, is dropped, and the next RPC dials
//! again. A pooled connection may have been closed by the other side while
//! idle, so an RPC that fails on one is tried once more on a fresh one
//! (Raft RPCs are safe to repeat).

use super::initial_list;
use super::paced::Paced;
use super::peer_tls::{self, PeerTls};
use super::reachability::Reachability;
use super::types::{Member, NodeId, TypeConfig};
use super::wire::{
    self, Format, Hello, HelloReply, PeerFrames, Reply, Request, Standing, WireError, PROTOCOL,
};
use bytes::Bytes;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::RPCTypes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Idle connections kept per target; more are closed when returned.
const IDLE_PER_TARGET: usize = 4;
/// An idle connection older than this is not reused: the other side closes
/// connections idle for [`wire::IDLE_TIMEOUT`], and reusing one it is about
/// to close costs a retry.
const MAX_IDLE: Duration = Duration::from_secs(60);

type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, Member, RaftError<NodeId, E>>;

/// openraft's network factory: makes [`PeerClient`]s that share a pool.
#[derive(Clone)]
pub(crate) struct Network {
    local: NodeId,
    cluster_id: Arc<str>,
    pool: Arc<Pool>,
    tls: Option<PeerTls>,
    /// Test-only detours: node id to the address dialled instead of its own.
    routes: Arc<BTreeMap<NodeId, String>>,
    /// Which peers the RPCs reach.
    reach: Reachability,
    /// The `--initial-cluster` list this node bootstrapped with, said in
    /// every hello.
    initial_cluster: Option<Arc<str>>,
    /// When each peer's refusal of this node's hello was last logged.
    refusals: Paced,
}

impl Network {
    /// The network of node `local` in cluster `cluster_id`, bootstrapped
    /// with `initial_cluster`, over `tls` when given, dialling `routes`
    /// instead of the named nodes' addresses.
    pub(crate) fn new(
        local: NodeId,
        cluster_id: &str,
        initial_cluster: Option<&str>,
        tls: Option<PeerTls>,
        routes: BTreeMap<NodeId, String>,
    ) -> Network {
        Network {
            local,
            cluster_id: cluster_id.into(),
            pool: Arc::default(),
            tls,
            routes: Arc::new(routes),
            reach: Reachability::default(),
            initial_cluster: initial_cluster.map(Arc::from),
            refusals: Paced::default(),
        }
    }

    /// Which peers this node's RPCs reach (shared with every client).
    pub(crate) fn reachability(&self) -> Reachability {
        self.reach.clone()
    }
}

/// A connection past its hello, and how its messages are written.
struct Dialled {
    frames: PeerFrames,
    format: Format,
}

/// Idle connections by target id and address, each with when it was
/// returned.
type Idle = HashMap<(NodeId, String), Vec<(Instant, Dialled)>>;

#[derive(Default)]
struct Pool {
    idle: Mutex<Idle>,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Idle> {
        // Only connections, valid whatever a panicking holder did.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, key: &(NodeId, String)) -> Option<Dialled> {
        let mut idle = self.lock();
        let conns = idle.get_mut(key)?;
        while let Some((since, conn)) = conns.pop() {
            if since.elapsed() < MAX_IDLE {
                return Some(conn);
            }
        }
        None
    }

    fn put(&self, key: (NodeId, String), conn: Dialled) {
        let mut idle = self.lock();
        let conns = idle.entry(key).or_default();
        if conns.len() < IDLE_PER_TARGET {
            conns.push((Instant::now(), conn));
        }
    }
}

impl Network {
    /// A client of node `target` at `peer_addr` (or its test route), for
    /// asking outside openraft.
    pub(crate) fn client(&self, target: NodeId, peer_addr: &str) -> PeerClient {
        PeerClient {
            net: self.clone(),
            target,
            addr: self.routes.get(&target).map_or(peer_addr, |a| a).to_owned(),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            net: self.clone(),
            target,
            addr: self.routes.get(&target).unwrap_or(&node.peer_addr).clone(),
        }
    }
}

/// openraft's client for one target node.
pub(crate) struct PeerClient {
    net: Network,
    target: NodeId,
    addr: String,
}

/// How an exchange failed, before it becomes openraft's error.
enum ExchangeError {
    Wire(WireError),
    Timeout,
}

impl PeerClient {
    async fn connect(&self) -> Result<Dialled, WireError> {
        let tcp = TcpStream::connect(&self.addr).await?;
        wire::tune(&tcp);
        let stream = match &self.net.tls {
            Some(tls) => tls.connect(&self.addr, tcp).await?,
            None => peer_tls::plain(tcp),
        };
        let mut conn = wire::frame(stream);
        let hello = Hello {
            protocol: PROTOCOL.to_owned(),
            cluster_id: self.net.cluster_id.to_string(),
            from: self.net.local,
            to: self.target,
            binary: true,
            initial_cluster: self.net.initial_cluster.as_deref().map(str::to_owned),
        };
        wire::send(&mut conn, Format::Json, &hello).await?;
        // An older node answers Welcome: it reads only JSON.
        let format = match wire::recv(&mut conn).await? {
            HelloReply::Welcome => Format::Json,
            HelloReply::WelcomeBinary => Format::Binary,
            HelloReply::Refused(why) => return Err(WireError::Refused(why)),
        };
        wire::established(&mut conn);
        Ok(Dialled {
            frames: conn,
            format,
        })
    }

    /// Sends `request` (and the raw frame `raw` after it) and returns the
    /// reply, all within `ttl`.
    async fn call(
        &self,
        request: &Request,
        raw: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Reply, ExchangeError> {
        let deadline = Instant::now() + ttl;
        // Encoded for the first connection's format, again only if a
        // connection of the other format replaces it.
        let mut encoded: Option<(Format, Bytes)> = None;
        let key = (self.target, self.addr.clone());
        let mut pooled = self.net.pool.take(&key);
        loop {
            let was_pooled = pooled.is_some();
            let exchange = async {
                let mut conn = match pooled.take() {
                    Some(c) => c,
                    None => self.connect().await?,
                };
                let bytes = match &encoded {
                    Some((format, bytes)) if *format == conn.format => bytes.clone(),
                    _ => {
                        let bytes = wire::encode(conn.format, request)?;
                        encoded = Some((conn.format, bytes.clone()));
                        bytes
                    }
                };
                wire::send_raw(&mut conn.frames, bytes).await?;
                if let Some(raw) = &raw {
                    wire::send_raw(&mut conn.frames, raw.clone()).await?;
                }
                let reply: Reply = wire::recv(&mut conn.frames).await?;
                Ok::<_, WireError>((conn, reply))
            };
            match tokio::time::timeout_at(deadline, exchange).await {
                Err(_) => {
                    self.net.reach.failed(
                        self.target,
                        &self.addr,
                        &format!("no answer within {ttl:?}"),
                    );
                    return Err(ExchangeError::Timeout);
                }
                Ok(Ok((conn, reply))) => {
                    self.net.pool.put(key, conn);
                    self.net.reach.answered(self.target, &self.addr);
                    return Ok(reply);
                }
                // Refused or too large would be so on a fresh connection too.
                Ok(Err(e))
                    if was_pooled
                        && !matches!(e, WireError::Refused(_) | WireError::TooLarge(_)) =>
                {
                    tracing::debug!(target_node = self.target, error = %e, "pooled peer connection failed; dialling again");
                }
                Ok(Err(e)) => {
                    if matches!(e, WireError::Refused(_)) {
                        self.net.reach.refused(self.target, &self.addr, &e);
                    } else {
                        self.net.reach.failed(self.target, &self.addr, &e);
                    }
                    return Err(ExchangeError::Wire(e));
                }
            }
        }
    }

    fn error<E: std::error::Error>(
        &self,
        f: ExchangeError,
        action: RPCTypes,
        ttl: Duration,
    ) -> RpcError<E> {
        match f {
            ExchangeError::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.net.local,
                target: self.target,
                timeout: ttl,
            }),
            ExchangeError::Wire(WireError::TooLarge(_)) => {
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(0))
            }
            ExchangeError::Wire(e @ WireError::Refused(_)) => {
                self.log_refusal(&e);
                RPCError::Unreachable(Unreachable::new(&e))
            }
            ExchangeError::Wire(e @ WireError::Io(_)) => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            ExchangeError::Wire(e) => RPCError::Network(NetworkError::new(&e)),
        }
    }

    /// Logs the target's refusal of this node's hello (`e`), paced:
    /// openraft dials again every few hundred milliseconds.
    fn log_refusal(&self, e: &WireError) {
        let WireError::Refused(why) = e else {
            return;
        };
        crate::ops::metrics::peer_refused(false);
        if !self.net.refusals.due(self.target) {
            return;
        }
        // Another list puts the cluster's safety at stake; the rest (a wrong
        // cluster id or address) only keep this node out.
        if initial_list::is_refusal(why) {
            tracing::error!(target_node = self.target, addr = %self.addr, "peer refused this node: {why}; said again once a minute while it refuses");
        } else {
            tracing::warn!(target_node = self.target, addr = %self.addr, "peer refused this node: {why}; said again once a minute while it refuses");
        }
    }

    fn mismatch<E: std::error::Error>(&self, reply: &Reply) -> RpcError<E> {
        let e = std::io::Error::other(format!(
            "peer answered with the wrong kind of reply: {reply:?}"
        ));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl PeerClient {
    /// Asks the target what it knows of this node's place in its cluster
    /// (see `standing.rs`); the error says why it did not answer.
    pub(crate) async fn standing(&self, ttl: Duration) -> Result<Standing, String> {
        match self.call(&Request::Standing, None, ttl).await {
            Ok(Reply::Standing(s)) => Ok(s),
            Ok(other) => Err(format!("answered with {other:?}")),
            Err(ExchangeError::Timeout) => Err(format!("no answer within {ttl:?}")),
            Err(ExchangeError::Wire(e)) => {
                self.log_refusal(&e);
                Err(e.to_string())
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let ttl = option.hard_ttl();
        let entries = rpc.entries.len() as u64;
        match self.call(&Request::Append(rpc), None, ttl).await {
            Ok(Reply::Append(Ok(r))) => Ok(r),
            Ok(Reply::Append(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(other) => Err(self.mismatch(&other)),
            Err(ExchangeError::Wire(WireError::TooLarge(_))) => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            Err(f) => Err(self.error(f, RPCTypes::AppendEntries, ttl)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        let ttl = option.hard_ttl();
        let InstallSnapshotRequest {
            vote,
            meta,
            offset,
            data,
            done,
        } = rpc;
        let request = Request::Snapshot {
            vote,
            meta,
            offset,
            done,
        };
        match self.call(&request, Some(Bytes::from(data)), ttl).await {
            Ok(Reply::Snapshot(Ok(r))) => Ok(r),
            Ok(Reply::Snapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(other) => Err(self.mismatch(&other)),
            Err(f) => Err(self.error(f, RPCTypes::InstallSnapshot, ttl)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let ttl = option.hard_ttl();
        match self.call(&Request::Vote(rpc), None, ttl).await {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(other) => Err(self.mismatch(&other)),
            Err(f) => Err(self.error(f, RPCTypes::Vote, ttl)),
        }
    }
}
