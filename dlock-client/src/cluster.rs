//! `dlock cluster status|add|remove`: a cluster's members, and changing them
//! at run time (docs/CLUSTER.md).

use crate::columns::columns;
use crate::exit::{self, Failure};
use crate::say;
use clap::{Parser, Subcommand};
use dlock::proto::{ClusterInfo, Request, RequestCluster, RequestType, Response, ResponseStatus};
use dlock::raw::{RawClient, RawError, Stream};
use std::collections::HashMap;
use std::time::Duration;

/// Shows and changes the members of a dlock cluster. The options may come
/// before or after the action.
#[derive(Debug, Parser)]
#[command(name = "dlock cluster", version = crate::cli::VERSION)]
pub struct ClusterArgs {
    #[command(flatten)]
    conn: crate::connect::Connection,

    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Every member, its role, term, last applied index and lag, as the
    /// answering node (and, for lag, the leader) sees them.
    Status,
    /// Add node ID, reached by clients at CLIENT_ADDR and by the other
    /// nodes at PEER_ADDR; returns once it has caught up and votes. Start
    /// the node first, with --initial-cluster naming the current members
    /// and --initial-cluster-state existing.
    Add {
        /// The new node's --node-id.
        #[arg(value_parser = node_id)]
        id: u64,
        /// Its client address (--listen / --advertise-client).
        client_addr: String,
        /// Its peer address (--peer-listen / --advertise-peer).
        peer_addr: String,
    },
    /// Remove node ID from the cluster.
    Remove {
        /// The node's id.
        #[arg(value_parser = node_id)]
        id: u64,
    },
}

/// A node id as the server's --node-id takes it: 0 is no node's.
fn node_id(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("node ids start at 1".into()),
        Ok(id) => Ok(id),
        Err(e) => Err(e.to_string()),
    }
}

/// A membership change may wait for a new node to catch up.
const PATIENCE: Duration = Duration::from_secs(90);

/// Runs `dlock cluster ...`.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(args: ClusterArgs) -> Result<(), Failure> {
    // ClusterStatus and its kin go on a connection of their own, with no
    // session.
    let options = args.conn.client_options()?;
    let (kind, body) = match &args.action {
        Action::Status => (RequestType::ClusterStatus, None),
        Action::Add {
            id,
            client_addr,
            peer_addr,
        } => (
            RequestType::ClusterAdd,
            Some(RequestCluster {
                node_id: *id,
                client_addr: client_addr.clone(),
                peer_addr: peer_addr.clone(),
            }),
        ),
        Action::Remove { id } => (
            RequestType::ClusterRemove,
            Some(RequestCluster {
                node_id: *id,
                ..RequestCluster::default()
            }),
        ),
    };
    let verbose = args.conn.verbose;
    // One deadline for every wait on an election, here and in
    // first_answer: waits that each had their own would add up.
    let patience = tokio::time::Instant::now() + ELECTION_PATIENCE;
    let (mut server, first) =
        first_answer(&args.conn.server, &options, kind, &body, verbose, patience).await?;
    if verbose {
        say!("{server} answered");
    }
    let mut answer = Some(first);
    // The first node's answer, then once more from the leader it names; if
    // that one knows no leader after all (a rejoining node may have started
    // an election meanwhile), the nodes are asked afresh, and if it names
    // yet another (the election is over), that one is asked, within
    // patience.
    let mut hops = 0;
    loop {
        hops += 1;
        if hops > 2 {
            if tokio::time::Instant::now() >= patience {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let r = match answer.take() {
            Some(r) => r,
            None => ask(&server, &options, kind, body.clone()).await?,
        };
        if knows_no_leader(&r) && hops > 1 && tokio::time::Instant::now() < patience {
            if verbose {
                say!("{server} knows no leader now; asking the nodes again");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (again, r) =
                first_answer(&args.conn.server, &options, kind, &body, verbose, patience).await?;
            (server, answer, hops) = (again, Some(r), 0);
            continue;
        }
        match ResponseStatus::try_from(r.status) {
            Ok(ResponseStatus::Ok) => {
                let Some(info) = &r.cluster else {
                    return Ok(());
                };
                // A follower knows neither how far the others have got nor
                // which of them answer: the status is the leader's view.
                if matches!(args.action, Action::Status) {
                    if let Some(leader) = leader_to_ask(info, &server) {
                        if verbose {
                            say!("{server} is not the leader; asking {leader}");
                        }
                        match ask(&leader, &options, kind, body.clone()).await {
                            Ok(r)
                                if r.status == ResponseStatus::Ok as i32 && r.cluster.is_some() =>
                            {
                                server = leader;
                                answer = Some(r);
                                continue;
                            }
                            Ok(_) | Err(_) => {
                                if verbose {
                                    say!("the leader at {leader} did not answer; showing {server}'s view");
                                }
                            }
                        }
                    }
                }
                // Status: every member's own view beside this node's.
                let nodes = match args.action {
                    Action::Status => {
                        every_node(info, &server, &options, &mut Links::default()).await
                    }
                    _ => Vec::new(),
                };
                match args.conn.output {
                    crate::cli::Output::Text => {
                        let mut text = status_table(info);
                        if !nodes.is_empty() {
                            text.push('\n');
                            text.push_str(&nodes_table(&nodes));
                        }
                        crate::stdout::print(text)?;
                    }
                    crate::cli::Output::Json => {
                        let mut v = status_json(info);
                        if !nodes.is_empty() {
                            v["nodes"] = nodes_json(&nodes);
                        }
                        crate::stdout::print(format!("{v}\n"))?;
                    }
                }
                return Ok(());
            }
            Ok(ResponseStatus::NotLeader) if !r.leader_addr.is_empty() => {
                if verbose {
                    say!("{server} is not the leader; asking {}", r.leader_addr);
                }
                server = r.leader_addr.clone();
            }
            Ok(ResponseStatus::AccessDenied) => {
                return Err(Failure::new(exit::NO_PERMISSION, refusal(&server, &r)));
            }
            // Asking a single server about a cluster: the user's mistake
            // of address or command, not a server that cannot be reached.
            Ok(ResponseStatus::InvalidType) => {
                return Err(Failure::new(
                    exit::USAGE,
                    // The server's text says it already ("this server is
                    // not a cluster node (...)"); an older one may send none.
                    if r.error_text.is_empty() {
                        format!("{server} is not a cluster node")
                    } else {
                        format!("{server}: {}", r.error_text)
                    },
                ));
            }
            // A port that cannot serve clients at all, saying why (a
            // cluster node's peer port): as the lock form puts it.
            Ok(ResponseStatus::General) => {
                return Err(wrong_port(&server, dlock::Error::Protocol(r.error_text)));
            }
            Ok(ResponseStatus::InvalidArgument) => {
                return Err(Failure::new(exit::USAGE, refusal(&server, &r)));
            }
            _ => return Err(Failure::new(exit::UNAVAILABLE, refusal(&server, &r))),
        }
    }
    Err(Failure::new(
        exit::UNAVAILABLE,
        format!("no leader answered (last tried {server})"),
    ))
}

/// The client address of the leader `info` names, when the node at
/// `asked` that answered is not the leader itself.
fn leader_to_ask(info: &ClusterInfo, asked: &str) -> Option<String> {
    if info.role.eq_ignore_ascii_case("leader") || info.leader_id == 0 {
        return None;
    }
    info.members
        .iter()
        .find(|m| m.node_id == info.leader_id)
        .map(|m| m.client_addr.clone())
        .filter(|a| !a.is_empty() && a != asked)
}

/// The answer of the first node of `servers` that answers, and its address;
/// exit 69 naming every node and why when none does. A node that knows no
/// leader (just restarted, or an election under way) is passed over for the
/// next; when every node that answers knows none, they are asked again until
/// `deadline` (an election takes about a second), then the first such
/// answer is returned.
async fn first_answer(
    servers: &str,
    options: &dlock::ClientOptions,
    kind: RequestType,
    body: &Option<RequestCluster>,
    verbose: bool,
    deadline: tokio::time::Instant,
) -> Result<(String, Response), Failure> {
    let servers = dlock::Servers::parse(servers);
    loop {
        let mut failed = Vec::new();
        let mut leaderless = None;
        for server in servers.addrs() {
            if verbose {
                say!("asking {server}");
            }
            match ask(server, options, kind, body.clone()).await {
                Ok(r) if knows_no_leader(&r) => {
                    failed.push(Failure::new(exit::UNAVAILABLE, refusal(server, &r)));
                    leaderless.get_or_insert((server.clone(), r));
                }
                Ok(r) => return Ok((server.clone(), r)),
                Err(f) => failed.push(f),
            }
        }
        match leaderless {
            Some(answer) if tokio::time::Instant::now() >= deadline => return Ok(answer),
            Some(_) => {
                if verbose {
                    say!("no node knows a leader yet; asking again");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None => return Err(every_failure(failed)),
        }
    }
}

/// One failure for all of `failed`, one a node: each message, and their
/// exit code when they share one (a single wrong port exits as the lock
/// form would), else 69.
fn every_failure(failed: Vec<Failure>) -> Failure {
    let code = match failed.first() {
        Some(f) if failed.iter().all(|g| g.code == f.code) => f.code,
        _ => exit::UNAVAILABLE,
    };
    let messages: Vec<String> = failed.into_iter().map(|f| f.message).collect();
    Failure::new(code, messages.join("; "))
}

/// How long `dlock cluster` asks again while the nodes that answer know no
/// leader: a few election timeouts.
const ELECTION_PATIENCE: Duration = Duration::from_secs(5);

/// Whether `r` says its node knows no leader to send the request to.
fn knows_no_leader(r: &Response) -> bool {
    r.status == ResponseStatus::NotLeader as i32 && r.leader_addr.is_empty()
}

fn refusal(server: &str, r: &Response) -> String {
    let status = ResponseStatus::try_from(r.status)
        .map_or_else(|_| r.status.to_string(), |s| s.as_str_name().to_string());
    format!("{server}: {status}: {}", r.error_text)
}

fn unreachable(server: &str, e: &dyn std::fmt::Display) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("cannot reach {server}: {e}"))
}

/// A new connection to `server`, with the token of `options`.
async fn connect(
    server: &str,
    options: &dlock::ClientOptions,
) -> Result<RawClient<Stream>, Failure> {
    let connect = RawClient::connect_with(server, options);
    Ok(tokio::time::timeout(options.connect_timeout, connect)
        .await
        .map_err(|_| {
            let limit = dlock::duration::human(options.connect_timeout);
            unreachable(
                server,
                &format!("no connection within {limit} (--connect-timeout)"),
            )
        })?
        .map_err(|e| connect_failed(server, e))?
        .with_token(options.access_token.clone().unwrap_or_default()))
}

/// A failed connect or first read: the fix when the TLS setup does not
/// match the server's, named as the lock form names it.
fn connect_failed(server: &str, e: std::io::Error) -> Failure {
    match dlock::raw::tls_setup_error(server, e) {
        Ok(e) => exit::from_client_error(e, server),
        Err(e) => unreachable(server, &e),
    }
}

/// One request of `kind` on `c`, a connection to `server`.
async fn exchange(
    c: &mut RawClient<Stream>,
    server: &str,
    kind: RequestType,
    body: Option<RequestCluster>,
) -> Result<Response, Failure> {
    let req = Request {
        cluster: body,
        ..c.request(kind, &[])
    };
    c.call(&req).await.map_err(|e| match e {
        RawError::Foreign(e) => wrong_port(server, *e),
        // TLS 1.3 refuses a client's certificate after the client's
        // handshake: on the first read.
        RawError::Io(e) => connect_failed(server, e),
        e => unreachable(server, &e),
    })
}

/// What `dlock` says of `server` when it answered as no dlock client port
/// does: the same as the lock form says (a TLS port, an HTTP port).
fn wrong_port(server: &str, e: dlock::Error) -> Failure {
    match e {
        // As the library's dial names the address a protocol error came from.
        dlock::Error::Protocol(why) => {
            exit::from_client_error(dlock::Error::Protocol(format!("{server}: {why}")), server)
        }
        e => exit::from_client_error(e, server),
    }
}

/// Asks `server` on a connection of its own.
async fn ask(
    server: &str,
    options: &dlock::ClientOptions,
    kind: RequestType,
    body: Option<RequestCluster>,
) -> Result<Response, Failure> {
    let asked = async {
        let mut c = connect(server, options).await?;
        exchange(&mut c, server, kind, body).await
    };
    tokio::time::timeout(PATIENCE, asked)
        .await
        .map_err(|_| unreachable(server, &format!("no answer within {PATIENCE:?}")))?
}

/// Connections to the nodes kept from one question to the next, so that
/// `dlock top` asks each node once a refresh without a new connection (and
/// TLS handshake) each time. One-shot forms start with none.
#[derive(Default)]
pub struct Links(HashMap<String, RawClient<Stream>>);

impl Links {
    /// Closes the connections to addresses not in `current`: members
    /// removed, a node that no longer answers at the address it had.
    pub fn keep_only<'a>(&mut self, current: impl IntoIterator<Item = &'a str>) {
        let current: std::collections::HashSet<&str> = current.into_iter().collect();
        self.0.retain(|addr, _| current.contains(addr.as_str()));
    }

    /// ClusterStatus of `server`, within `patience`, on the connection kept
    /// to it if there is one.
    pub async fn status(
        &mut self,
        server: &str,
        options: &dlock::ClientOptions,
        patience: Duration,
    ) -> Result<Response, Failure> {
        let kept = self.0.remove(server);
        let (answer, link) = status_on(kept, server, options, patience).await;
        if let Some(c) = link {
            self.0.insert(server.to_string(), c);
        }
        answer
    }
}

/// ClusterStatus of `server` on `kept`, or on a new connection if there is
/// none or it turns out closed (the node restarted, or ended it as idle).
/// The connection comes back only after an answer: one left with a
/// question unanswered would answer it to the next.
async fn status_on(
    kept: Option<RawClient<Stream>>,
    server: &str,
    options: &dlock::ClientOptions,
    patience: Duration,
) -> (Result<Response, Failure>, Option<RawClient<Stream>>) {
    let asked = async {
        if let Some(mut c) = kept {
            if let Ok(r) = exchange(&mut c, server, RequestType::ClusterStatus, None).await {
                return Ok((r, c));
            }
        }
        let mut c = connect(server, options).await?;
        let r = exchange(&mut c, server, RequestType::ClusterStatus, None).await?;
        Ok((r, c))
    };
    match tokio::time::timeout(patience, asked).await {
        Err(_) => (
            Err(unreachable(
                server,
                &format!("no answer within {patience:?}"),
            )),
            None,
        ),
        Ok(Err(f)) => (Err(f), None),
        Ok(Ok((r, c))) => (Ok(r), Some(c)),
    }
}

/// How long one member gets to answer its own ClusterStatus.
const NODE_PATIENCE: Duration = Duration::from_secs(3);

/// One member's answer about itself, or why there is none.
#[derive(Debug)]
pub struct NodeView {
    /// Its node id.
    pub id: u64,
    /// Its client address, as the membership has it.
    pub addr: String,
    /// Its own status, or why it gave none.
    pub view: Result<ClusterInfo, String>,
}

/// Asks every member of `info` for its own view, all at once: the node
/// that answered `info` at `answered_at`, the address that reached it (its
/// advertised one may not be reachable from here, or not be the name its
/// TLS certificate carries), the others at the client address they have in
/// the membership.
pub async fn every_node(
    info: &ClusterInfo,
    answered_at: &str,
    options: &dlock::ClientOptions,
    links: &mut Links,
) -> Vec<NodeView> {
    let mut asks = tokio::task::JoinSet::new();
    for m in &info.members {
        let addr = match m.node_id == info.node_id {
            true => answered_at.to_string(),
            false => m.client_addr.clone(),
        };
        let (id, options) = (m.node_id, options.clone());
        let kept = links.0.remove(&addr);
        asks.spawn(async move {
            let (answer, link) = status_on(kept, &addr, &options, NODE_PATIENCE).await;
            let view = match answer {
                Err(f) => Err(f.message),
                Ok(r) => match (ResponseStatus::try_from(r.status), &r.cluster) {
                    (Ok(ResponseStatus::Ok), Some(c)) => Ok((**c).clone()),
                    _ => Err(refusal(&addr, &r)),
                },
            };
            (NodeView { id, addr, view }, link)
        });
    }
    let mut nodes = Vec::new();
    while let Some(n) = asks.join_next().await {
        if let Ok((n, link)) = n {
            if let Some(c) = link {
                links.0.insert(n.addr.clone(), c);
            }
            nodes.push(n);
        }
    }
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// Each member's own view: role, term, applied index and build.
fn nodes_table(nodes: &[NodeView]) -> String {
    let header = ["NODE", "ROLE", "TERM", "APPLIED", "VERSION"].map(String::from);
    let rows: Vec<[String; 5]> = nodes
        .iter()
        .map(|n| match &n.view {
            Ok(c) => [
                n.id.to_string(),
                role_word(&c.role, false),
                c.term.to_string(),
                c.last_applied_index.to_string(),
                match c.version.as_str() {
                    "" => "unknown".into(),
                    v => v.into(),
                },
            ],
            Err(e) => [
                n.id.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("no answer from {}: {e}", n.addr),
            ],
        })
        .collect();
    columns(&header, &rows, &[])
}

/// Each member's own view as JSON; `error` says why one did not answer.
fn nodes_json(nodes: &[NodeView]) -> serde_json::Value {
    nodes
        .iter()
        .map(|n| match &n.view {
            Ok(c) => serde_json::json!({
                "node_id": n.id,
                "client_addr": n.addr,
                "role": role_word(&c.role, true),
                "term": c.term,
                "last_applied_index": c.last_applied_index,
                "version": (!c.version.is_empty()).then_some(c.version.as_str()),
            }),
            Err(e) => serde_json::json!({ "node_id": n.id, "client_addr": n.addr, "error": e }),
        })
        .collect()
}

/// `role` from a ClusterInfo, as shown: lower case, and a leader that
/// stepped aside (no majority heard lately) in words.
pub(crate) fn role_word(role: &str, json: bool) -> String {
    if role.eq_ignore_ascii_case("steppedaside") {
        return if json {
            "stepped_aside"
        } else {
            "stepped aside"
        }
        .into();
    }
    role.to_lowercase()
}

/// The role `info`'s node gives member `m`.
fn member_role(info: &ClusterInfo, m: &dlock::proto::ClusterMember, json: bool) -> &'static str {
    if m.node_id == info.node_id && info.role.eq_ignore_ascii_case("steppedaside") {
        if json {
            "stepped_aside"
        } else {
            "stepped aside"
        }
    } else if m.node_id == info.leader_id {
        "leader"
    } else if m.voter {
        "follower"
    } else {
        "learner"
    }
}

/// How long the answering node has failed to reach `m`, if it does.
fn unreachable_for(m: &dlock::proto::ClusterMember) -> Option<std::time::Duration> {
    (m.unreachable_micro > 0).then(|| std::time::Duration::from_micros(m.unreachable_micro))
}

/// The ROLE column: the role, and "unreachable for 12s" for a member the
/// answering node cannot reach.
fn role_text(info: &ClusterInfo, m: &dlock::proto::ClusterMember) -> String {
    let role = member_role(info, m, false);
    match unreachable_for(m) {
        Some(d) => format!(
            "{role}, unreachable for {}",
            humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
        ),
        None => role.to_string(),
    }
}

/// A node's view as one JSON object: what the table shows, with `null`
/// for what the answering node does not know (no leader; a follower's
/// view of replication).
fn status_json(info: &ClusterInfo) -> serde_json::Value {
    let members: Vec<serde_json::Value> = info
        .members
        .iter()
        .map(|m| {
            let known = |v: u64| m.replication_known.then_some(v);
            serde_json::json!({
                "node_id": m.node_id,
                "role": member_role(info, m, true),
                "client_addr": m.client_addr,
                "peer_addr": m.peer_addr,
                "voter": m.voter,
                "matched_index": known(m.matched_index),
                "lag": known(m.lag),
                "unreachable_for_secs": unreachable_for(m).map(|d| d.as_secs_f64()),
            })
        })
        .collect();
    serde_json::json!({
        "node_id": info.node_id,
        "role": role_word(&info.role, true),
        "term": info.term,
        "leader_id": (info.leader_id != 0).then_some(info.leader_id),
        "last_log_index": info.last_log_index,
        "committed_index": info.committed_index,
        "last_applied_index": info.last_applied_index,
        "version": (!info.version.is_empty()).then_some(info.version.as_str()),
        "members": members,
    })
}

/// A node's view as a table, one member a line.
fn status_table(info: &ClusterInfo) -> String {
    let mut out = format!(
        "node {} is {} in term {}; leader {}; last log {}, committed {}, applied {}\nversion {}\n",
        info.node_id,
        role_word(&info.role, false),
        info.term,
        match info.leader_id {
            0 => "unknown".to_string(),
            id => id.to_string(),
        },
        info.last_log_index,
        info.committed_index,
        info.last_applied_index,
        match info.version.as_str() {
            "" => "unknown",
            v => v,
        },
    );
    let header = ["ID", "ROLE", "CLIENT", "PEER", "MATCHED", "LAG"].map(String::from);
    let rows: Vec<[String; 6]> = info
        .members
        .iter()
        .map(|m| {
            let role = role_text(info, m);
            let (matched, lag) = if m.replication_known {
                (m.matched_index.to_string(), m.lag.to_string())
            } else {
                ("-".into(), "-".into())
            };
            [
                m.node_id.to_string(),
                role,
                m.client_addr.clone(),
                m.peer_addr.clone(),
                matched,
                lag,
            ]
        })
        .collect();
    out.push_str(&columns(&header, &rows, &[]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A node on 127.0.0.1:0 that answers every request `NotLeader`,
    /// knowing no leader, and counts the requests.
    async fn leaderless_node() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut len = [0u8; 4];
                    while s.read_exact(&mut len).await.is_ok() {
                        let mut body = vec![0; u32::from_be_bytes(len) as usize];
                        if s.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let req = <Request as prost::Message>::decode(&body[..]).unwrap();
                        count.fetch_add(1, Ordering::SeqCst);
                        let answer = prost::Message::encode_to_vec(&Response {
                            request_id: req.id,
                            status: ResponseStatus::NotLeader as i32,
                            ..Response::default()
                        });
                        let len = u32::try_from(answer.len()).unwrap().to_be_bytes();
                        let _ = s.write_all(&[&len[..], &answer].concat()).await;
                    }
                });
            }
        });
        (addr, asked)
    }

    /// The waits on an election share `dlock cluster`'s one deadline
    /// (ELECTION_PATIENCE from the start), so they cannot add up: given a
    /// deadline already passed, first_answer asks once and returns what
    /// it got, rather than waiting out a patience of its own. Counted, not
    /// timed.
    #[tokio::test]
    async fn first_answer_keeps_the_deadline_it_is_given() {
        let (addr, asked) = leaderless_node().await;
        let options = dlock::ClientOptions::default();
        let now = tokio::time::Instant::now();
        let kind = RequestType::ClusterStatus;
        let (at, r) = first_answer(&addr, &options, kind, &None, false, now)
            .await
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(at, addr);
        assert!(knows_no_leader(&r), "{r:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once");
    }

    /// A leader that stepped aside is shown as such, in words in the table
    /// and as one token in JSON, and no member is called leader.
    #[test]
    fn a_leader_that_stepped_aside_is_shown_as_one() {
        let member = |node_id| dlock::proto::ClusterMember {
            node_id,
            voter: true,
            ..Default::default()
        };
        let info = ClusterInfo {
            node_id: 1,
            role: "SteppedAside".into(),
            term: 3,
            members: vec![member(1), member(2)],
            ..Default::default()
        };
        let table = status_table(&info);
        assert!(
            table.starts_with("node 1 is stepped aside in term 3; leader unknown"),
            "{table}"
        );
        assert!(table.contains("1   stepped aside"), "{table}");
        assert!(
            !table.lines().skip(2).any(|l| l.contains("leader")),
            "{table}"
        );
        let json = status_json(&info);
        assert_eq!(json["role"], "stepped_aside");
        assert_eq!(json["members"][0]["role"], "stepped_aside");
        assert_eq!(json["members"][1]["role"], "follower");
    }
}
