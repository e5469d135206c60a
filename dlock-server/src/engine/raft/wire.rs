//! The peer protocol: frames and messages between cluster nodes.
//!
//! A frame is a 4-byte big-endian length and that many bytes, as in the
//! client protocol. A connection opens with the dialling node's [`Hello`]
//! (protocol name, cluster id, its own id and the id it means to reach,
//! whether it reads MessagePack, and the `--initial-cluster` list it
//! bootstrapped with), answered by a [`HelloReply`]; after a
//! welcome it carries [`Request`] / [`Reply`] pairs, one at a time. The
//! hello and its reply are JSON, which every version reads; the messages
//! after them are MessagePack when both ends said so ([`Format`]), else
//! JSON, and a receiver reads either (`encoding`). So a node of this
//! version and an older one still talk, in JSON. A snapshot chunk
//! request is followed by one raw frame with the chunk's bytes (JSON would
//! triple their size).
//!
//! Limits: the hello frame may be at most [`HELLO_MAX_FRAME`] bytes, so a
//! client of the client protocol, an HTTP request or random bytes at the
//! peer port are refused on their first length; later frames at most
//! [`MAX_FRAME`]. Snapshot chunks are [`SNAPSHOT_CHUNK`] bytes, well under it.

use super::peer_tls::PeerStream;
use super::types::{NodeId, SnapshotMeta, TypeConfig, Vote};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use socket2::{SockRef, TcpKeepalive};
use std::io;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// Names the protocol and its version in every hello.
pub(crate) const PROTOCOL: &str = "dlock-peer/1";
/// Largest hello frame: a cluster id, two numbers and the initial list
/// (hundreds of members). Older nodes take 4 KiB, which a hello whose
/// list is longer than about 4,000 bytes does not reach.
pub(crate) const HELLO_MAX_FRAME: usize = 64 << 10;
/// Largest frame after the hello. One entry holds about a megabyte of keys
/// and values at most (`batcher`'s limit, plus one command), far below
/// it; an append request of many entries that would be larger is refused
/// here as too large, and openraft sends it again in halves.
pub(crate) const MAX_FRAME: usize = 64 << 20;
/// Snapshot chunk size: large enough that a 100 MB snapshot is 25 round
/// trips, small enough to stay far below [`MAX_FRAME`].
pub(crate) const SNAPSHOT_CHUNK: usize = 4 << 20;
/// A peer that connects and says nothing is dropped after this.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// An established connection with no request for this long is closed;
/// heartbeats keep the leader's connections far busier.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A snapshot being received may not grow beyond this.
pub(crate) const MAX_SNAPSHOT: u64 = 4 << 30;

/// The first frame on a peer connection.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    /// Always [`PROTOCOL`].
    pub(crate) protocol: String,
    /// The dialler's cluster id; must equal the listener's.
    pub(crate) cluster_id: String,
    /// The dialler's node id.
    pub(crate) from: NodeId,
    /// The node id the dialler means to reach.
    pub(crate) to: NodeId,
    /// The dialler reads MessagePack messages; absent (false) from older
    /// nodes, which read only JSON.
    #[serde(default)]
    pub(crate) binary: bool,
    /// The `--initial-cluster` list the dialler bootstrapped with, canonical
    /// (`initial_list`); must equal the listener's when both know theirs.
    /// Absent from a node that joined, whose directory predates the
    /// record, or of an older version (which ignores the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) initial_cluster: Option<String>,
}

/// How the messages after the hello are written on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// For a node older than the binary format.
    Json,
    /// MessagePack, both ways.
    Binary,
}

/// The answer to a [`Hello`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum HelloReply {
    /// Requests may follow, in JSON.
    Welcome,
    /// Requests may follow, in MessagePack both ways. Sent only to a
    /// dialler whose hello said it reads MessagePack.
    WelcomeBinary,
    /// The connection is closed after this.
    Refused(String),
}

/// One Raft RPC.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// Entries to append, or a heartbeat.
    Append(AppendEntriesRequest<TypeConfig>),
    /// A candidate asks for a vote.
    Vote(VoteRequest<NodeId>),
    /// A snapshot chunk; its bytes follow in a raw frame.
    Snapshot {
        /// The leader's vote.
        vote: Vote,
        /// Which snapshot.
        meta: SnapshotMeta,
        /// Where in the snapshot the chunk starts.
        offset: u64,
        /// Whether it is the last chunk.
        done: bool,
    },
    /// What the answering node knows of the dialler's place in its
    /// cluster: asked by a node about to bootstrap from an empty data
    /// directory (`standing.rs`). An older node cannot decode it and
    /// closes the connection, which the asker takes as "cannot tell".
    Standing,
}

/// The answer to [`Request::Standing`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Standing {
    /// The answering node's term (0: it has never been part of a cluster).
    pub(crate) term: u64,
    /// The leader it knows of, with its peer address.
    pub(crate) leader: Option<(NodeId, String)>,
    /// Set by a leader: the last log index the dialler acknowledged, if it
    /// ever acknowledged one. A node that did and now starts empty has
    /// lost its log and its vote.
    pub(crate) acknowledged: Option<u64>,
    /// The answering node leads.
    pub(crate) leading: bool,
    /// The answering node leads with a majority behind it lately
    /// (`quorum.rs`), and its membership is committed: what it says of
    /// membership is the cluster's. False from a node older than the
    /// field, which is then not taken at its word (`removal.rs`).
    #[serde(default)]
    pub(crate) stands: bool,
    /// The dialler is in the membership the answering node knows.
    pub(crate) member: bool,
}

/// The answer to a [`Request`], of the same kind.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    /// To [`Request::Append`].
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// To [`Request::Vote`].
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// To [`Request::Snapshot`].
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    /// To [`Request::Standing`].
    Standing(Standing),
}

/// Why a peer connection failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The socket failed, or a frame was longer than allowed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The other side closed the connection.
    #[error("connection closed by the peer")]
    Closed,
    /// A frame did not hold the expected message, or a message did not
    /// encode.
    #[error("undecodable message: {0}")]
    Codec(#[from] super::encoding::CodecError),
    /// A message to send is larger than [`MAX_FRAME`].
    #[error("message of {0} bytes exceeds the {MAX_FRAME}-byte frame limit")]
    TooLarge(usize),
    /// The other side refused the hello.
    #[error("refused: {0}")]
    Refused(String),
    /// Nothing came back in time.
    #[error("timed out")]
    Timeout,
}

/// A framed peer connection.
pub(crate) type PeerFrames = Framed<PeerStream, LengthDelimitedCodec>;

/// Sets a peer connection's socket options: no Nagle delay (a heartbeat
/// must not wait for an ACK) and keepalive, so a peer that vanished without
/// a FIN is noticed even on an idle connection. tokio does not expose
/// keepalive timing, hence socket2.
pub(crate) fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY on a peer connection");
    }
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot set TCP keepalive on a peer connection");
    }
}

/// Frames `stream` for the hello exchange (small frame limit).
pub(crate) fn frame(stream: PeerStream) -> PeerFrames {
    let codec = LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(HELLO_MAX_FRAME)
        .new_codec();
    Framed::new(stream, codec)
}

/// Raises the frame limit once the hello exchange is done.
pub(crate) fn established(conn: &mut PeerFrames) {
    conn.codec_mut().set_max_frame_length(MAX_FRAME);
}

/// `msg` as a message frame's bytes.
pub(crate) fn encode<T: Serialize>(format: Format, msg: &T) -> Result<Bytes, WireError> {
    let bytes = match format {
        Format::Json => super::encoding::encode_json(msg)?,
        Format::Binary => super::encoding::encode(msg)?,
    };
    Ok(bytes.into())
}

/// Sends one message frame.
pub(crate) async fn send<T: Serialize>(
    conn: &mut PeerFrames,
    format: Format,
    msg: &T,
) -> Result<(), WireError> {
    send_raw(conn, encode(format, msg)?).await
}

/// Sends one raw frame.
pub(crate) async fn send_raw(conn: &mut PeerFrames, bytes: Bytes) -> Result<(), WireError> {
    if bytes.len() > conn.codec().max_frame_length() {
        return Err(WireError::TooLarge(bytes.len()));
    }
    conn.send(bytes).await?;
    Ok(())
}

/// Receives one raw frame.
pub(crate) async fn recv_raw(conn: &mut PeerFrames) -> Result<Bytes, WireError> {
    match conn.next().await {
        Some(frame) => Ok(frame?.freeze()),
        None => Err(WireError::Closed),
    }
}

/// Receives one message frame, in either format.
pub(crate) async fn recv<T: DeserializeOwned>(conn: &mut PeerFrames) -> Result<T, WireError> {
    let frame = recv_raw(conn).await?;
    Ok(super::encoding::decode(&frame)?)
}
