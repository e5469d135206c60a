//! What `dlock top` shows, gathered once a refresh: the server's counts
//! and busiest keys (or the keys named with `-k`), the rates since the
//! refresh before, and on a cluster every node's own view.
//!
//! Everything comes through the request path any client has, so TLS and
//! tokens work as for every other form: an Inspect without keys that asks
//! for the busiest keys, and ClusterStatus asked of every member.

use crate::cluster::{every_node, Links, NodeView};
use dlock::proto::{ClusterInfo, ResponseStatus};
use dlock::{Client, ClientOptions, KeyState};
use std::time::Duration;
use tokio::time::Instant;

/// How long one refresh may take before the screen says the server is
/// not answering, so the view never freezes on a stalled server.
const PATIENCE: Duration = Duration::from_secs(3);

/// One refresh's worth of what the server said.
#[derive(Debug, Default)]
pub struct Sample {
    /// The node that answered: the leader on a cluster.
    pub answered_by: String,
    /// Whether it is a cluster node.
    pub cluster: bool,
    pub connections: u64,
    pub sessions: u64,
    pub held_keys: u64,
    pub waiting: u64,
    /// Grants and hand-offs per second since the refresh before; `None`
    /// for the first refresh, or when another process answered (the
    /// counters started again).
    pub grants_per_sec: Option<f64>,
    pub handoffs_per_sec: Option<f64>,
    /// The busiest keys, or the keys asked for.
    pub keys: Vec<KeyState>,
    /// The leader's view of the members (for each one's lag), and each
    /// member's own.
    pub leader_view: Option<ClusterInfo>,
    pub nodes: Vec<NodeView>,
    /// Why this refresh failed, if it did: shown instead of stale numbers
    /// passing as fresh ones.
    pub error: Option<String>,
}

/// Gathers samples, remembering the counters of the last one.
pub struct Sampler {
    client: Client,
    options: ClientOptions,
    keys: Vec<String>,
    last: Option<(Instant, u64, u64, String)>,
    /// The nodes' connections, kept from one refresh to the next.
    links: Links,
}

impl Sampler {
    /// A sampler over `client`; `keys` empty means the busiest keys.
    pub fn new(client: Client, options: ClientOptions, keys: Vec<String>) -> Sampler {
        Sampler {
            client,
            options,
            keys,
            last: None,
            links: Links::default(),
        }
    }

    /// One refresh, listing up to `rows` keys (at most the server's 100).
    pub async fn sample(&mut self, rows: u16) -> Sample {
        match tokio::time::timeout(PATIENCE, self.gather(rows)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => Sample {
                error: Some(e),
                ..Sample::default()
            },
            Err(_) => Sample {
                error: Some(format!(
                    "{} has not answered for {}",
                    self.client.addr(),
                    dlock::duration::human(PATIENCE)
                )),
                ..Sample::default()
            },
        }
    }

    async fn gather(&mut self, rows: u16) -> Result<Sample, String> {
        let wanted = u32::from(rows).min(100);
        let busiest = if self.keys.is_empty() { wanted } else { 0 };
        let overview = self
            .client
            .overview(busiest)
            .await
            .map_err(|e| e.to_string())?;
        let keys = match self.keys.is_empty() {
            true => overview.busiest,
            false => self
                .client
                .inspect(self.keys.clone())
                .await
                .map_err(|e| e.to_string())?,
        };
        let now = Instant::now();
        let answered_by = self.client.addr();
        let stats = overview.stats;
        let (grants_per_sec, handoffs_per_sec) = match &self.last {
            // The same process, and counters that only went up.
            Some((at, grants, handoffs, by))
                if *by == answered_by && stats.grants >= *grants && stats.handoffs >= *handoffs =>
            {
                let secs = now.duration_since(*at).as_secs_f64().max(1e-3);
                (
                    Some((stats.grants - grants) as f64 / secs),
                    Some((stats.handoffs - handoffs) as f64 / secs),
                )
            }
            _ => (None, None),
        };
        self.last = Some((now, stats.grants, stats.handoffs, answered_by.clone()));
        let cluster = self.client.session().is_some();
        let (leader_view, nodes) = match cluster {
            true => self.members(&answered_by).await,
            false => (None, Vec::new()),
        };
        Ok(Sample {
            answered_by,
            cluster,
            connections: stats.connections,
            sessions: stats.sessions,
            held_keys: stats.held_keys,
            waiting: stats.waiting_requests,
            grants_per_sec,
            handoffs_per_sec,
            keys,
            leader_view,
            nodes,
            error: None,
        })
    }

    /// The leader's view and every member's own; nothing when the leader
    /// does not answer (the keys and counts still show).
    async fn members(&mut self, leader: &str) -> (Option<ClusterInfo>, Vec<NodeView>) {
        let asked = self.links.status(leader, &self.options, PATIENCE).await;
        let Some(view) = asked
            .ok()
            .filter(|r| r.status == ResponseStatus::Ok as i32)
            .and_then(|r| r.cluster)
            .map(|c| *c)
        else {
            return (None, Vec::new());
        };
        let nodes = every_node(&view, leader, &self.options, &mut self.links).await;
        self.links
            .keep_only(nodes.iter().map(|n| n.addr.as_str()).chain([leader]));
        (Some(view), nodes)
    }
}
