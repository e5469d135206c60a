//! One connection of a [`crate::Client`], as the writer and reader tasks
//! see it, and, against a cluster, the session that outlives it.
//!
//! A *link* is a stream to one node with a writer task and a reader task
//! (see `client.rs` for why two). Against a single server the link ends with
//! its stream: every pending call fails, and so does every later one, since
//! the server released the locks bound to the connection.
//!
//! Against a cluster (the node's Hello says `resumable_sessions`) the link
//! opens a session, names it in every request that acts for an owner, and
//! numbers those that change the table (`Request.seq`). When the stream
//! breaks, the link's driver looks for the (new) leader among the known
//! addresses, following `NotLeader` answers, resumes the session there and
//! sends again, in order and under their first numbers, the requests that
//! were not answered: the leader answers a request it already applied as it
//! did the first time. Only when the session is really gone (a node says it
//! is unknown, or no node resumed it within its TTL) does the link end as
//! it would against a single server.

use crate::codec::{encode_frame, FrameCodec, FrameError};
use crate::dial::{establish, write_flush, Dial};
use crate::error::{Disconnect, Error, Result};
use crate::event::Event;
use crate::liveness::{silence_limit, Watches};
use crate::proto::{Request, RequestType, Response, ResponseStatus};
use crate::rules;
use crate::safety::AckClock;
use crate::transport::Stream;
use crate::Limits;
use bytes::BytesMut;
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod drains;
mod release;

pub(crate) use drains::Drains;
use release::{deliver, Releaser};
use tokio_util::task::task_tracker::TaskTrackerToken;

/// A connection as the [`crate::Client`] handles it: calls go in through
/// `calls`; `lost` says when (and why) the link ended for good.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) calls: mpsc::Sender<Call>,
    pub(crate) lost: watch::Receiver<Option<Disconnect>>,
    /// The node the link is connected to now.
    addr: Arc<Mutex<String>>,
    /// What the server said in answer to Hello; `None` for an older server.
    pub(crate) limits: Option<Limits>,
    /// How long after the last request the server answered a lock without
    /// a lease may be released: the server's session timeout, or a
    /// cluster session's TTL.
    pub(crate) session_timeout: Duration,
    pub(crate) acked: Arc<AckClock>,
    /// The cluster session the link acts for; 0 against a single server.
    pub(crate) session: u64,
    /// The client's drains, and where this link's is counted once its last
    /// handle goes (see `Drop`).
    drains: Drains,
    closing: Option<oneshot::Sender<TaskTrackerToken>>,
    /// Where a lease whose Unlock this link could not deliver is released
    /// on a link opened for it (`release.rs`).
    dial: Arc<Dial>,
    watches: Arc<Watches>,
}

impl Link {
    /// The largest request body a caller may build, and the server's frame
    /// limit it comes from: the limit less what the writer adds to every
    /// request (the token, and on a session its number and sequence
    /// numbers). `None` for a server that does not say (older than Hello).
    /// A frame over the limit makes the server close the connection, with
    /// every other call on it: such a request must not be sent.
    pub(crate) fn request_room(&self) -> Option<(usize, usize)> {
        let max = self.limits?.max_frame;
        // A tag and a length of up to 5 bytes for the token; a tag and up
        // to 10 bytes for each of session, seq and seq_done.
        // Read in place: this runs for every call, and token() copies.
        let token = self
            .dial
            .options
            .access_token
            .as_deref()
            .map_or(0, str::len);
        let added = token + 6 + 3 * 11;
        Some((max.saturating_sub(added), max))
    }
}

impl Drop for Link {
    /// The last handle on the link went: its writer closes it, and reads on
    /// for a grant that crossed the close if a Lock was unanswered. The
    /// driver holds the channel's receiver until it ends, and so the token,
    /// counted among the client's drains from now, before the writer has
    /// even noticed.
    fn drop(&mut self) {
        if let Some(closing) = self.closing.take() {
            // Fails only once the driver has ended: nothing left to count.
            let _ = closing.send(self.drains.token());
        }
    }
}

impl Link {
    pub(crate) fn is_closed(&self) -> bool {
        self.lost.borrow().is_some()
    }

    pub(crate) fn addr(&self) -> String {
        self.addr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Connects to one of `dial`'s servers (on a cluster: the leader, with
    /// a new session) and starts the tasks that serve the link.
    ///
    /// # Errors
    /// With one address: [`Error::Connect`], [`Error::ConnectTimeout`] or
    /// what the server answered. With several: [`Error::Unreachable`],
    /// naming every address tried and why it failed.
    pub(crate) async fn open(
        dial: Arc<Dial>,
        watches: Arc<Watches>,
        drains: Drains,
    ) -> Result<Link> {
        let deadline = Instant::now() + dial.options.connect_timeout;
        let est = establish(&dial, 0, deadline, false).await?;
        let options = &dial.options;
        let (session, session_timeout) = match est.session {
            Some((id, ttl)) => (id, ttl),
            None => (
                0,
                est.limits
                    .map_or(options.fallback_session_timeout, |l| l.session_timeout),
            ),
        };
        // Four pings per session timeout: one may be lost or late and the
        // next still arrives with half the timeout to spare.
        let heartbeat = options.heartbeat.min(session_timeout / 4);
        let acked = Arc::new(AckClock::new(est.acked_from));
        let (calls, calls_rx) = mpsc::channel(options.max_in_flight.max(1));
        let (lost_tx, lost) = watch::channel(None);
        let addr = Arc::new(Mutex::new(est.addr.clone()));
        let (closing, closed) = oneshot::channel();
        let driver = Driver {
            dial: dial.clone(),
            watches: watches.clone(),
            drains: drains.clone(),
            _closing: closed,
            addr: addr.clone(),
            pending: Arc::new(Mutex::new(VecDeque::new())),
            calls: calls.downgrade(),
            lost: lost_tx,
            acked: acked.clone(),
            heartbeat,
            session_ttl: session_timeout,
            silence_limit: (session != 0).then(|| {
                silence_limit(est.limits.and_then(|l| l.election_timeout), session_timeout)
            }),
        };
        let writer = Writer {
            calls: calls_rx,
            ping_id: u64::MAX,
            next_seq: 1,
            session,
            session_ttl: (session != 0).then_some(session_timeout),
            token: dial.token(),
            closed: false,
            max_unanswered: max_unanswered(est.limits.as_ref()),
        };
        tokio::spawn(driver.run(est.stream, writer));
        Ok(Link {
            calls,
            lost,
            addr,
            limits: est.limits,
            session_timeout,
            acked,
            session,
            drains,
            closing: Some(closing),
            dial,
            watches,
        })
    }
}

/// What the writer needs to send one request.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) req: Request,
    pub(crate) reply: Option<oneshot::Sender<Result<Response>>>,
    /// Held until the response arrives: bounds requests in flight.
    pub(crate) slot: Option<OwnedSemaphorePermit>,
    /// For a request whose grant names no keys of its own (Wait): the keys
    /// to release if the grant arrives once nobody waits for it.
    pub(crate) release: Option<Vec<String>>,
}

/// A request written and not yet answered.
#[derive(Debug)]
struct Pending {
    id: u64,
    /// The request's type.
    kind: i32,
    /// When the request was (last) written: once it is answered, the server
    /// has seen the connection alive no earlier than this.
    sent: Instant,
    reply: Option<oneshot::Sender<Result<Response>>>,
    /// For Lock, Enqueue and Wait: the keys, so a grant nobody waits for
    /// any more is released.
    lock_keys: Option<Vec<String>>,
    /// On a session: the request's number, 0 for one that changes nothing.
    seq: u64,
    /// On a session: the request itself, to be sent again after a
    /// reconnect. `None` against a single server, which never resumes.
    resend: Option<Request>,
    _slot: Option<OwnedSemaphorePermit>,
}

/// The requests written and not yet answered, oldest first.
type PendingQueue = Arc<Mutex<VecDeque<Pending>>>;

/// What a link keeps from one stream to the next (and the writer hands
/// back when its stream ends).
struct Writer {
    calls: mpsc::Receiver<Call>,
    /// Heartbeat ids count down from the top so they never meet the ids
    /// of real calls, which count up from 1.
    ping_id: u64,
    /// The number the next request that changes the table gets.
    next_seq: u64,
    session: u64,
    /// The session's TTL; `None` against a single server.
    session_ttl: Option<Duration>,
    token: String,
    /// Every handle on the link was dropped: end, do not reconnect.
    closed: bool,
    /// Requests unanswered at most before no more Pings are added: the
    /// server's pipeline limit, at which it stops reading (and stops
    /// counting the connection idle).
    max_unanswered: usize,
}

/// The task that serves a link: runs the writer and the reader on each
/// stream, and on a session replaces a broken stream.
struct Driver {
    dial: Arc<Dial>,
    /// The probes of the nodes this client's links are on.
    watches: Arc<Watches>,
    /// Where a release on a link opened for it is counted.
    drains: Drains,
    /// Holds, once the last handle on the link went, the token that counts
    /// this driver among the client's drains until it ends.
    _closing: oneshot::Receiver<TaskTrackerToken>,
    addr: Arc<Mutex<String>>,
    pending: PendingQueue,
    calls: mpsc::WeakSender<Call>,
    lost: watch::Sender<Option<Disconnect>>,
    acked: Arc<AckClock>,
    heartbeat: Duration,
    session_ttl: Duration,
    /// On a session: how long the node may leave its probe unanswered
    /// before the link resumes elsewhere (see `liveness.rs`).
    silence_limit: Option<Duration>,
}

impl Driver {
    async fn run(self, mut stream: Stream, mut writer: Writer) {
        loop {
            let ended = CancellationToken::new();
            let on_session = writer.session != 0;
            let (rd, wr) = tokio::io::split(stream);
            let write = tokio::spawn(write_loop(
                wr,
                writer,
                self.pending.clone(),
                self.heartbeat,
                ended.clone(),
            ));
            let heard = Arc::new(Mutex::new(Instant::now()));
            let read = tokio::spawn(read_loop(
                rd,
                self.pending.clone(),
                self.releaser(),
                ended.clone(),
                self.acked.clone(),
                on_session.then(|| heard.clone()),
            ));
            // On a session, a node found silent ends the stream too, while
            // a Lock waits as much as while nothing does.
            let silence = self.silence_limit.filter(|_| on_session).map(|limit| {
                let watch = self.watches.watch(&self.dial, &self.addr(), limit);
                let ended = ended.clone();
                tokio::spawn(async move {
                    let mut seen = watch.seen();
                    // Set while this stream outlives a silence report: how
                    // many probe answers there were then. Until the probe
                    // is answered again, the stream goes as soon as it too
                    // has heard nothing for the limit, not at the next
                    // report (a whole retry and limit later).
                    let mut suspect: Option<u64> = None;
                    loop {
                        let last = *heard.lock().unwrap_or_else(|p| p.into_inner());
                        let recheck = async {
                            match suspect.and_then(|_| last.checked_add(limit)) {
                                Some(at) => tokio::time::sleep_until(at).await,
                                None => std::future::pending().await,
                            }
                        };
                        let report = tokio::select! {
                            _ = ended.cancelled() => return None,
                            cannot_serve = watch.silent_after(seen) => Some(cannot_serve),
                            () = recheck => None,
                        };
                        match report {
                            Some(true) => {
                                // The node said so itself: what this stream
                                // heard before does not say otherwise.
                                ended.cancel();
                                return Some(Disconnect::NoQuorum);
                            }
                            Some(false) => seen = watch.seen(),
                            None if suspect != Some(watch.answered()) => {
                                // The probe was answered since: the node
                                // answers again.
                                suspect = None;
                                continue;
                            }
                            None => {}
                        }
                        // A stream that heard from the node within the limit
                        // stays: the probe's own connection was slow (a new
                        // leader flooded with resumes), not the node.
                        let last = *heard.lock().unwrap_or_else(|p| p.into_inner());
                        // Counted from zero: an instant plus a limit the node
                        // sized could overflow, a duration since cannot.
                        let waited = last.elapsed();
                        if rules::gone_silent(Duration::ZERO, waited, limit) {
                            ended.cancel();
                            return Some(Disconnect::NoAnswer { waited });
                        }
                        if report.is_some() {
                            suspect = Some(watch.answered());
                        }
                    }
                })
            });
            let (written, read) = (write.await, read.await);
            let silent = match silence {
                Some(task) => task.await.ok().flatten(),
                None => None,
            };
            let Ok((w, write_error, wr)) = written else {
                // The writer panicked and took the call queue with it.
                return self.finish(None, Disconnect::Closed);
            };
            writer = w;
            let (read_error, rd) = match read {
                Ok((e, rd)) => (e, Some(rd)),
                Err(_) => (None, None),
            };
            let reason = silent.or(read_error).or(write_error);
            if writer.session != 0 && !writer.closed {
                // A reset, not a clean close, which would tell the node
                // to end the session the client is about to resume.
                if let Some(rd) = rd {
                    rd.unsplit(wr).abort();
                }
            }
            if writer.closed {
                return self.finish(Some(writer.calls), Disconnect::Dropped);
            }
            let reason = reason.unwrap_or(Disconnect::Closed);
            if writer.session == 0 || matches!(reason, Disconnect::SessionEnded) {
                return self.finish(Some(writer.calls), reason);
            }
            let from = self.addr();
            let _ = self.dial.events.send(Event::Reconnecting {
                from: from.clone(),
                reason,
            });
            let broke = Instant::now();
            // The session lives a TTL after the last command that kept it
            // alive: the last answered request, or, while the connection
            // was open, the node's own keep-alives (a third of a TTL apart),
            // which the client does not see while a Lock waits. Past this no
            // node knows it; before it, a node that does not answers
            // UnknownSession. (Guards enforce the safety deadline apart.)
            let deadline = rules::session_lives_until(self.acked.last(), broke, self.session_ttl);
            match establish(&self.dial, writer.session, deadline, true).await {
                Ok(est) => {
                    self.acked.record(est.acked_from);
                    writer.max_unanswered = max_unanswered(est.limits.as_ref());
                    *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = est.addr.clone();
                    let _ = self.dial.events.send(Event::Resumed {
                        addr: est.addr,
                        session: writer.session,
                        after: broke.elapsed(),
                    });
                    stream = est.stream;
                }
                Err(e) => {
                    let reason = match e {
                        Error::ConnectionLost(d) => d,
                        e => Disconnect::NotResumed(Arc::new(e.to_string())),
                    };
                    return self.finish(Some(writer.calls), reason);
                }
            }
        }
    }

    fn addr(&self) -> String {
        self.addr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn releaser(&self) -> Releaser {
        Releaser {
            calls: self.calls.clone(),
            dial: self.dial.clone(),
            watches: self.watches.clone(),
            drains: self.drains.clone(),
        }
    }

    /// Ends the link for good: every call pending or queued fails with
    /// `reason`, and so does every later one.
    fn finish(&self, calls: Option<mpsc::Receiver<Call>>, reason: Disconnect) {
        self.lost.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        });
        let reason = self.lost.borrow().clone().unwrap_or(Disconnect::Closed);
        let left = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for p in left {
            if let Some(reply) = p.reply {
                let _ = reply.send(Err(Error::ConnectionLost(reason.clone())));
            }
        }
        if let Some(mut calls) = calls {
            calls.close();
            while let Ok(c) = calls.try_recv() {
                if let Some(reply) = c.reply {
                    let _ = reply.send(Err(Error::ConnectionLost(reason.clone())));
                }
            }
        }
    }
}

/// Longest wait for a clean close to be written (TLS sends a last record).
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(1);

/// How long a link that nobody holds any more, closed while a Lock, an
/// Enqueue or a Wait on it was unanswered, reads on for a grant that
/// crossed the close; and how long that grant's release on a link opened
/// for it may take. The server closes its side as soon as it reads the
/// close, so this bounds only a server or path that does not. As the
/// Python, Go and TypeScript clients.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Most calls encoded into one write.
const MAX_BATCH: usize = 64;

/// The writer task of one stream: first sends again what an earlier stream
/// left unanswered, then waits for a call (or a heartbeat's turn) and
/// writes it with every call queued behind it. Hands the call queue back
/// when the stream ends (`ended`, set by either task) or every handle is
/// dropped.
async fn write_loop(
    mut wr: WriteHalf<Stream>,
    mut st: Writer,
    pending: PendingQueue,
    heartbeat: Duration,
    ended: CancellationToken,
) -> (Writer, Option<Disconnect>, WriteHalf<Stream>) {
    // Ends the stream for the reader too, even if this task panics.
    let _end = ended.clone().drop_guard();
    let mut out = BytesMut::new();
    resend(&pending, &st.token, &mut out);
    if !out.is_empty() {
        let written = tokio::select! {
            r = write_flush(&mut wr, &out) => r,
            _ = ended.cancelled() => return (st, None, wr),
        };
        if let Err(e) = written {
            ended.cancel();
            return (st, Some(Disconnect::Write(Arc::new(e))), wr);
        }
        out.clear();
    }
    let heartbeat = heartbeat.max(Duration::from_millis(10));
    // The next Ping is due one period after the last write, not on a fixed
    // tick: a tick that finds the last write a hair under a period old
    // would skip to the next one and double the gap between answers, which
    // the safety deadline and a cluster failover's budget both pay for.
    let ping_due = tokio::time::sleep(heartbeat);
    tokio::pin!(ping_due);
    // Checked on its own beat, so steady traffic (which keeps pushing the
    // Ping back) does not hide an answer that never comes.
    let mut check = tokio::time::interval(heartbeat);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let error = loop {
        let first = tokio::select! {
            _ = ended.cancelled() => break None,
            call = st.calls.recv() => match call {
                Some(c) => c,
                None => {
                    st.closed = true;
                    break None;
                }
            },
            _ = check.tick() => {
                match unanswered_too_long(&pending, st.session_ttl) {
                    Some(silent) => break Some(silent),
                    None => continue,
                }
            }
            _ = &mut ping_due => {
                if unanswered(&pending) >= st.max_unanswered {
                    // Behind a Lock that waits, nothing is answered: Pings
                    // would pile up for as long as it waits. The server
                    // does not take a connection it stopped reading (at
                    // its pipeline limit, which this is) for idle, so none
                    // is needed.
                    ping_due.as_mut().reset(Instant::now() + heartbeat);
                    continue;
                }
                heartbeat_call(&mut st.ping_id)
            }
        };
        let batch = with_queued_calls(first, &mut st.calls);
        encode_batch(batch, &pending, &mut st, &mut out);
        // A write stuck on a dead stream must not outlive it.
        let written = tokio::select! {
            r = write_flush(&mut wr, &out) => r,
            _ = ended.cancelled() => break None,
        };
        if let Err(e) = written {
            break Some(Disconnect::Write(Arc::new(e)));
        }
        out.clear();
        ping_due.as_mut().reset(Instant::now() + heartbeat);
    };
    if st.closed {
        // A clean close: a cluster node ends the session at once.
        let _ = tokio::time::timeout(SHUTDOWN_LIMIT, wr.shutdown()).await;
        if may_be_granted(&pending) {
            // So far only half-closed: the server withdraws what waits
            // and closes its side, but a grant it sent before it read the
            // close is on its way, and a lease outlives the connection.
            // The reader reads on until then, and `deliver` releases it.
            let _ = tokio::time::timeout(DRAIN_LIMIT, ended.cancelled()).await;
        }
    }
    ended.cancel();
    (st, error, wr)
}

/// On a session: the oldest unanswered request, if it is not a Lock or a
/// Wait (which
/// may rightly wait, the node keeping the session alive meanwhile) and has
/// waited half a TTL. A node that accepts but does not answer (paused,
/// stalled, cut off behind a path that drops without a reset) would
/// otherwise hold the client until TCP gives up, after the session ended.
fn unanswered_too_long(pending: &PendingQueue, ttl: Option<Duration>) -> Option<Disconnect> {
    let ttl = ttl?;
    let queue = pending.lock().unwrap_or_else(|p| p.into_inner());
    let oldest = queue.front()?;
    let waited = oldest.sent.elapsed();
    let kind = RequestType::try_from(oldest.kind).unwrap_or(RequestType::Ping);
    rules::unanswered_too_long(kind, waited, ttl).then_some(Disconnect::NoAnswer { waited })
}

/// Encodes every request kept for sending again, in order, and restamps
/// it: its answer will come from this stream.
fn resend(pending: &PendingQueue, token: &str, out: &mut BytesMut) {
    let now = Instant::now();
    let mut queue = pending.lock().unwrap_or_else(|p| p.into_inner());
    for p in queue.iter_mut() {
        if let Some(req) = &mut p.resend {
            req.access_token = token.to_owned();
            encode_frame(req, out);
            p.sent = now;
        }
    }
}

/// `Writer::max_unanswered` for a node: its pipeline limit, or the server's
/// default for one that does not say (it predates Hello).
fn max_unanswered(limits: Option<&Limits>) -> usize {
    limits.map_or(1024, |l| l.max_pipeline.max(1))
}

fn unanswered(pending: &PendingQueue) -> usize {
    pending.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// Whether an answer still to come may be a grant: a Lock, an Enqueue or
/// a Wait is unanswered.
fn may_be_granted(pending: &PendingQueue) -> bool {
    let queue = pending.lock().unwrap_or_else(|p| p.into_inner());
    queue.iter().any(|p| p.lock_keys.is_some())
}

/// A Ping of the writer's own.
fn heartbeat_call(ping_id: &mut u64) -> Call {
    // Two ids at the top belong to the handshake.
    *ping_id = ping_id.saturating_sub(1).min(u64::MAX - 2);
    let req = Request {
        version: crate::PROTOCOL_VERSION,
        id: *ping_id,
        r#type: RequestType::Ping as i32,
        ..Request::default()
    };
    Call {
        req,
        reply: None,
        slot: None,
        release: None,
    }
}

/// `first` and the calls already waiting behind it, up to [`MAX_BATCH`]:
/// one write for many calls under load, no waiting for more when idle.
fn with_queued_calls(first: Call, calls: &mut mpsc::Receiver<Call>) -> Vec<Call> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match calls.try_recv() {
            Ok(c) => batch.push(c),
            Err(_) => break,
        }
    }
    batch
}

/// [`rules::session_use`] of a request's raw type.
fn session_use(kind: i32) -> (bool, bool) {
    RequestType::try_from(kind).map_or((false, false), rules::session_use)
}

/// Encodes `batch` into `out` and queues each call for its answer, in
/// order. On a session, names it and numbers what changes the table, and
/// keeps a copy of every request to send again after a reconnect.
fn encode_batch(batch: Vec<Call>, pending: &PendingQueue, st: &mut Writer, out: &mut BytesMut) {
    // Stamped before the write, so never later than the server's receipt.
    let sent = Instant::now();
    let mut queue = pending.lock().unwrap_or_else(|p| p.into_inner());
    for mut call in batch {
        let (id, kind) = (call.req.id, call.req.r#type);
        // Every request, the writer's own heartbeats and releases
        // included, carries the token.
        call.req.access_token.clone_from(&st.token);
        let mut seq = 0;
        if st.session != 0 {
            let (owned, numbered) = session_use(call.req.r#type);
            // An Inspect without keys asks for server counts, no owner's.
            let names_keys = call.req.lock.as_ref().is_some_and(|l| !l.keys.is_empty());
            let is_wait = call.req.r#type == RequestType::Wait as i32;
            if owned && (numbered || names_keys || is_wait) {
                call.req.session = st.session;
            }
            if numbered {
                seq = st.next_seq;
                st.next_seq += 1;
                call.req.seq = seq;
                // Everything before the oldest unanswered numbered request
                // has been answered.
                let oldest = queue.iter().find(|p| p.seq != 0).map_or(seq, |p| p.seq);
                call.req.seq_done = oldest - 1;
            }
        }
        encode_frame(&call.req, out);
        let is_lock = call.req.r#type == RequestType::Lock as i32
            || call.req.r#type == RequestType::Enqueue as i32;
        let (lock_keys, resend) = if st.session != 0 {
            let keys = is_lock.then(|| {
                call.req
                    .lock
                    .as_ref()
                    .map(|l| l.keys.clone())
                    .unwrap_or_default()
            });
            (keys.or(call.release), Some(call.req))
        } else {
            // The request is not needed once encoded: keep a Lock's keys
            // without copying them.
            let keys = is_lock.then(|| call.req.lock.take().map(|l| l.keys).unwrap_or_default());
            (keys.or(call.release), None)
        };
        queue.push_back(Pending {
            id,
            kind,
            sent,
            reply: call.reply,
            lock_keys,
            seq,
            resend,
            _slot: call.slot,
        });
    }
}

/// The reader task of one stream: hands each answer to its caller, in
/// order. Returns why the stream ended, if it broke. On a session, `heard`
/// is when a frame last arrived (for the silence check in `Driver::run`).
async fn read_loop(
    rd: ReadHalf<Stream>,
    pending: PendingQueue,
    releaser: Releaser,
    ended: CancellationToken,
    acked: Arc<AckClock>,
    heard: Option<Arc<Mutex<Instant>>>,
) -> (Option<Disconnect>, ReadHalf<Stream>) {
    let on_session = heard.is_some();
    // Ends the stream for the writer too, even if this task panics.
    let _end = ended.clone().drop_guard();
    let mut reader =
        tokio_util::codec::FramedRead::new(rd, FrameCodec::new(crate::MAX_RESPONSE_FRAME));
    let reason = loop {
        let frame = tokio::select! {
            _ = ended.cancelled() => break None,
            frame = reader.next() => frame,
        };
        let body = match frame {
            Some(Ok(body)) => {
                if let Some(heard) = &heard {
                    *heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                }
                body
            }
            Some(Err(FrameError::Io(e))) => break Some(Disconnect::Read(Arc::new(e))),
            Some(Err(FrameError::TooLarge { len, max })) => {
                break Some(Disconnect::FrameTooLarge { len, max })
            }
            None => break Some(Disconnect::Closed),
        };
        let resp: Response = match prost::Message::decode(body) {
            Ok(r) => r,
            Err(e) => break Some(Disconnect::Undecodable(e)),
        };
        // Looked at before it is taken: an answer that sends the request
        // elsewhere leaves it in place, so the writer never numbers
        // `seq_done` past it meanwhile.
        let next = {
            let mut queue = pending.lock().unwrap_or_else(|p| p.into_inner());
            match queue.front() {
                Some(p) if p.id == resp.request_id => {
                    if on_session {
                        if let Some(moved) = elsewhere(&resp) {
                            break Some(moved);
                        }
                    }
                    queue.pop_front()
                }
                _ => None,
            }
        };
        let Some(p) = next else {
            // An answer to nothing: the server turned the connection away
            // (request_id 0, e.g. too many connections) or broke ordering.
            break Some(if resp.error_text.is_empty() {
                Disconnect::UnexpectedAnswer {
                    request_id: resp.request_id,
                }
            } else {
                Disconnect::TurnedAway(resp.error_text)
            });
        };
        // On a session only an answer from a command that kept the session
        // alive proves it lived when the request was sent; a refusal, an
        // Inspect or a request the cluster could not commit proves nothing.
        if moves_deadline(on_session, p.kind, resp.status) {
            acked.record(p.sent);
        }
        deliver(p, resp, &releaser);
    };
    ended.cancel();
    (reason, reader.into_inner())
}

/// [`rules::elsewhere`] of an answer.
fn elsewhere(resp: &Response) -> Option<Disconnect> {
    let status = ResponseStatus::try_from(resp.status).ok()?;
    rules::elsewhere(
        status,
        Some(resp.leader_addr.clone()).filter(|a| !a.is_empty()),
    )
}

/// [`rules::moves_deadline`] of a request's raw type and its answer's raw
/// status; an unknown one moves nothing.
fn moves_deadline(on_session: bool, kind: i32, status: i32) -> bool {
    match (
        RequestType::try_from(kind),
        ResponseStatus::try_from(status),
    ) {
        (Ok(kind), Ok(status)) => rules::moves_deadline(on_session, kind, status),
        _ => !on_session,
    }
}
