//! One question to a dlock node over plain TCP: the server's own tools
//! (local-cluster's wait for a leader, the test cluster's status) ask it
//! with the wire contract alone, so the server needs no client library.

use dlock_proto::codec::FrameCodec;
use dlock_proto::proto::{ClusterInfo, Request, RequestType, Response, ResponseStatus};
use dlock_proto::MAX_RESPONSE_FRAME;
use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// The answer of the node at `addr` to ClusterStatus, or `None` if it does
/// not answer `Ok` within `patience` (down, paused, not a cluster node).
pub async fn cluster_status(addr: &str, patience: Duration) -> Option<ClusterInfo> {
    let req = Request {
        version: dlock_proto::PROTOCOL_VERSION,
        id: 1,
        r#type: RequestType::ClusterStatus as i32,
        ..Request::default()
    };
    let r = tokio::time::timeout(patience, ask(addr, req))
        .await
        .ok()??;
    (ResponseStatus::try_from(r.status) == Ok(ResponseStatus::Ok))
        .then_some(r.cluster)
        .flatten()
        .map(|b| *b)
}

/// Sends `req` on a connection of its own and reads the one answer.
async fn ask(addr: &str, req: Request) -> Option<Response> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let mut frames = Framed::new(stream, FrameCodec::new(MAX_RESPONSE_FRAME));
    frames.send(&req).await.ok()?;
    let body = frames.next().await?.ok()?;
    prost::Message::decode(body).ok()
}
