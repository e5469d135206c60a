//! The request path without sockets, for the fuzz target in `fuzz/` and for
//! its replay in the ordinary test suite.
//!
//! [`session`] reads its input as a script for a few simulated connections.
//! Each step feeds bytes to one connection's frame decoder, ends a
//! connection, or lets the clock run; every frame then goes through the same
//! codec, protobuf decoding, validation and lock table as on a socket. After
//! every step the lock state's invariants are checked, and at the end, once
//! every connection has gone and every lease has run out, the server must be
//! empty. Any broken rule panics: that is how a fuzzer notices.

use crate::auth::Tokens;
use crate::config::Config;
use crate::db::Db;
use crate::handler::{self, Ctx, Step};
use crate::table::{OwnerId, TableLimits, Woken};
use bytes::{Bytes, BytesMut};
use clap::Parser;
use dlock::codec::FrameCodec;
use dlock::proto::{Request, Response, ResponseStatus};
use prost::Message;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
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
/// new one takes its place), 3 lets the timer expire what is due.
///
/// # Panics
/// When the lock state breaks an invariant, a response is malformed,
/// fencing tokens go backwards, or the state is not empty at the end.
pub fn session(script: &[u8]) {
    // Parsed once: flag parsing is not under test, and a fuzzer would
    // otherwise spend its time exploring it.
    static CONFIG: OnceLock<Config> = OnceLock::new();
    let config =
        CONFIG.get_or_init(|| Config::try_parse_from(FLAGS).expect("the harness's flags parse"));
    let db = Db::new(
        TableLimits {
            max_waiters: config.max_waiters,
            max_held_keys: config.max_held_keys,
        },
        1,
    );
    let tokens = Tokens::default();
    let mut harness = Harness {
        db: &db,
        config,
        tokens: &tokens,
        last_fence: 0,
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
                db.advance_to(Instant::now());
                for c in conns.iter_mut() {
                    harness.poll(c);
                }
            }
            _ => {
                let n = rest.first().map_or(0, |&n| usize::from(n));
                let take = n.min(rest.len().saturating_sub(1));
                let chunk = rest.get(1..1 + take).unwrap_or_default();
                rest = rest.get(1 + take..).unwrap_or_default();
                conn.input.extend_from_slice(chunk);
                harness.poll(conn);
            }
        }
        if let Err(e) = db.check_invariants() {
            panic!("invariant broken: {e}");
        }
    }
    for c in conns {
        harness.close(c);
    }
    db.advance_to(Instant::now() + MAX_LEASE + Duration::from_secs(1));
    if let Err(e) = db.check_invariants() {
        panic!("invariant broken at the end: {e}");
    }
    let stats = db.stats();
    assert_eq!(
        (stats.connections, stats.held_keys, stats.waiting_requests),
        (0, 0, 0),
        "state left behind after every client left and every lease ended"
    );
}

struct Harness<'a> {
    db: &'a Db,
    config: &'a Config,
    tokens: &'a Tokens,
    last_fence: u64,
}

/// One simulated connection, as `connection::Session` keeps it.
struct Sim {
    owner: OwnerId,
    codec: FrameCodec,
    input: BytesMut,
    /// A Lock waiting for its outcome; requests behind it are parked.
    waiting: Option<(u64, oneshot::Receiver<Woken>)>,
    parked: VecDeque<Bytes>,
    /// The server would have closed it (a frame over the limit).
    closed: bool,
}

impl Harness<'_> {
    fn open(&self) -> Sim {
        Sim {
            owner: self.db.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 1))),
            codec: FrameCodec::new(self.config.max_frame),
            input: BytesMut::new(),
            waiting: None,
            parked: VecDeque::new(),
            closed: false,
        }
    }

    /// Ends a connection the way the server does: an outcome that arrived
    /// unanswered is released, then the connection's state goes.
    fn close(&self, mut c: Sim) {
        if let Some((_, rx)) = c.waiting.take() {
            self.db.abandon(rx);
        }
        self.db.disconnect(c.owner);
    }

    /// Runs everything the connection can run now.
    fn poll(&mut self, c: &mut Sim) {
        if c.closed {
            return;
        }
        loop {
            if let Some((id, rx)) = c.waiting.as_mut() {
                match rx.try_recv() {
                    Ok(w) => {
                        let r = handler::woken(*id, w);
                        c.waiting = None;
                        self.check(&r);
                    }
                    Err(oneshot::error::TryRecvError::Empty) => {}
                    Err(oneshot::error::TryRecvError::Closed) => {
                        panic!("a waiting Lock lost its delivery without an answer")
                    }
                }
            }
            if c.waiting.is_none() {
                if let Some(frame) = c.parked.pop_front() {
                    self.run(c, &frame);
                    continue;
                }
            }
            if c.parked.len() >= self.config.max_pipeline {
                return; // The server stops reading here.
            }
            match c.codec.decode(&mut c.input) {
                Ok(Some(frame)) if c.waiting.is_some() => c.parked.push_back(frame),
                Ok(Some(frame)) => self.run(c, &frame),
                Ok(None) => return,
                Err(_) => {
                    // Over the limit: the server answers and closes.
                    c.closed = true;
                    return;
                }
            }
        }
    }

    fn run(&mut self, c: &mut Sim, frame: &[u8]) {
        let req = match Request::decode(frame) {
            Ok(req) => req,
            Err(e) => {
                self.check(&handler::undecodable(&e));
                return;
            }
        };
        let ctx = Ctx {
            db: self.db,
            config: self.config,
            tokens: self.tokens,
            owner: c.owner,
        };
        match handler::execute(ctx, req) {
            Step::Reply(r) => self.check(&r),
            Step::Wait { request_id, rx } => c.waiting = Some((request_id, rx)),
        }
    }

    /// Every response fits a client's frame limit, names a known status and,
    /// when it grants, carries a fencing token above every earlier one.
    fn check(&mut self, r: &Response) {
        assert!(
            r.encoded_len() <= dlock::MAX_RESPONSE_FRAME,
            "response of {} bytes",
            r.encoded_len()
        );
        let status = ResponseStatus::try_from(r.status).expect("a known status");
        if r.fence != 0 {
            assert_eq!(status, ResponseStatus::Ok, "fence on a failure");
            assert!(
                r.fence > self.last_fence,
                "fence {} after {}",
                r.fence,
                self.last_fence
            );
            self.last_fence = r.fence;
        }
    }
}
