//! `dlock top` in a pseudo-terminal against a real server: it shows a held
//! key and its waiter, and gives the terminal back when told to quit.

mod common;

use common::screen::Screen;
use common::*;
use dlock::LockOptions;
use dlock_server::testing::TestServer;
use dlock_server::Config;

/// The cell of `row` under `column` in the screen's header line.
fn cell(contents: &str, row_starts: &str, column: &str) -> Option<String> {
    let lines: Vec<&str> = contents.lines().collect();
    let header = lines
        .iter()
        .find(|l| l.contains(column) && l.contains("KEY"))?;
    let row = lines.iter().find(|l| l.starts_with(row_starts))?;
    let start = header.find(column)?;
    // Up to the next header's start, or the end of the line.
    let end = header[start + column.len()..]
        .find(|c: char| !c.is_whitespace())
        .map_or(row.len(), |i| start + column.len() + i);
    Some(row.get(start..end.min(row.len()))?.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_a_held_key_and_its_waiter_and_quits_on_q() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let holder = client(&addr).await;
    let guard = holder
        .lock("deploy/web", LockOptions::default())
        .await
        .unwrap();
    let waiter = client(&addr).await;
    let waiting =
        tokio::spawn(async move { waiter.lock("deploy/web", LockOptions::default()).await });
    let look = client(&addr).await;
    while look.inspect(["deploy/web"]).await.unwrap()[0].waiters != 1 {
        tokio::task::yield_now().await;
    }

    let mut top = Screen::start(&addr, &["top", "--interval", "200ms"], 30, 140);
    let fence = guard.fence().to_string();
    top.wait_for(
        &format!("the held key (fence {fence}) with one waiter"),
        |s| {
            let c = s.contents();
            cell(&c, "deploy/web", "STATE").as_deref() == Some("held")
                && cell(&c, "deploy/web", "FENCE").as_deref() == Some(fence.as_str())
                && cell(&c, "deploy/web", "WAITERS").as_deref() == Some("1")
                && c.contains("waiting 1")
        },
    )
    .await;
    assert!(top.alternate(), "a full-screen view");

    // The hand-off shows: the waiter holds, nobody waits.
    drop(guard);
    let next_holder = waiting.await.unwrap().unwrap();
    let next = next_holder.fence().to_string();
    top.wait_for("the waiter holding the key", |s| {
        let c = s.contents();
        cell(&c, "deploy/web", "FENCE").as_deref() == Some(next.as_str())
            && cell(&c, "deploy/web", "WAITERS").as_deref() == Some("0")
    })
    .await;

    top.send(b"q");
    assert_eq!(top.exit_code().await, 0);
    assert!(!top.alternate(), "the terminal is given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_without_a_terminal_or_with_a_bad_interval_is_a_usage_error() {
    let server = TestServer::start(Config::default()).await;
    let o = run_at(&server.addr_string(), &["top"]).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(stderr(&o).contains("terminal"), "{}", stderr(&o));
    let o = run_at(&server.addr_string(), &["top", "--interval", "10ms"]).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(stderr(&o).contains("at least 100ms"), "{}", stderr(&o));
}

/// A loopback forwarder to `upstream` that counts the connections whose
/// first request is a ClusterStatus: the ones top makes to ask nodes,
/// apart from its client's own (which may reconnect or probe on a loaded
/// machine, as any client does).
async fn counting_forwarder(
    upstream: std::net::SocketAddr,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use prost::Message;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                if down.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                if down.read_exact(&mut body).await.is_err() {
                    return;
                }
                let kind = dlock::proto::Request::decode(body.as_slice()).map(|r| r.r#type);
                if kind == Ok(dlock::proto::RequestType::ClusterStatus as i32) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                if up.write_all(&len).await.is_ok() && up.write_all(&body).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    });
    (addr, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_on_a_cluster_asks_each_node_over_the_connection_it_keeps() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(Config {
        data_dir: Some(dir.path().join("node1")),
        ..Config::default()
    })
    .await;
    let addr = server.addr_string();
    // Every connection top makes goes through the forwarder: the node is
    // the only member, so it is asked at the address top was given.
    let (front, accepted) = counting_forwarder(server.addr).await;
    let holder = client(&addr).await;
    let mut guard = holder.lock("job", LockOptions::default()).await.unwrap();

    let mut top = Screen::start(&front, &["top", "--interval", "100ms"], 30, 140);
    let shows = |fence: u64| {
        let fence = fence.to_string();
        move |s: &Screen| {
            let c = s.contents();
            let node = c.lines().find(|l| l.trim_start().starts_with("1 "));
            node.is_some_and(|l| l.contains("leader"))
                && cell(&c, "job", "FENCE").as_deref() == Some(fence.as_str())
        }
    };
    top.wait_for("the node and the held key", shows(guard.fence()))
        .await;
    let before = accepted.load(Ordering::SeqCst);
    // Six more refreshes, each seen by a new grant on the screen. Each one
    // used to connect to the node twice (its view, then every member's);
    // now a refresh reconnects only if the one before ran out of time.
    const REFRESHES: usize = 6;
    for _ in 0..REFRESHES {
        guard.unlock().await.unwrap();
        guard = holder.lock("job", LockOptions::default()).await.unwrap();
        top.wait_for("the new grant", shows(guard.fence())).await;
    }
    let new = accepted.load(Ordering::SeqCst) - before;
    assert!(
        new < REFRESHES,
        "{new} new connections asked ClusterStatus over {REFRESHES} refreshes"
    );
    top.send(b"q");
    assert_eq!(top.exit_code().await, 0);
}
