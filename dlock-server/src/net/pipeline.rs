//! One connection's requests between its socket and the lock table: the
//! bytes read and not yet executed, the Lock the connection waits for, and
//! the encoded responses not yet written.
//!
//! Frames are found and decoded in place in the read buffer and executed in
//! arrival order. When a Lock has to wait, the frames behind it stay in the
//! buffer, still encoded, until its outcome arrives: parked requests cost
//! what they weigh on the wire and nothing is copied per frame. Because no
//! frame keeps a reference into the buffer, it stays uniquely owned and
//! every read can fill a large, reused region; a pipelined burst is taken in
//! one or two system calls rather than one per frame.
//!
//! It does no I/O. `connection` moves bytes between the socket and a
//! `Pipeline`; the fuzz harness feeds one directly, so both run the same
//! code. The only clock read on its path is the wall clock stamped on each
//! response (`server_unix_time`, in `service::reply`); the lock table's
//! time is read once per command by the engine.

use crate::service::pending::{Arrived, Dropped, Pending};
use crate::service::{reply, Conn, Service, Waiting};
use bytes::buf::Limit;
use bytes::{Buf, BufMut, BytesMut};
use dlock_proto::codec::{encode_frame, frame_len, FrameError, LEN_PREFIX};
use dlock_proto::proto::{Request, ResponseStatus};
use prost::Message;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Parked requests may add up to this many maximum-size frames: enough for
/// deep pipelines of ordinary requests, while a connection's memory stays a
/// small multiple of `--max-frame` however large its requests are.
pub const QUEUED_FRAMES: usize = 4;

/// The first read of a burst asks for this much. Idle connections hold no
/// read buffer at all, so this costs nothing at 10,000 connections.
const MIN_READ: usize = 4 * 1024;

/// A client that keeps filling whole reads gets reads up to this size: one
/// system call then takes thousands of small pipelined requests.
const MAX_READ: usize = 64 * 1024;

/// Execution pauses for a write once this much output waits, so the output
/// buffer stays bounded however large the answers to a burst are.
const OUT_HIGH_WATER: usize = 64 * 1024;

/// What a pipeline's driver does next; see [`Pipeline::next_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Paused to write a large output: execute again before reading more.
    Execute,
    /// An oversize frame length arrived: nothing after it can be read, so
    /// answer what is accepted (see [`Pipeline::abandon`]) and close.
    Close,
    /// Wait for the waiting Lock's outcome or for more bytes (when
    /// [`Pipeline::can_read`]).
    Wait,
}

/// A connection's input, waiting Lock and output. See the module docs.
#[derive(Debug)]
pub struct Pipeline {
    /// Bytes read and not yet executed: complete frames, possibly followed
    /// by the start of one more.
    input: BytesMut,
    /// `input[..scanned]` is `frames` complete frames whose lengths have
    /// been checked; these are the requests accepted and not yet answered.
    scanned: usize,
    frames: usize,
    /// A frame length over the limit follows the scanned frames: nothing
    /// after it can be read.
    too_large: Option<TooLarge>,
    /// The Lock that has to wait, by request id, and where its outcome comes.
    waiting: Option<Waiting>,
    out: BytesMut,
    /// Size of the next read; adapts to how fast the client sends.
    read_size: usize,
    max_frame: usize,
    max_pipeline: usize,
}

#[derive(Debug, Clone, Copy)]
struct TooLarge {
    len: usize,
    answered: bool,
}

/// What one read brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes read; 0 means the peer closed its side.
    pub bytes: usize,
    /// Whether a whole request (or an oversize frame length) arrived: the
    /// idle timer counts those, not bytes, so a trickle keeps nobody alive.
    pub request: bool,
}

impl Pipeline {
    /// An empty pipeline for frames of at most `max_frame` bytes and at most
    /// `max_pipeline` requests accepted and unanswered at once.
    pub fn new(max_frame: usize, max_pipeline: usize) -> Self {
        Pipeline {
            input: BytesMut::new(),
            scanned: 0,
            frames: 0,
            too_large: None,
            waiting: None,
            out: BytesMut::new(),
            read_size: MIN_READ,
            max_frame,
            max_pipeline: max_pipeline.max(1),
        }
    }

    /// Requests accepted and not answered yet: parked frames and the
    /// waiting Lock.
    pub fn unanswered(&self) -> usize {
        self.frames + usize::from(self.waiting.is_some())
    }

    /// Whether the connection should read more now. It stops at
    /// `--max-pipeline` unanswered requests, at the byte limit of parked
    /// frames, and for good after an oversize frame length.
    pub fn can_read(&self) -> bool {
        self.too_large.is_none()
            && self.unanswered() < self.max_pipeline
            && self.input.len() < self.input_limit()
    }

    fn input_limit(&self) -> usize {
        QUEUED_FRAMES * (self.max_frame + LEN_PREFIX)
    }

    /// Reads once: `read` gets room in the input buffer (at most what the
    /// limits leave) and returns how many bytes it put there, as
    /// `TcpStream::try_read_buf` does.
    ///
    /// # Errors
    /// Whatever `read` returns; the pipeline is unchanged then.
    pub fn read_with<F>(&mut self, read: F) -> io::Result<Received>
    where
        F: FnOnce(&mut Limit<&mut BytesMut>) -> io::Result<usize>,
    {
        let room = self.input_limit().saturating_sub(self.input.len());
        let want = self.read_size.min(room).max(1);
        self.input.reserve(want);
        let bytes = match read(&mut (&mut self.input).limit(want)) {
            Ok(n) => n,
            Err(e) => {
                // Readiness can outlive the data (a read that exactly filled
                // its room leaves the socket marked readable): a buffer
                // reserved for a read that found nothing is not kept while
                // the connection waits.
                if self.input.is_empty() {
                    self.input = BytesMut::new();
                }
                return Err(e);
            }
        };
        if bytes == want {
            // More is probably waiting: take bigger bites.
            self.read_size = (self.read_size * 2).min(MAX_READ);
        } else if bytes < self.read_size / 4 {
            self.read_size = (self.read_size / 2).max(MIN_READ);
        }
        let before = (self.frames, self.too_large.is_some());
        self.scan();
        Ok(Received {
            bytes,
            request: (self.frames, self.too_large.is_some()) != before,
        })
    }

    /// Accepts the complete frames after the scanned ones, up to the
    /// pipeline limit.
    fn scan(&mut self) {
        while self.too_large.is_none() && self.unanswered() < self.max_pipeline {
            match frame_len(&self.input[self.scanned..], self.max_frame) {
                Ok(Some(len)) => {
                    self.scanned += LEN_PREFIX + len;
                    self.frames += 1;
                }
                Ok(None) => return,
                Err(FrameError::TooLarge { len, .. }) => {
                    self.too_large = Some(TooLarge {
                        len,
                        answered: false,
                    });
                }
                Err(FrameError::Io(_)) => return,
            }
        }
    }

    /// Takes the first accepted frame's body out of the input and returns it
    /// decoded; the caller has checked that there is one.
    fn pop_request(&mut self) -> Result<Request, prost::DecodeError> {
        // `frames` counts only frames that scanning found whole and within
        // the limit, so anything else here is a bug in the scan: decoding a
        // made-up length instead would answer a request nobody sent.
        let len = frame_len(&self.input, self.max_frame)
            .ok()
            .flatten()
            .expect("pop_request is called only when scanning accepted a whole frame");
        let decoded = Request::decode(&self.input[LEN_PREFIX..LEN_PREFIX + len]);
        self.input.advance(LEN_PREFIX + len);
        self.scanned -= LEN_PREFIX + len;
        self.frames -= 1;
        decoded
    }

    /// Runs accepted requests in order until one has to wait, the output
    /// reaches its high-water mark (write it, then call again), or none is
    /// left. An oversize frame is answered once everything before it is.
    pub fn execute(&mut self, service: &Arc<Service>, conn: &Arc<Conn>) {
        loop {
            // Before every way out, so `runnable` sees every frame that can
            // be accepted: with --max-pipeline 1 the next frame is accepted
            // only once the previous one is answered.
            self.scan();
            if self.waiting.is_some() || self.out.len() >= OUT_HIGH_WATER {
                return;
            }
            if self.frames == 0 {
                self.answer_too_large();
                return;
            }
            match self.pop_request() {
                Ok(req) => self.waiting = service.execute(conn, req, &mut self.out),
                Err(e) => {
                    crate::ops::metrics::request(-1, ResponseStatus::General, Duration::ZERO);
                    encode_frame(&reply::undecodable(&e), &mut self.out);
                }
            }
        }
    }

    /// What the driver of this pipeline (a connection, or the fuzz harness)
    /// does once it has called `execute` and written the output: the one
    /// decision both make the same way.
    pub fn next_step(&self) -> Next {
        if self.runnable() {
            Next::Execute
        } else if self.broken() {
            Next::Close
        } else {
            Next::Wait
        }
    }

    /// Whether `execute` stopped with requests it could still run: the
    /// output reached its high-water mark and must be written first.
    pub fn runnable(&self) -> bool {
        self.waiting.is_none() && self.frames > 0
    }

    /// Whether nothing would move this pipeline on: no Lock waits and
    /// nothing is runnable, yet a whole request sits unaccepted in the input
    /// or reading is refused. A driver that calls `execute` until it is not
    /// `runnable` never sees this; the fuzz harness checks it after every
    /// step.
    pub fn stalled(&self) -> bool {
        let unaccepted = matches!(
            frame_len(&self.input[self.scanned..], self.max_frame),
            Ok(Some(_))
        );
        self.waiting.is_none()
            && !self.runnable()
            && self.too_large.is_none()
            && (unaccepted || !self.can_read())
    }

    /// Whether an oversize frame length arrived: the connection answers what
    /// came before it and closes.
    pub fn broken(&self) -> bool {
        self.too_large.is_some()
    }

    fn answer_too_large(&mut self) {
        if let Some(t) = self.too_large.as_mut().filter(|t| !t.answered) {
            t.answered = true;
            let r = reply::error(
                0,
                ResponseStatus::FrameTooLarge,
                format!(
                    "frame of {} bytes exceeds the limit of {} bytes; closing",
                    t.len, self.max_frame
                ),
            );
            encode_frame(&r, &mut self.out);
        }
    }

    /// The pending request's answer, to await; `None` when nothing waits.
    pub fn waiting(&mut self) -> Option<&mut Pending> {
        self.waiting.as_mut().map(|w| &mut w.answer)
    }

    /// Answers the pending request with what arrived for it.
    pub fn answer(&mut self, arrived: Arrived) {
        if let Some(w) = self.waiting.take() {
            encode_frame(&w.respond(arrived), &mut self.out);
        }
    }

    /// Gives up the pending request without answering it, for the
    /// connection's end: see `Service::abandon`.
    pub fn take_waiting(&mut self) -> Option<Pending> {
        self.waiting.take().map(|w| w.answer)
    }

    /// Answers everything accepted and unanswered without executing it: the
    /// waiting Lock gets its outcome if one already arrived, else `status`;
    /// parked requests get `status`, bodies that do not decode get General,
    /// and an oversize frame gets its FrameTooLarge. Bytes not yet accepted
    /// are dropped, as if never read.
    pub fn abandon(&mut self, status: ResponseStatus, text: &str) {
        if let Some(mut w) = self.waiting.take() {
            w.answer.close();
            let response = match w.answer.try_take() {
                Ok(Some(arrived)) => w.respond(arrived),
                Ok(None) | Err(Dropped) => reply::error(w.request_id, status, text),
            };
            encode_frame(&response, &mut self.out);
        }
        while self.frames > 0 {
            let response = match self.pop_request() {
                Ok(req) => reply::error(req.id, status, text),
                Err(e) => reply::undecodable(&e),
            };
            encode_frame(&response, &mut self.out);
        }
        self.answer_too_large();
        self.input.clear();
        self.scanned = 0;
    }

    /// Encoded responses waiting to be written.
    pub fn output(&self) -> &[u8] {
        &self.out
    }

    /// All of [`Pipeline::output`] has been written.
    pub fn written(&mut self) {
        self.out.clear();
    }

    /// Frees buffers that hold nothing, before the connection waits: an
    /// idle connection then costs no buffer memory, and the next read or
    /// answer takes a fresh one (an allocation is cheap next to the system
    /// call that comes with it).
    pub fn trim(&mut self) {
        if self.input.is_empty() && self.input.capacity() > 0 {
            self.input = BytesMut::new();
        } else if self.input.len() <= MIN_READ && self.input.capacity() > 4 * MIN_READ {
            // The start of a frame left behind by a large read: keep those
            // bytes, not the whole read's allocation.
            self.input = BytesMut::from(&self.input[..]);
        }
        if self.out.is_empty() && self.out.capacity() > 0 {
            self.out = BytesMut::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::acl::Access;
    use crate::ops::config::Config;
    use crate::service::Connected;
    use clap::Parser;
    use dlock_proto::proto::{RequestType, Response};
    use std::net::{Ipv4Addr, SocketAddr};

    struct Fixture {
        service: Arc<Service>,
        config: Config,
    }

    impl Fixture {
        fn new(flags: &[&str]) -> Self {
            let config = Config::try_parse_from(
                std::iter::once("dlock-server").chain(flags.iter().copied()),
            )
            .expect("flags parse");
            Fixture {
                service: Service::local(config.clone(), Access::default(), 1),
                config,
            }
        }

        fn connect(&self) -> Connected {
            self.service.connect(peer(), Vec::new())
        }

        fn execute(&self, p: &mut Pipeline, conn: &Connected) {
            p.execute(&self.service, conn.conn());
        }

        fn pipeline(&self) -> Pipeline {
            Pipeline::new(self.config.max_frame, self.config.max_pipeline)
        }
    }

    fn request(id: u64, kind: RequestType, keys: &[&str]) -> Request {
        Request {
            version: 2,
            id,
            r#type: kind as i32,
            lock: (!keys.is_empty()).then(|| dlock_proto::proto::RequestLock {
                keys: keys.iter().map(|k| k.to_string()).collect(),
                ..Default::default()
            }),
            ..Request::default()
        }
    }

    fn pings(n: u64) -> BytesMut {
        let mut wire = BytesMut::new();
        for id in 1..=n {
            encode_frame(&request(id, RequestType::Ping, &[]), &mut wire);
        }
        wire
    }

    /// Feeds `wire` through reads of whatever size the pipeline offers;
    /// returns the sizes offered.
    fn feed(p: &mut Pipeline, wire: &mut BytesMut) -> Vec<usize> {
        let mut offered = Vec::new();
        while !wire.is_empty() && p.can_read() {
            p.read_with(|buf| {
                offered.push(buf.remaining_mut());
                let n = buf.remaining_mut().min(wire.len());
                buf.put_slice(&wire[..n]);
                wire.advance(n);
                Ok(n)
            })
            .expect("reads from memory do not fail");
        }
        offered
    }

    fn responses(p: &mut Pipeline) -> Vec<Response> {
        let mut out = BytesMut::from(p.output());
        p.written();
        let mut codec = dlock_proto::codec::FrameCodec::new(dlock_proto::MAX_RESPONSE_FRAME);
        let mut all = Vec::new();
        while let Some(body) =
            tokio_util::codec::Decoder::decode(&mut codec, &mut out).expect("frames")
        {
            all.push(Response::decode(body).expect("a Response"));
        }
        all
    }

    fn peer() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 1))
    }

    /// Reads and runs `wire` to the end; returns the read sizes offered and
    /// the responses.
    fn run_all(
        f: &Fixture,
        owner: &Connected,
        p: &mut Pipeline,
        wire: &mut BytesMut,
    ) -> (Vec<usize>, Vec<Response>) {
        let (mut offered, mut answers) = (Vec::new(), Vec::new());
        loop {
            offered.extend(feed(p, wire));
            f.execute(p, owner);
            answers.extend(responses(p));
            if wire.is_empty() && p.unanswered() == 0 {
                return (offered, answers);
            }
        }
    }

    #[test]
    fn a_burst_is_read_in_growing_bites_not_frame_by_frame() {
        let f = Fixture::new(&["--max-pipeline", "100000"]);
        let owner = f.connect();
        let mut p = f.pipeline();
        let mut wire = pings(20_000);
        let (offered, answers) = run_all(&f, &owner, &mut p, &mut wire);
        let ids: Vec<u64> = answers.iter().map(|r| r.request_id).collect();
        assert_eq!(ids, (1..=20_000).collect::<Vec<_>>());
        // About 200 KB: reads start small, grow, never pass the maximum.
        assert_eq!(offered[0], MIN_READ);
        assert!(offered.iter().all(|&n| n <= MAX_READ));
        assert!(
            offered.iter().any(|&n| n > MIN_READ),
            "reads grew: {offered:?}"
        );
        assert!(
            offered.len() < 100,
            "{} reads for 20,000 frames",
            offered.len()
        );
    }

    #[test]
    fn frames_behind_a_waiting_lock_are_parked_up_to_the_limit_and_answered_in_order() {
        let f = Fixture::new(&["--max-pipeline", "4"]);
        let holder = f.connect();
        let mut h = f.pipeline();
        let mut wire = BytesMut::new();
        encode_frame(&request(1, RequestType::Lock, &["k"]), &mut wire);
        let (_, r) = run_all(&f, &holder, &mut h, &mut wire);
        assert_eq!(r[0].status, ResponseStatus::Ok as i32);

        let owner = f.connect();
        let mut p = f.pipeline();
        let mut wire = BytesMut::new();
        encode_frame(&request(10, RequestType::Lock, &["k"]), &mut wire);
        for id in 11..20 {
            encode_frame(&request(id, RequestType::Ping, &[]), &mut wire);
        }
        feed(&mut p, &mut wire);
        f.execute(&mut p, &owner);
        feed(&mut p, &mut wire);
        // The Lock waits and three Pings are parked: the limit of 4 is
        // reached, and the rest is not accepted.
        assert_eq!(p.unanswered(), 4);
        assert!(!p.can_read());
        assert!(responses(&mut p).is_empty());

        let mut unlock = BytesMut::new();
        encode_frame(&request(2, RequestType::Unlock, &["k"]), &mut unlock);
        run_all(&f, &holder, &mut h, &mut unlock);
        let outcome = p.waiting().expect("the Lock waits").try_take();
        p.answer(outcome.ok().flatten().expect("granted on the unlock"));
        let (_, answers) = run_all(&f, &owner, &mut p, &mut wire);
        let ids: Vec<u64> = answers.iter().map(|r| r.request_id).collect();
        assert_eq!(ids, (10..20).collect::<Vec<_>>());
        assert_eq!(answers[0].status, ResponseStatus::Ok as i32);
    }

    #[test]
    fn output_is_written_in_bounded_pieces() {
        // Large frames allowed, so 150 KB of requests can be parked at once.
        let f = Fixture::new(&[
            "--max-pipeline",
            "100000",
            "--max-key-len",
            "1000",
            "--max-frame",
            "65536",
        ]);
        let owner = f.connect();
        let mut p = f.pipeline();
        let key = "k".repeat(1000);
        let mut wire = BytesMut::new();
        for id in 1..=150 {
            encode_frame(&request(id, RequestType::Inspect, &[&key]), &mut wire);
        }
        // Each answer echoes the 1000-byte key: 150 KB of output for one
        // client, written in pieces of about the high-water mark.
        let (mut largest, mut answered, mut paused) = (0, 0, 0);
        while !(wire.is_empty() && p.unanswered() == 0) {
            feed(&mut p, &mut wire);
            f.execute(&mut p, &owner);
            largest = largest.max(p.output().len());
            paused += usize::from(p.runnable());
            answered += responses(&mut p).len();
        }
        assert_eq!(answered, 150);
        assert!(paused > 0, "execution never paused for the output");
        assert!(
            largest < OUT_HIGH_WATER + 2 * 1024,
            "{largest} bytes of output at once"
        );
    }

    #[test]
    fn a_pipeline_limit_of_one_still_answers_everything() {
        let f = Fixture::new(&["--max-pipeline", "1"]);
        let holder = f.connect();
        let mut h = f.pipeline();
        let mut wire = BytesMut::new();
        encode_frame(&request(1, RequestType::Lock, &["k"]), &mut wire);
        run_all(&f, &holder, &mut h, &mut wire);
        // An Inspect naming the held key 256 times: about 0.8 KB asking for
        // 5 KB of answer. 36 of them arrive in reads of 4, 8 and then about
        // 16 KB (reads grow while they fill up), and the answers to the last
        // read's 21 requests pass the output limit with requests left over.
        let owner = f.connect();
        let mut p = f.pipeline();
        let keys = vec!["k"; 256];
        let mut wire = BytesMut::new();
        for id in 1..=36 {
            encode_frame(&request(id, RequestType::Inspect, &keys), &mut wire);
        }
        let mut answered = 0;
        // The connection's loop: run, write, go on while runnable, else
        // read; with nothing left to read it would wait for the client, so
        // everything sent must have been answered by then.
        for _ in 0..10_000 {
            f.execute(&mut p, &owner);
            answered += responses(&mut p).len();
            if p.runnable() {
                continue;
            }
            if wire.is_empty() {
                break;
            }
            assert!(p.can_read(), "nothing runnable and nothing may be read");
            feed(&mut p, &mut wire);
        }
        assert_eq!(answered, 36);
    }

    #[test]
    fn a_read_that_finds_nothing_keeps_no_buffer() {
        let f = Fixture::new(&[]);
        let mut p = f.pipeline();
        let got = p.read_with(|_| Err(io::ErrorKind::WouldBlock.into()));
        assert!(got.is_err());
        assert_eq!(p.input.capacity(), 0);
    }

    #[test]
    fn trim_keeps_a_partial_frame_but_not_the_large_read_around_it() {
        let f = Fixture::new(&[]);
        let owner = f.connect();
        let mut p = f.pipeline();
        let mut wire = pings(3_000);
        wire.put_slice(&[0, 0, 0, 9, 1, 2]);
        while !wire.is_empty() {
            feed(&mut p, &mut wire);
            f.execute(&mut p, &owner);
            responses(&mut p);
        }
        assert_eq!(p.input.len(), 6);
        p.trim();
        assert_eq!(&p.input[..], &[0, 0, 0, 9, 1, 2]);
        assert!(p.input.capacity() < MIN_READ, "{}", p.input.capacity());
    }

    #[test]
    fn an_oversize_length_is_answered_after_the_frames_before_it() {
        let f = Fixture::new(&["--max-frame", "64"]);
        let owner = f.connect();
        let mut p = f.pipeline();
        let mut wire = pings(2);
        wire.put_u32(65);
        wire.put_slice(&[0; 10]);
        feed(&mut p, &mut wire);
        assert!(p.broken() && !p.can_read());
        f.execute(&mut p, &owner);
        let r = responses(&mut p);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].request_id, r[1].request_id), (1, 2));
        assert_eq!(r[2].status, ResponseStatus::FrameTooLarge as i32);
        // Answered once, even if the connection abandons what is left.
        p.abandon(ResponseStatus::ShuttingDown, "bye");
        assert!(responses(&mut p).is_empty());
    }

    #[test]
    fn trim_frees_empty_buffers() {
        let f = Fixture::new(&[]);
        let owner = f.connect();
        let mut p = f.pipeline();
        let mut wire = pings(3);
        feed(&mut p, &mut wire);
        f.execute(&mut p, &owner);
        assert_eq!(responses(&mut p).len(), 3);
        p.trim();
        assert_eq!((p.input.capacity(), p.out.capacity()), (0, 0));
    }
}
