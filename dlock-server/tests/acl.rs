//! Access control by key prefix over TCP: rules allow and deny, a denial
//! names the missing rule and changes nothing, bare tokens keep every
//! right, Unlock/Renew/Proclaim by fence of another identity's lock needs
//! `admin` (on a cluster node too, across a restart), and SIGHUP reloads the rules of a running `dlock-server` process without
//! dropping its connections.

mod common;

use common::process::Process;
use common::{status, TestClient, TestServer};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use std::path::Path;

const RULES: &str = "\
# bare token: every right, as before
root-secret
token jobs jobs-secret
    lock jobs/*
    inspect jobs/*
token web web-secret
    lock web/*
    inspect *
token ops ops-secret
    admin
";

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("acl");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Sends `req` with `token` and returns the answer.
async fn as_(c: &mut TestClient, token: &str, mut req: Request) -> Response {
    req.access_token = token.into();
    c.call(req).await
}

async fn lock(c: &mut TestClient, token: &str, keys: &[&str], lease_micro: u64) -> Response {
    let req = c.lock_request(keys, 0, lease_micro);
    as_(c, token, req).await
}

async fn with_fence(
    c: &mut TestClient,
    token: &str,
    kind: RequestType,
    key: &str,
    fence: u64,
) -> Response {
    let mut req = c.request(kind, &[key]);
    let body = req.lock.as_mut().expect("keys given");
    body.fence = fence;
    if kind == RequestType::Renew {
        body.release_micro = 60_000_000;
    }
    as_(c, token, req).await
}

async fn holder_fence(c: &mut TestClient, key: &str) -> u64 {
    let req = c.request(RequestType::Inspect, &[key]);
    as_(c, "root-secret", req).await.key_info[0].fence
}

#[tokio::test]
async fn rules_allow_their_prefixes_and_a_denial_names_the_missing_rule() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(flags(&["--token-file", &write(dir.path(), RULES)])).await;
    let mut c = TestClient::connect(server.addr).await;

    let r = lock(&mut c, "jobs-secret", &["jobs/nightly"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let ping = c.request(RequestType::Ping, &[]);
    assert_eq!(
        status(&as_(&mut c, "web-secret", ping).await),
        ResponseStatus::Ok
    );

    // One key out of its prefix denies the whole request, and names it.
    let r = lock(&mut c, "jobs-secret", &["jobs/a", "web/home"], 0).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    assert!(r.error_text.contains("\"jobs\""), "{}", r.error_text);
    assert!(
        r.error_text.contains("\"lock web/home\""),
        "{}",
        r.error_text
    );
    // Nothing happened: neither key is held.
    assert_eq!(holder_fence(&mut c, "jobs/a").await, 0);
    assert_eq!(holder_fence(&mut c, "web/home").await, 0);

    // Inspect needs its own rule; the server-wide counts need "inspect *".
    let req = c.request(RequestType::Inspect, &["web/home"]);
    let r = as_(&mut c, "jobs-secret", req).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    assert!(
        r.error_text.contains("\"inspect web/home\""),
        "{}",
        r.error_text
    );
    let stats = c.request(RequestType::Inspect, &[]);
    let r = as_(&mut c, "jobs-secret", stats.clone()).await;
    assert!(r.error_text.contains("\"inspect *\""), "{}", r.error_text);
    assert_eq!(
        status(&as_(&mut c, "web-secret", stats).await),
        ResponseStatus::Ok
    );

    // Enqueue takes keys as Lock does, under the same rule, and a denied
    // one queues nothing.
    let enqueue = c.request(RequestType::Enqueue, &["web/queue"]);
    let r = as_(&mut c, "jobs-secret", enqueue).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied, "{r:?}");
    assert!(
        r.error_text.contains("\"lock web/queue\""),
        "{}",
        r.error_text
    );
    assert_eq!(holder_fence(&mut c, "web/queue").await, 0);
    let enqueue = c.request(RequestType::Enqueue, &["jobs/queue"]);
    let r = as_(&mut c, "jobs-secret", enqueue).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);

    // Another team cannot release jobs' lock, even from the holder's own
    // connection with its own token.
    let unlock = c.request(RequestType::Unlock, &["jobs/nightly"]);
    let r = as_(&mut c, "web-secret", unlock).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    assert_ne!(holder_fence(&mut c, "jobs/nightly").await, 0);

    // An unknown or missing token is denied as before.
    let ping = c.request(RequestType::Ping, &[]);
    let r = as_(&mut c, "nobody", ping).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    assert_eq!(r.error_text, "access token missing or not accepted");
    assert_eq!(status(&c.ping().await), ResponseStatus::AccessDenied);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_bare_token_keeps_every_right() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(flags(&["--token-file", &write(dir.path(), RULES)])).await;
    let mut c = TestClient::connect(server.addr).await;
    let r = lock(&mut c, "root-secret", &["anything", "jobs/x", "web/y"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let stats = c.request(RequestType::Inspect, &[]);
    let r = as_(&mut c, "root-secret", stats).await;
    assert_eq!(r.server_stats.expect("stats").held_keys, 3);
    // And, like admin, by fence from another connection.
    let mut other = TestClient::connect(server.addr).await;
    let fence = holder_fence(&mut other, "anything").await;
    let r = with_fence(
        &mut other,
        "root-secret",
        RequestType::Unlock,
        "anything",
        fence,
    )
    .await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    server.stop().await.unwrap();
}

/// `key`, held under `fence` by a lease that identity "jobs" took on
/// another connection: "jobs2", whose rules cover the key, can neither
/// renew, release nor proclaim it by fence; "jobs" can, from this
/// connection; an admin ("ops") can release it.
async fn only_the_taker_or_an_admin(c: &mut TestClient, key: &str, fence: u64) {
    for kind in [
        RequestType::Renew,
        RequestType::Unlock,
        RequestType::Proclaim,
    ] {
        let r = with_fence(c, "jobs2-secret", kind, key, fence).await;
        assert_eq!(status(&r), ResponseStatus::AccessDenied, "{kind:?}");
        assert!(r.error_text.contains("\"admin\""), "{}", r.error_text);
    }
    assert_eq!(holder_fence(c, key).await, fence);
    for kind in [RequestType::Renew, RequestType::Proclaim] {
        let r = with_fence(c, "jobs-secret", kind, key, fence).await;
        assert_eq!(status(&r), ResponseStatus::Ok, "{kind:?}: {}", r.error_text);
    }
    let r = with_fence(c, "ops-secret", RequestType::Unlock, key, fence).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    assert_eq!(holder_fence(c, key).await, 0);
}

#[tokio::test]
async fn by_fence_only_the_identity_that_took_a_lock_or_an_admin_may_act_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let rules = format!("{RULES}token jobs2 jobs2-secret\n    lock jobs/*\n");
    let server = TestServer::start(flags(&["--token-file", &write(dir.path(), &rules)])).await;
    let mut taker = TestClient::connect(server.addr).await;
    // A lease, as `dlock --hold` and the lease keeper use: it outlives
    // its connection, and is renewed and released by fence from others.
    let r = lock(&mut taker, "jobs-secret", &["jobs/lease"], 60_000_000).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let fence = r.fence;
    drop(taker);

    let mut c = TestClient::connect(server.addr).await;
    only_the_taker_or_an_admin(&mut c, "jobs/lease", fence).await;

    // A lock granted after a wait is noted too.
    let mut holder = TestClient::connect(server.addr).await;
    let r = lock(&mut holder, "ops-secret", &["jobs/q"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let mut waiter = TestClient::connect(server.addr).await;
    let mut wait = waiter.lock_request(&["jobs/q"], 0, 60_000_000);
    wait.access_token = "jobs-secret".into();
    waiter.send(&wait).await;
    let mut watch = TestClient::connect(server.addr).await;
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let req = watch.request(RequestType::Inspect, &["jobs/q"]);
        if as_(&mut watch, "root-secret", req).await.key_info[0].waiters == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Lock never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let unlock = holder.request(RequestType::Unlock, &["jobs/q"]);
    assert_eq!(
        status(&as_(&mut holder, "ops-secret", unlock).await),
        ResponseStatus::Ok
    );
    let granted = waiter.recv().await;
    assert_eq!(status(&granted), ResponseStatus::Ok);
    let r = with_fence(
        &mut c,
        "jobs-secret",
        RequestType::Unlock,
        "jobs/q",
        granted.fence,
    )
    .await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn sighup_reloads_the_rules_and_keeps_connections() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "token jobs jobs-secret\n    lock jobs/*\n");
    let mut server = Process::start(&["--token-file", &path]);
    let mut c = TestClient::connect(server.addr).await;
    let r = lock(&mut c, "jobs-secret", &["jobs/held"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let r = lock(&mut c, "jobs-secret", &["web/x"], 0).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);

    // A broken file is refused and the rules in force stay.
    std::fs::write(&path, "token jobs\n").unwrap();
    server.signal("HUP");
    let line = server.wait_for_log("reload failed");
    assert!(line.contains("line 1"), "{line}");
    let r = lock(&mut c, "jobs-secret", &["jobs/other"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);

    std::fs::write(&path, "token jobs jobs-secret\n    lock web/*\n").unwrap();
    server.signal("HUP");
    server.wait_for_log("access rules reloaded");
    // The same connection, still open, now under the new rules; its lock
    // taken before the reload is still held.
    let r = lock(&mut c, "jobs-secret", &["web/x"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    let r = lock(&mut c, "jobs-secret", &["jobs/new"], 0).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    let stats = c.request(RequestType::Ping, &[]);
    assert_eq!(
        status(&as_(&mut c, "jobs-secret", stats).await),
        ResponseStatus::Ok
    );
    // No secret reached the log.
    assert!(server
        .log_lines()
        .iter()
        .all(|l| !l.contains("jobs-secret")));
}

/// A server configured by its command-line flags, as an operator writes them.
fn flags(args: &[&str]) -> dlock_server::Config {
    use clap::Parser;
    dlock_server::Config::try_parse_from(
        std::iter::once("dlock-server").chain(args.iter().copied()),
    )
    .expect("flags parse")
}

/// A durable node (a cluster of one) on `data` with the rules in `acl`,
/// once it leads.
async fn cluster_node(acl: &str, data: &Path) -> TestServer {
    let server = TestServer::start(flags(&[
        "--token-file",
        acl,
        "--data-dir",
        data.to_str().unwrap(),
    ]))
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        // Inspect, unlike Ping, needs a leader.
        let inspect = c.request(RequestType::Inspect, &["jobs/a"]);
        let r = as_(&mut c, "root-secret", inspect).await;
        if status(&r) == ResponseStatus::Ok {
            return server;
        }
        assert_eq!(status(&r), ResponseStatus::NotLeader, "{}", r.error_text);
        assert!(std::time::Instant::now() < deadline, "never a leader");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn on_a_cluster_by_fence_only_the_taker_or_an_admin_may_act_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rules = format!("{RULES}token jobs2 jobs2-secret\n    lock jobs/*\n");
    let acl = write(dir.path(), &rules);
    let data = dir.path().join("node1");
    let server = cluster_node(&acl, &data).await;
    let mut taker = TestClient::connect(server.addr).await;
    let r = lock(&mut taker, "jobs-secret", &["jobs/lease"], 60_000_000).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    let fence = r.fence;
    // A fence nobody was granted yet is nobody's to name.
    let mut c = TestClient::connect(server.addr).await;
    let r = with_fence(
        &mut c,
        "jobs2-secret",
        RequestType::Unlock,
        "jobs/lease",
        fence + 1000,
    )
    .await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied, "{}", r.error_text);
    drop(taker);

    // The record is part of the replicated table: a restarted node (its
    // log replayed) still knows who took the lease.
    server.stop().await.unwrap();
    let server = cluster_node(&acl, &data).await;
    let mut c = TestClient::connect(server.addr).await;
    only_the_taker_or_an_admin(&mut c, "jobs/lease", fence).await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn on_a_cluster_members_change_only_for_admin_and_show_with_inspect_all() {
    let dir = tempfile::tempdir().unwrap();
    let acl = write(dir.path(), RULES);
    let server = cluster_node(&acl, &dir.path().join("node1")).await;
    let mut c = TestClient::connect(server.addr).await;
    let change = |c: &mut TestClient, kind| {
        let mut req = c.request(kind, &[]);
        req.cluster = Some(dlock::proto::RequestCluster {
            node_id: 7,
            client_addr: "127.0.0.1:1".into(),
            peer_addr: "127.0.0.1:2".into(),
        });
        req
    };
    for kind in [RequestType::ClusterAdd, RequestType::ClusterRemove] {
        // web may inspect everything, but not change the members.
        let req = change(&mut c, kind);
        let r = as_(&mut c, "web-secret", req).await;
        assert_eq!(status(&r), ResponseStatus::AccessDenied, "{kind:?}: {r:?}");
        assert!(r.error_text.contains("\"admin\""), "{}", r.error_text);
    }
    // Removing a node that is not a member gets past the rules to the
    // cluster, which refuses it for what it is.
    let req = change(&mut c, RequestType::ClusterRemove);
    let r = as_(&mut c, "ops-secret", req).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
    let req = as_req(&mut c, "ops-secret", RequestType::ClusterStatus);
    assert_eq!(c.call(req).await.cluster.map(|i| i.node_id), Some(1));

    // The cluster's state is server-wide, as the counts are: "inspect *".
    let req = as_req(&mut c, "web-secret", RequestType::ClusterStatus);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    let req = as_req(&mut c, "jobs-secret", RequestType::ClusterStatus);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied, "{r:?}");
    assert!(r.error_text.contains("\"inspect *\""), "{}", r.error_text);
    server.stop().await.unwrap();
}

/// A request of `kind` naming no keys, with `token`.
fn as_req(c: &mut TestClient, token: &str, kind: RequestType) -> Request {
    let mut req = c.request(kind, &[]);
    req.access_token = token.into();
    req
}

/// OpenSession (resuming `session` when not 0) with `token`.
async fn open_session(c: &mut TestClient, token: &str, session: u64) -> Response {
    let mut req = c.request(RequestType::OpenSession, &[]);
    req.session = session;
    as_(c, token, req).await
}

#[tokio::test]
async fn a_cluster_session_is_resumed_only_by_the_identity_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let acl = write(dir.path(), RULES);
    let data = dir.path().join("node1");
    let server = TestServer::start(flags(&[
        "--token-file",
        &acl,
        "--data-dir",
        data.to_str().unwrap(),
    ]))
    .await;
    // A cluster of one answers OpenSession once it has elected itself.
    let mut jobs = TestClient::connect(server.addr).await;
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let opened = loop {
        let r = open_session(&mut jobs, "jobs-secret", 0).await;
        if status(&r) == ResponseStatus::Ok {
            break r;
        }
        assert_eq!(status(&r), ResponseStatus::NotLeader, "{}", r.error_text);
        assert!(std::time::Instant::now() < deadline, "never a leader");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let session = opened.session;
    let mut held = common::in_session(jobs.lock_request(&["jobs/a"], 0, 0), session);
    held.access_token = "jobs-secret".into();
    assert_eq!(status(&jobs.call(held).await), ResponseStatus::Ok);

    // Another identity cannot take the session over, even with every
    // right; an unknown session and a foreign one look the same.
    let mut other = TestClient::connect(server.addr).await;
    for token in ["web-secret", "ops-secret"] {
        let r = open_session(&mut other, token, session).await;
        assert_eq!(status(&r), ResponseStatus::UnknownSession, "{token}");
    }
    let mut unlock = common::in_session(other.request(RequestType::Unlock, &["jobs/a"]), session);
    unlock.access_token = "ops-secret".into();
    assert_eq!(
        status(&other.call(unlock).await),
        ResponseStatus::UnknownSession
    );
    assert_ne!(holder_fence(&mut other, "jobs/a").await, 0, "still held");

    // Its own identity resumes it from another connection.
    let mut again = TestClient::connect(server.addr).await;
    let r = open_session(&mut again, "jobs-secret", session).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    assert_eq!(r.session, session);
    let mut unlock = common::in_session(again.request(RequestType::Unlock, &["jobs/a"]), session);
    unlock.access_token = "jobs-secret".into();
    assert_eq!(status(&again.call(unlock).await), ResponseStatus::Ok);
    assert_eq!(holder_fence(&mut again, "jobs/a").await, 0);
}

#[tokio::test]
async fn the_readme_token_file_example_works_as_written() {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("```text\n# /etc/dlock/tokens")
        .expect("the README shows a token file");
    let block = &readme[start + "```text\n".len()..];
    let example = &block[..block.find("```").expect("the block ends")];
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(flags(&["--token-file", &write(dir.path(), example)])).await;
    let mut c = TestClient::connect(server.addr).await;
    let r = lock(&mut c, "8c41d7f0b2aa", &["jobs/nightly"], 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    let r = lock(&mut c, "8c41d7f0b2aa", &["web/home"], 0).await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    assert!(
        r.error_text
            .contains("identity \"jobs\" has no rule \"lock web/home\""),
        "{}",
        r.error_text
    );
    for token in ["77aa3e9c01", "1f0c2a9e7d41"] {
        let r = lock(&mut c, token, &["web/home"], 0).await;
        assert_eq!(status(&r), ResponseStatus::Ok, "{token}: {}", r.error_text);
        let mut unlock = c.request(RequestType::Unlock, &["web/home"]);
        unlock.access_token = token.into();
        assert_eq!(status(&c.call(unlock).await), ResponseStatus::Ok);
    }
}
