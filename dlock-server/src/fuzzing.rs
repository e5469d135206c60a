//! The request path without sockets, for the fuzz target in `fuzz/` and for
//! its replay in the ordinary test suite.
//!
//! [`session`] reads its input as a script for a few simulated connections.
//! Each step feeds bytes to one connection's frame decoder, ends a
//! connection, or moves the clock to the next deadline; every frame then
//! goes through the same [`Pipeline`] (framing, parking, protobuf decoding),
//! validation and lock table as on a socket, and every response is decoded
//! from its bytes. After every step the lock state's invariants are checked,
//! and at the end, once every connection has gone and every lease has run
//! out, the server must be empty. Any broken rule panics: that is how a
//! fuzzer notices.
//!
//! The clock is a [`ManualClock`] that only the script moves, so a run
//! depends on its input alone and a crash replays exactly. The lock state
//! records every table command it applies; at the end the log is replayed on
//! a fresh table, restored from a snapshot halfway, which must return the
//! same outputs and reach the same state: nothing may change the table
//! beside its commands, and the table must be deterministic.

use crate::engine::clock::{Clock, ManualClock};
use crate::engine::local::{self, Applied};
use crate::engine::{Engine, Local};
use crate::net::pipeline::{Next, Pipeline};
use crate::ops::acl::Access;
use crate::ops::config::Config;
use crate::service::pending::Dropped;
use crate::service::{Connected, Service};
use crate::table::{LockTable, TableLimits};
use bytes::{Buf, BufMut, BytesMut};
use clap::Parser;
use dlock_proto::codec::FrameCodec;
use dlock_proto::proto::{Response, ResponseStatus};
use prost::Message;
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::codec::Decoder;

/// Simulated connections; the low bits of each step's first byte pick one.
const CONNECTIONS: usize = 4;

/// Longest lease the harness's server accepts: every lease is gone once the
/// clock has moved this far.
const MAX_LEASE: Duration = Duration::from_secs(10);

/// The limits are small so that a short input can reach every one of them.
const FLAGS: &[&str] = &[
    "dlock-server",
    "--max-frame",
    "1024",
    "--max-keys",
    "8",
    "--max-key-len",
    "16",
    "--max-pipeline",
    "16",
    "--max-waiters",
    "16",
    "--max-held-keys",
    "24",
    "--max-lease",
    "10s",
];

/// What the first byte of a step asks for, in its bits above the connection.
const STEP_CLOSE: u8 = 2;
const STEP_TICK: u8 = 3;

/// Runs `script` against a fresh lock state.
///
/// A script is a sequence of steps. Byte `b` starts a step for connection
/// `b & 3`; `(b >> 2) & 3` says which: 0 or 1 feeds the next `n` bytes to the
/// connection (where `n` is the byte after `b`), 2 closes the connection (a
/// new one takes its place), 3 moves the clock to the next deadline (a lease
/// or a wait limit) and lets the timer expire what is due.
///
/// # Panics
/// When the lock state breaks an invariant, a response is malformed,
/// a fencing token is answered twice or was never issued, the state is not empty at the end, or a
/// replay of the table's commands differs from the run.
pub fn session(script: &[u8]) {
    // Parsed once: flag parsing is not under test, and a fuzzer would
    // otherwise spend its time exploring it.
    static CONFIG: OnceLock<Config> = OnceLock::new();
    let config =
        CONFIG.get_or_init(|| Config::try_parse_from(FLAGS).expect("the harness's flags parse"));
    let limits = config.table_limits();
    let clock = ManualClock::default();
    let service = Service::local_with(
        config.clone(),
        Access::default(),
        local::table(limits, 1),
        Clock::Manual(clock.clone()),
    );
    let Engine::Local(db) = service.engine().clone() else {
        unreachable!("Service::local_with builds a local engine");
    };
    db.record_commands();
    let mut harness = Harness {
        service: &service,
        db: &db,
        fences: BTreeSet::new(),
    };
    let mut conns: Vec<Sim> = (0..CONNECTIONS).map(|_| harness.open()).collect();
    let mut rest = script;
    while let Some((&op, tail)) = rest.split_first() {
        let conn = &mut conns[usize::from(op) % CONNECTIONS];
        rest = tail;
        match (op >> 2) & 3 {
            STEP_CLOSE => {
                let old = std::mem::replace(conn, harness.open());
                harness.close(old);
            }
            STEP_TICK => {
                if let Some(t) = db.next_deadline() {
                    clock.set(t.max(clock.now()));
                }
                db.advance();
                for c in conns.iter_mut() {
                    harness.poll(c);
                }
            }
            _ => {
                let n = rest.first().map_or(0, |&n| usize::from(n));
                let take = n.min(rest.len().saturating_sub(1));
                let chunk = rest.get(1..1 + take).unwrap_or_default();
                rest = rest.get(1 + take..).unwrap_or_default();
                conn.socket.extend_from_slice(chunk);
                harness.poll(conn);
            }
        }
        if let Err(e) = db.check_invariants() {
            panic!("invariant broken: {e}");
        }
        let waits =
            |owner, req| db.read(|t, _| t.ticket(owner, req) == crate::table::TicketState::Waiting);
        if let Err(e) = service.outcomes().check(waits) {
            panic!("outcome registry out of step with the table: {e}");
        }
    }
    for c in conns {
        harness.close(c);
    }
    clock.set(
        clock
            .now()
            .saturating_add(MAX_LEASE + Duration::from_secs(1)),
    );
    db.advance();
    if let Err(e) = db.check_invariants() {
        panic!("invariant broken at the end: {e}");
    }
    let stats = service.stats();
    assert_eq!(
        (stats.connections, stats.held_keys, stats.waiting_requests),
        (0, 0, 0),
        "state left behind after every client left and every lease ended"
    );
    replay(limits, &db.take_log(), &db);
}

/// Applies `log` to a fresh table, moving to a table restored from its
/// snapshot halfway through; every output and the final state must be what
/// the run produced.
fn replay(limits: TableLimits, log: &[Applied], db: &Local) {
    let mut table = local::table(limits, 1);
    for (i, step) in log.iter().enumerate() {
        if i == log.len() / 2 {
            table = LockTable::restore(table.snapshot())
                .unwrap_or_else(|e| panic!("a snapshot does not restore: {e}"));
        }
        let out = table.apply(step.cmd.clone(), step.at);
        assert_eq!(
            out, step.out,
            "replayed command {i} ({:?}) differs",
            step.cmd
        );
    }
    assert!(
        table.snapshot() == db.snapshot(),
        "the replayed table ends in another state"
    );
}

struct Harness<'a> {
    service: &'a Arc<Service>,
    db: &'a Local,
    /// Every fencing token answered so far.
    fences: BTreeSet<u64>,
}

/// One simulated connection, as `connection::Session` keeps it.
#[derive(Debug)]
struct Sim {
    conn: Connected,
    pipeline: Pipeline,
    /// Bytes the client sent that the server has not read yet.
    socket: BytesMut,
    /// The server would have closed it (a frame over the limit).
    closed: bool,
}

impl Harness<'_> {
    fn open(&self) -> Sim {
        let config = self.service.config();
        Sim {
            conn: self
                .service
                .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)), Vec::new()),
            pipeline: Pipeline::new(config.max_frame, config.max_pipeline),
            socket: BytesMut::new(),
            closed: false,
        }
    }

    /// Ends a connection the way the server does: an outcome that arrived
    /// unanswered is released, then the connection's state goes.
    fn close(&self, mut c: Sim) {
        if let Some(pending) = c.pipeline.take_waiting() {
            self.service.abandon(pending);
        }
        drop(c.conn);
    }

    /// Runs everything the connection can run now, the way
    /// `connection::Session::run` does.
    fn poll(&mut self, c: &mut Sim) {
        if c.closed {
            return;
        }
        loop {
            if let Some(pending) = c.pipeline.waiting() {
                match pending.try_take() {
                    Ok(Some(arrived)) => c.pipeline.answer(arrived),
                    Ok(None) => {}
                    Err(Dropped) => panic!("a waiting Lock lost its delivery without an answer"),
                }
            }
            c.pipeline.execute(self.service, c.conn.conn());
            self.check_output(&mut c.pipeline);
            match c.pipeline.next_step() {
                Next::Execute => continue,
                Next::Close => {
                    c.pipeline.abandon(ResponseStatus::FrameTooLarge, "closing");
                    self.check_output(&mut c.pipeline);
                    c.closed = true;
                    return;
                }
                Next::Wait => {}
            }
            if c.socket.is_empty() || !c.pipeline.can_read() {
                assert!(!c.pipeline.stalled(), "a connection stalled: {c:?}");
                return;
            }
            let socket = &mut c.socket;
            let read = c.pipeline.read_with(|buf| {
                let n = buf.remaining_mut().min(socket.len());
                buf.put_slice(&socket[..n]);
                socket.advance(n);
                Ok(n)
            });
            if let Err(e) = read {
                panic!("a read from memory failed: {e}");
            }
        }
    }

    /// Decodes every response the pipeline wrote and checks it.
    fn check_output(&mut self, p: &mut Pipeline) {
        let mut out = BytesMut::from(p.output());
        p.written();
        let mut codec = FrameCodec::new(dlock_proto::MAX_RESPONSE_FRAME);
        loop {
            match codec.decode(&mut out) {
                Ok(Some(body)) => match Response::decode(body) {
                    Ok(r) => self.check(&r),
                    Err(e) => panic!("the server wrote an undecodable response: {e}"),
                },
                Ok(None) if out.is_empty() => return,
                Ok(None) => panic!("the server wrote half a frame"),
                Err(e) => panic!("the server wrote a bad frame: {e}"),
            }
        }
    }

    /// Every response fits a client's frame limit, names a known status and,
    /// when it grants, carries a fencing token the table issued and no
    /// other answer carried. Not one above every earlier answer's: a grant
    /// decided for a waiting Lock (or a queued Enqueue, until its Wait) is
    /// answered when its connection next runs, possibly after later grants
    /// to others were answered; the replay checks the table's own order.
    fn check(&mut self, r: &Response) {
        assert!(
            r.encoded_len() <= dlock_proto::MAX_RESPONSE_FRAME,
            "response of {} bytes",
            r.encoded_len()
        );
        let status = ResponseStatus::try_from(r.status).expect("a known status");
        if r.fence != 0 {
            assert_eq!(status, ResponseStatus::Ok, "fence on a failure");
            assert!(
                r.fence < self.db.next_fence(),
                "fence {} was never issued",
                r.fence
            );
            assert!(
                self.fences.insert(r.fence),
                "fence {} answered twice",
                r.fence
            );
        }
    }
}
