//! Noticing that a cluster node has gone silent, even while every request
//! on a link waits rightly (a Lock in line holds back the answers behind
//! it, Pings included).
//!
//! A node that stalls instead of dying (SIGSTOP, a VM freeze, a process
//! stuck whole) or sits behind a path that drops packets without a reset keeps
//! its sockets open and says nothing. The rest of the cluster replaces it
//! as leader within 3 to 4 election timeouts, and from then on nobody keeps
//! the client's session alive: it must resume on the new leader well
//! within the session's TTL. The links' own answers cannot tell in time
//! (they come in request order), so one *probe* per client and node pings
//! on a connection of its own, with no session, which the node answers at
//! once without a commit. When a Ping (or the probe's Hello) goes
//! unanswered for [`silence_limit`], or answered `Unavailable` (a node that
//! counts itself leader with no majority behind it: cut off from its peers,
//! or stopping), links on that node break off and resume their sessions
//! elsewhere (`link.rs`), and the node is tried last until it answers
//! again. On a silence, a link that heard from the node within the limit
//! stays (`rules::gone_silent`: the probe's own connection was slow), but
//! goes as soon as it too has heard nothing for the limit, unless the
//! probe has been answered since; on `Unavailable` every link goes, since
//! the node said it cannot serve.
//! A node that refuses the probe outright (down, full, access denied) is
//! left to the links, which see that themselves.

use crate::backoff::Backoff;
use crate::dial::{configure, exchange, hello, Dial};
use crate::proto::{Request, RequestType, ResponseStatus};
use crate::transport;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The longest pause between probe attempts on a node that refuses them.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// How long a node may leave a probe unanswered before it is taken for
/// gone: the rule is `rules::silence_limit`, which the model checker
/// (`dlock-model`) asks too.
pub(crate) use crate::rules::silence_limit;

/// The probe of each node some link of a client is on.
#[derive(Debug, Default)]
pub(crate) struct Watches(Mutex<HashMap<String, Weak<NodeWatch>>>);

impl Watches {
    /// The probe of `addr`, started if no link has one running.
    pub(crate) fn watch(&self, dial: &Arc<Dial>, addr: &str, limit: Duration) -> Arc<NodeWatch> {
        let mut watches = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = watches.get(addr).and_then(Weak::upgrade) {
            return w;
        }
        watches.retain(|_, w| w.strong_count() > 0);
        let w = Arc::new(NodeWatch::start(dial.clone(), addr.to_owned(), limit));
        watches.insert(addr.to_owned(), Arc::downgrade(&w));
        w
    }
}

/// What the probe found last, and how many times it found the node gone.
#[derive(Debug, Clone, Copy, Default)]
struct Findings {
    /// How many times the node was found silent or unable to serve.
    count: u64,
    /// Whether the last time it answered `Unavailable`, rather than
    /// nothing.
    cannot_serve: bool,
    /// How many of the probe's Hellos and Pings the node answered `Ok`: a
    /// link that outlived a silence report learns from it that the node
    /// answers again.
    answered: u64,
}

/// The probe of one node, shared by every link of a client on it; the
/// probing stops when the last link lets go.
#[derive(Debug)]
pub(crate) struct NodeWatch {
    findings: watch::Receiver<Findings>,
    _stop: DropGuard,
}

impl NodeWatch {
    /// Starts probing `addr` for `dial`'s links.
    pub(crate) fn start(dial: Arc<Dial>, addr: String, limit: Duration) -> NodeWatch {
        let (tx, findings) = watch::channel(Findings::default());
        let stop = CancellationToken::new();
        tokio::spawn(probe(dial, addr, limit, tx, stop.clone()));
        NodeWatch {
            findings,
            _stop: stop.drop_guard(),
        }
    }

    /// How many silences were seen so far: pass it to
    /// [`NodeWatch::silent_after`].
    pub(crate) fn seen(&self) -> u64 {
        self.findings.borrow().count
    }

    /// How many of the probe's Hellos and Pings the node answered so far.
    pub(crate) fn answered(&self) -> u64 {
        self.findings.borrow().answered
    }

    /// Resolves when the node is found silent or unable to serve after the
    /// `seen`th time: with true if it answered `Unavailable` (it cannot
    /// serve), false if it said nothing.
    pub(crate) async fn silent_after(&self, seen: u64) -> bool {
        let mut rx = self.findings.clone();
        // The sender lives as long as the probe, which lives as long as
        // this watch; should the probe have died, it reports nothing more.
        let found = rx
            .wait_for(|f| f.count > seen)
            .await
            .map(|f| f.cannot_serve);
        match found {
            Ok(cannot_serve) => cannot_serve,
            Err(_) => std::future::pending().await,
        }
    }
}

/// Probes `addr` until `stop`: each silence, or `Unavailable`, is added to
/// `findings`. (The links announce the reconnects it causes, so it says
/// nothing itself.)
async fn probe(
    dial: Arc<Dial>,
    addr: String,
    limit: Duration,
    findings: watch::Sender<Findings>,
    stop: CancellationToken,
) {
    let mut retry = Backoff::new(limit / 2, MAX_RETRY);
    loop {
        let silent = tokio::select! {
            _ = stop.cancelled() => return,
            silent = until_silent(&dial, &addr, limit, &findings) => silent,
        };
        match silent {
            Some(found) => {
                dial.suspect(&addr, true);
                findings.send_modify(|f| {
                    f.count += 1;
                    f.cannot_serve = matches!(found, Found::CannotServe);
                });
                retry.reset();
            }
            None => retry.grow(),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(retry.pause()) => {}
        }
    }
}

/// Why the probe takes a node for gone.
enum Found {
    /// A Ping (or the Hello) went unanswered for the limit.
    Silent,
    /// A Ping was answered `Unavailable`.
    CannotServe,
}

/// Pings `addr` on a connection of the probe's own, a third of `limit`
/// apart, until an answer is `limit` late or says `Unavailable`. `None`
/// when the node refuses or the connection breaks (not a silence). Each
/// `Ok` is counted in `findings`.
async fn until_silent(
    dial: &Dial,
    addr: &str,
    limit: Duration,
    findings: &watch::Sender<Findings>,
) -> Option<Found> {
    let answered = || findings.send_modify(|f| f.answered += 1);
    let token = dial.token();
    let connect = async {
        let mut stream = transport::connect(addr, &dial.options, |s| configure(s, &dial.options))
            .await
            .ok()?;
        hello(&mut stream, &token).await.ok()?;
        Some(stream)
    };
    let mut stream = match tokio::time::timeout(limit, connect).await {
        Err(_) => return Some(Found::Silent),
        Ok(None) => return None,
        Ok(Some(stream)) => stream,
    };
    answered();
    dial.suspect(addr, false);
    let mut id = 0u64;
    loop {
        tokio::time::sleep(limit / 3).await;
        id += 1;
        let ping = Request {
            version: crate::PROTOCOL_VERSION,
            id,
            access_token: token.clone(),
            r#type: RequestType::Ping as i32,
            ..Request::default()
        };
        match tokio::time::timeout(limit, exchange(&mut stream, &ping)).await {
            Err(_) => return Some(Found::Silent),
            Ok(Ok(r)) if r.status == ResponseStatus::Ok as i32 => answered(),
            // It answers but cannot serve: it counts itself leader with no
            // majority behind it (cut off from its peers, or stopping).
            // As good as silent for the sessions on it, and sooner.
            Ok(Ok(r)) if r.status == ResponseStatus::Unavailable as i32 => {
                return Some(Found::CannotServe)
            }
            Ok(_) => return None,
        }
    }
}
