// The connection under a Client: pipelined requests, answers matched in
// order, pings, and on a cluster the session that outlives each stream.
// Mirrors clients/go/link.go (and src/link.rs of the Rust library).
//
// Every request is framed and written at once; the frames written in one
// turn of the event loop leave in one write. The server answers in order,
// so each answer belongs to the oldest unanswered request; an answer out of
// order ends the stream. At most maxInFlight requests are unanswered at
// once, which bounds what is buffered here; further calls wait for a slot.
//
// Against a single server the link ends with its stream: every pending call
// fails, and so does every later one, since the server released the locks
// bound to the connection. Against a cluster the link names its session in
// every request that acts for an owner and numbers those that change the
// table (seq, seq_done). When the stream breaks, a node answers NotLeader or
// Unavailable, a request that should be answered at once is not, the node's
// probe finds it silent (liveness.ts) and the stream too has heard nothing
// from it for the silence limit (goneSilent), or has not by a limit after
// it last heard while the probe has had no answer since, or the probe is
// answered Unavailable, the stream is reset
// (never closed with a FIN, which would end the session), the leader is
// looked for, the session resumed there and the requests not answered are
// sent again, in order and under their first numbers.
//
// `fresh` is the send time of the last request whose answer proves the
// owner alive: the input of the client-side safety rule (lock.ts). On a
// single server any answer does; on a cluster only answers from commands
// that kept the session alive (movesDeadline). The rules the link follows
// are the pure functions of rules.ts.

import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";
import type { RequestLock, Response } from "./gen/dlock_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RequestLockSchema } from "./gen/dlock_pb.js";
import { ConnectionLostError, FrameTooLargeError, errorOf } from "./errors.js";
import { PROTOCOL_VERSION, encodeFrame } from "./framing.js";
import type { FrameConn, RequestInit } from "./framing.js";
import type { Dialer, Established } from "./dial.js";
import { silenceLimit, watchNode } from "./liveness.js";
import type { NodeWatch, Watched } from "./liveness.js";
import {
  elsewhere,
  goneSilent,
  millis,
  mayWait,
  movesDeadline,
  nanos,
  sessionLivesUntil,
  sessionUse,
  unansweredTooLong,
} from "./rules.js";
import { now } from "./types.js";
import type { Limits } from "./types.js";

export type Body = MessageInitShape<typeof RequestLockSchema> | RequestLock | undefined;

/** A request written (or, while the session moves, to be written) and not yet answered. */
interface Pending {
  id: bigint;
  kind: RequestType;
  /** When it was (last) written: once it is answered, the server had the owner alive no earlier than this. */
  sent: number;
  resolve?: (resp: Response) => void;
  reject?: (err: Error) => void;
  /** Taken off the queue (answered, or failed with the link). */
  answered: boolean;
  /** The caller stopped waiting (its signal aborted). */
  abandoned: boolean;
  counted: boolean;
  /** Of a Lock, Enqueue or Wait: a grant nobody collects is released. */
  lockKeys?: string[];
  /** Of a request given up: called once it holds and waits for nothing of the link's owner any more. */
  settled?: () => void;
  /** A Ping of the link's own (no caller). */
  tick: boolean;
  /** Its number in the session; 0 if it changes nothing or there is none. */
  seq: bigint;
  /** The request as written, to send again after a reconnect; null against a single server, which never resumes. */
  frame: Buffer | null;
  /** The ticket a Wait collects. */
  ticket: bigint;
}

/** What a call that claims keys (client.ts) needs to know. */
export interface CallOptions {
  /** Gives the call up: it rejects with the signal's reason at once, and a grant that arrives later for lockKeys is released. */
  signal?: AbortSignal;
  /** Of a Lock, Enqueue or Wait: a grant nobody collects is released. */
  lockKeys?: string[];
  /** Called as soon as the request is queued, before its answer: whatever is sent later is acted on after it. */
  queued?: () => void;
  /**
   * Called once, unless the answer is a success, when the request queued
   * holds and waits for nothing of the link's owner: refused, failed with
   * the link, or given up and then refused, its late grant's release
   * queued, or the link ended. (An Enqueue given up and answered Queued
   * never settles.)
   */
  settled?: () => void;
  /** Takes a slot of maxInFlight (default true). */
  counted?: boolean;
}

/**
 * Whether an answer with `status` to a request of type `kind` comes, on a
 * cluster, from a command committed for the session (which kept it alive):
 * rules.movesDeadline on a session. A refusal (NotLeader from a deposed
 * leader, Unavailable, ...), an Inspect or a Wait (read, not committed)
 * proves nothing: counting it would keep a lock "held" here after the
 * cluster gave it away.
 */
export function keepsSessionAlive(kind: RequestType, status: ResponseStatus): boolean {
  return movesDeadline(true, kind, status);
}

export class Link implements Watched {
  readonly dialer: Dialer;
  readonly quiet: boolean;
  /** A Lock's (or Enqueue's) connection of its own. */
  forLock = false;
  readonly limits: Limits;
  readonly session: bigint;
  private readonly maxInFlight: number;
  private inFlight = 0;
  private slotWaiters: { resolve: () => void; reject: (e: Error) => void }[] = [];
  /** How long the node's probe may go unanswered (on a session). */
  private readonly silence: number = 0;
  addr = "";
  private cur: FrameConn | null = null;
  /** When the stream last read a frame from its node (or was attached): a probe's silence report leaves a link that heard within the limit. */
  private heard = 0;
  /**
   * Set while the stream outlives a probe's silence report (it had heard
   * within the limit): how many answers the probe had had then, and since
   * when the probe had heard nothing.
   */
  private suspect: { answered: number; silentSince: number } | null = null;
  /** While suspect: the look, a limit after the stream last heard, at whether it has gone silent too. */
  private recheckTimer: NodeJS.Timeout | null = null;
  private pend: Pending[] = [];
  private numberedSeqs: bigint[] = [];
  /**
   * The ticket of each Enqueue answered Queued whose Wait has not been
   * answered, and its number: seq_done stays below it, so that after a
   * failover the new leader still remembers an outcome decided before it.
   */
  private queuedTickets = new Map<bigint, bigint>();
  private nextId = 0n;
  private nextSeq = 1n;
  private pingsOut = 0;
  private lastSend: number;
  /** The send time of the last request whose answer proves the owner alive. */
  fresh: number;
  err: Error | null = null;
  private watch: NodeWatch | null = null;
  /** A Lock's connection of its own given up, or the client's closed (drain): `late` is told of a grant that still arrives, and a call made meanwhile is rejected with `gone`. */
  private draining = false;
  private late?: (keys: string[], fence: bigint) => void;
  private gone: Error | null = null;
  /** Told once when the link ends. */
  onEnd: (err: Error, closing: boolean) => void = () => {};
  /** Aborted, with the error, when the link ends. */
  readonly ended = new AbortController();
  private tickTimer: NodeJS.Timeout | null = null;
  private closing: Promise<void> = Promise.resolve();

  private constructor(dialer: Dialer, est: Established, maxInFlight: number, quiet: boolean) {
    this.dialer = dialer;
    this.quiet = quiet;
    this.limits = est.limits;
    this.session = est.session;
    this.maxInFlight = maxInFlight;
    this.lastSend = est.ackedFrom;
    this.fresh = est.ackedFrom;
    if (this.session !== 0n) this.silence = silenceLimit(est.limits.electionTimeout, est.limits.sessionTimeout);
    this.attach(est);
    this.tick();
  }

  /** Connects (on a cluster: to the leader, with a new session). afterClose: as Dialer.establish's. */
  static async open(dialer: Dialer, maxInFlight: number, quiet: boolean, signal?: AbortSignal, afterClose = false): Promise<Link> {
    const est = await dialer.establish(0n, now() + dialer.connectTimeout, false, "", "", signal, afterClose);
    if (signal?.aborted) {
      est.conn.reset();
      signal.throwIfAborted();
    }
    if (!(maxInFlight > 0)) maxInFlight = 256;
    // Past max_pipeline the server stops reading: more in flight only buffers here.
    if (est.limits.maxPipeline > 0) maxInFlight = Math.min(maxInFlight, est.limits.maxPipeline);
    return new Link(dialer, est, maxInFlight, quiet);
  }

  /**
   * The node's probe found it silent, or answering Unavailable
   * (`cannotServe`). Unavailable: leave it, whatever the link heard (the
   * node said it cannot serve). Silent: leave it if the link has heard
   * nothing from it for the silence limit either. A link that heard from
   * the node within the limit stays, since the probe's own connection may
   * have been slow (a new leader flooded with resumes), not the node; but
   * the node may also have stalled just after the link last heard, and the
   * probe's next report comes a pause and a limit later: so the link looks
   * again a limit after it last heard (recheck). As Driver::run in
   * src/link.rs.
   */
  nodeSilent(addr: string, waited: number, cannotServe: boolean): void {
    if (this.err !== null || this.cur === null || this.watch === null || this.addr !== addr) return;
    if (cannotServe) {
      this.fail(`${addr} answered its probe Unavailable: it cannot serve`, undefined, "", addr);
      return;
    }
    const t = now();
    if (goneSilent(nanos(this.heard), nanos(t), nanos(this.silence))) {
      this.breakSilent(waited, t);
      return;
    }
    // It stays, suspecting the node until the probe is answered again; a
    // later report re-bases that on the probe's answers then.
    this.suspect = { answered: this.watch.answered, silentSince: t - waited };
    this.armRecheck();
  }

  /**
   * While suspect, a limit after the stream last heard: if the probe has
   * been answered since the report, the node answers again and the link
   * stops suspecting it; else if the stream has heard nothing for the limit
   * either, it leaves as on a silence report; else it heard meanwhile, and
   * looks again a limit after that.
   */
  private recheck(): void {
    this.recheckTimer = null;
    const s = this.suspect;
    if (s === null || this.err !== null || this.cur === null || this.watch === null) return;
    if (this.watch.answered !== s.answered) {
      this.suspect = null;
      return;
    }
    const t = now();
    if (goneSilent(nanos(this.heard), nanos(t), nanos(this.silence))) {
      this.breakSilent(t - s.silentSince, t);
      return;
    }
    this.armRecheck();
  }

  /**
   * Sets the recheck a limit after the stream last heard. Moved when the
   * timer fires, not on every frame read: a frame costs no timer.
   */
  private armRecheck(): void {
    if (this.recheckTimer !== null) clearTimeout(this.recheckTimer);
    // At least 1 ms: a timer that fires a little early (the clock's
    // rounding) looks again just after, without spinning.
    this.recheckTimer = setTimeout(() => this.recheck(), Math.max(1, this.heard + this.silence - now()));
    // No process waits for it: the link's socket keeps it alive.
    this.recheckTimer.unref();
  }

  /** Leaves a node whose probe went unanswered for `probeWaited` ms and whose stream has heard nothing for the limit either. */
  private breakSilent(probeWaited: number, t: number): void {
    this.fail(
      `${this.addr} did not answer its probe for ${Math.round(probeWaited)} ms, nor this connection for ${Math.round(t - this.heard)} ms`,
      undefined,
      "",
      this.addr,
    );
  }

  /** Makes `est` the link's stream. */
  private attach(est: Established): void {
    const conn = est.conn;
    this.cur = conn;
    this.addr = est.addr;
    // Counted from the attach: the handshake just heard from the node.
    this.heard = now();
    conn.onFrame = (resp) => {
      // Any frame, whatever it answers, shows the node alive on this stream.
      this.heard = now();
      this.onResponse(conn, resp);
    };
    conn.onFail = (err) => this.streamFailed(conn, `the connection to ${est.addr} failed`, err);
    if (this.session !== 0n) this.watch = watchNode(this.dialer, est.addr, this.silence, this);
    for (const r of conn.takeEarly()) this.onResponse(conn, r);
    if (conn.failure !== null) this.streamFailed(conn, `the connection to ${est.addr} failed`, conn.failure);
  }

  /** Takes the stream away from the link: reset, or with `clean` closed after what is written. */
  private detach(clean: boolean): void {
    const s = this.cur;
    if (s === null) return;
    this.cur = null;
    s.onFrame = null;
    s.onFail = null;
    this.watch?.unsubscribe(this);
    this.watch = null;
    // The suspicion was of this stream's node: none outlives the stream.
    this.suspect = null;
    if (this.recheckTimer !== null) {
      clearTimeout(this.recheckTimer);
      this.recheckTimer = null;
    }
    if (clean) {
      // A clean close: on a cluster the node ends the session at once.
      this.closing = s.close();
    } else {
      s.reset();
    }
  }

  /** s is of no more use (if it is still the link's). */
  private streamFailed(s: FrameConn, reason: string, err: Error): void {
    if (this.cur !== s || this.err !== null) return;
    this.fail(reason, err, "", "");
  }

  /** Moves the session to the leader (prefer: a leader a node named; avoid: a node found silent), or without a session ends the link. */
  private fail(reason: string, err: Error | undefined, prefer: string, avoid: string): void {
    if (this.session === 0n || this.draining) {
      this.end(new ConnectionLostError(reason, err), false);
      return;
    }
    const from = this.addr;
    this.detach(false);
    if (err !== undefined) reason = `${reason}: ${err.message}`;
    if (!this.quiet) this.dialer.event({ kind: "reconnecting", addr: from, session: this.session, reason });
    void this.resume(reason, prefer, avoid);
  }

  private async resume(reason: string, prefer: string, avoid: string): Promise<void> {
    const broke = now();
    // Past this no node knows the session. (Locks enforce the safety
    // deadline apart.)
    const deadline = millis(sessionLivesUntil(nanos(this.fresh), nanos(broke), nanos(this.limits.sessionTimeout)));
    let est: Established;
    try {
      est = await this.dialer.establish(this.session, deadline, true, prefer, avoid, this.ended.signal);
    } catch (e) {
      if (this.err !== null) return;
      const lost =
        e instanceof ConnectionLostError
          ? e
          : new ConnectionLostError(`session ${this.session} not resumed after ${reason}`, e);
      this.end(lost, false);
      return;
    }
    if (this.err !== null) {
      est.conn.reset();
      return;
    }
    if (est.ackedFrom > this.fresh) this.fresh = est.ackedFrom;
    this.attach(est);
    // Everything not answered, first, in order, under its first number: its
    // answer will come from this stream. (Sent while the session moved, it
    // was only queued.)
    const t = now();
    for (const p of this.pend) {
      if (p.frame !== null && this.cur !== null) {
        this.cur.write(p.frame);
        p.sent = t;
      }
    }
    if (!this.quiet) this.dialer.event({ kind: "resumed", addr: est.addr, session: this.session, after: t - broke });
    this.tick();
  }

  /** Takes one answer off the queue. */
  private onResponse(s: FrameConn, resp: Response): void {
    if (this.cur !== s || this.err !== null) return;
    const head = this.pend[0];
    if (head === undefined || head.id !== resp.requestId) {
      // An answer to nothing: the server turned the connection away
      // (request_id 0: too many connections, frame too large) or broke
      // ordering.
      let reason = `${s === null ? "" : this.addr} answered request ${resp.requestId}, which was not the next one due`;
      let err: Error | undefined;
      if (resp.requestId === 0n && resp.status !== ResponseStatus.Ok) {
        err = errorOf(RequestType.Invalid, resp) ?? undefined;
        reason = `${this.addr} turned the connection away`;
      }
      this.fail(reason, err, "", "");
      return;
    }
    if (this.session !== 0n) {
      // Answers that send the session elsewhere leave the request in
      // place, to be sent again there.
      const away = elsewhere(resp.status, resp.leaderAddr || null);
      switch (away?.means) {
        case "session_ended":
          this.end(
            new ConnectionLostError(
              `session ${this.session} has ended (${resp.errorText}): its locks without a lease may be another's`,
              errorOf(head.kind, resp),
            ),
            false,
          );
          return;
        case "not_leader":
          if (resp.status === ResponseStatus.ShuttingDown) {
            // The node is stopping (a rolling restart) and did nothing: as
            // NotLeader naming no leader, and the node is tried last. The
            // session goes on at the next leader, where what is unanswered
            // is sent again under its number.
            this.fail(`${this.addr} is shutting down`, undefined, "", this.addr);
          } else {
            this.fail(`${this.addr} stopped leading`, undefined, away.leader ?? "", "");
          }
          return;
        case "no_quorum":
          this.fail(`${this.addr} could not commit in time (Unavailable)`, undefined, "", "");
          return;
      }
    }
    const p = head;
    this.pend.shift();
    p.answered = true;
    if (p.seq !== 0n && this.numberedSeqs.length > 0) this.numberedSeqs.shift();
    if (p.kind === RequestType.Enqueue && resp.status === ResponseStatus.Queued && p.seq !== 0n) {
      this.queuedTickets.set(resp.ticket, p.seq);
    } else if (p.kind === RequestType.Wait) {
      this.queuedTickets.delete(p.ticket);
    }
    if (p.counted) this.releaseSlot();
    if (movesDeadline(this.session !== 0n, p.kind, resp.status)) {
      if (p.sent > this.fresh) this.fresh = p.sent;
    }
    if (p.tick) this.pingsOut--;
    if (p.abandoned) {
      if (p.lockKeys !== undefined && resp.status === ResponseStatus.Ok && resp.fence !== 0n) {
        if (this.draining) {
          // The grant crossed the half-close: released elsewhere.
          const late = this.late;
          const keys = p.lockKeys;
          const fence = resp.fence;
          if (late !== undefined) queueMicrotask(() => late(keys, fence));
        } else {
          // The caller stopped waiting: release what it was granted.
          this.detached(RequestType.Unlock, { keys: p.lockKeys, fence: resp.fence });
        }
      }
      // An Enqueue answered Queued still waits in line, and nobody will
      // collect it: its keys stay the owner's (until the link ends).
      if (p.settled !== undefined && !(p.kind === RequestType.Enqueue && resp.status === ResponseStatus.Queued)) {
        p.settled();
      }
    } else {
      p.resolve?.(resp);
    }
  }

  /**
   * Ends the link once: fails what is pending, then tells onEnd. clean: the
   * client closes it with a FIN (a cluster node ends the session at once and
   * releases its locks); otherwise it is reset.
   */
  end(err: Error, clean: boolean): void {
    if (this.err !== null) return;
    this.err = err;
    this.detach(clean);
    if (this.tickTimer !== null) {
      clearTimeout(this.tickTimer);
      this.tickTimer = null;
    }
    const waiters = this.slotWaiters;
    this.slotWaiters = [];
    for (const w of waiters) w.reject(err);
    const pend = this.pend;
    this.pend = [];
    this.numberedSeqs = [];
    for (const p of pend) {
      p.answered = true;
      if (p.counted) this.inFlight--;
      if (!p.abandoned) p.reject?.(err);
      else p.settled?.();
    }
    this.ended.abort(err);
    const onEnd = this.onEnd;
    queueMicrotask(() => onEnd(err, clean));
  }

  /**
   * Gives up a Lock's connection of its own whose Lock waits, or the
   * client's connection as the client is closed: once what is written has
   * gone, the connection is half-closed. The server then
   * withdraws the request (on a cluster, ends the session) and closes its
   * side; a grant it sent before is still read, and `late` is told of it
   * (the connection cannot release it any more: a lease outlives it). After
   * `bound` ms the connection is closed whatever happened.
   *
   * `fail` (the client is closed): every caller still waiting on the link
   * (for a Lock, Enqueue or Wait, or any other answer) is rejected with it
   * at once, as a closed link would reject it, and so is a call made later;
   * an answer, a grant too, then goes to `late`.
   */
  drain(late: (keys: string[], fence: bigint) => void, bound: number, fail?: Error): void {
    if (this.err !== null || this.draining) return;
    const gone = fail ?? new ConnectionLostError("withdrawn");
    if (fail !== undefined) {
      for (const p of this.pend) {
        if (p.reject !== undefined && !p.answered && !p.abandoned) {
          p.abandoned = true;
          p.reject(fail);
        }
      }
    }
    this.draining = true;
    this.late = late;
    this.gone = gone;
    if (this.cur === null) {
      // The session is moving: end it cleanly instead.
      this.end(gone, true);
      return;
    }
    this.cur.end();
    const t = setTimeout(() => this.end(gone, true), bound);
    t.unref();
  }

  /** Ends the link cleanly: what is written still goes; resolves when the socket has closed. */
  close(reason: string): Promise<void> {
    this.end(new ConnectionLostError(reason), true);
    return this.closing;
  }

  /** Queues one request; its answer goes to p.resolve. Throws FrameTooLargeError for a request over the server's max_frame (not sent). */
  private send(kind: RequestType, body: Body, p: Pending): void {
    const req: RequestInit = {
      version: PROTOCOL_VERSION,
      id: this.nextId + 1n,
      accessToken: this.dialer.token,
      type: kind,
      lock: body,
    };
    let seq = 0n;
    const use = sessionUse(kind);
    if (this.session !== 0n) {
      // An Inspect without keys asks for server counts, no owner's.
      const namesKeys = (body?.keys?.length ?? 0) > 0;
      if (use.actsForSession && (use.numbered || namesKeys || kind === RequestType.Wait)) {
        req.session = this.session;
      }
      if (use.numbered) {
        seq = this.nextSeq;
        req.seq = seq;
        let below = this.numberedSeqs.length > 0 ? this.numberedSeqs[0] : seq;
        for (const s of this.queuedTickets.values()) if (s < below) below = s;
        req.seqDone = below - 1n;
      }
    }
    const frame = encodeFrame(req);
    const max = this.limits.maxFrame;
    if (max > 0 && frame.length - 4 > max) {
      // The server would answer FrameTooLarge and close the connection,
      // taking every lock on it along: refuse here instead.
      throw new FrameTooLargeError(
        kind,
        ResponseStatus.FrameTooLarge,
        `request of ${frame.length - 4} bytes is over the server's max_frame of ${max} (not sent)`,
      );
    }
    this.nextId++;
    if (seq !== 0n) {
      this.nextSeq++;
      this.numberedSeqs.push(seq);
    }
    const t = now();
    p.id = req.id as bigint;
    p.kind = kind;
    p.sent = t;
    p.seq = seq;
    if (kind === RequestType.Wait) p.ticket = (body?.ticket as bigint | undefined) ?? 0n;
    if (this.session !== 0n) p.frame = frame;
    this.pend.push(p);
    if (this.session === 0n || kind === RequestType.Ping || use.numbered) {
      // On a cluster an Inspect keeps nothing alive that the client could
      // prove: a Ping is still due.
      this.lastSend = t;
    }
    // While the session moves it is sent with the rest once resumed.
    this.cur?.write(frame);
  }

  private newPending(o: CallOptions): Pending {
    return {
      id: 0n,
      kind: RequestType.Invalid,
      sent: 0,
      answered: false,
      abandoned: false,
      counted: o.counted !== false,
      lockKeys: o.lockKeys,
      settled: o.settled,
      tick: false,
      seq: 0n,
      frame: null,
      ticket: 0n,
    };
  }

  private acquireSlot(signal?: AbortSignal): Promise<void> | undefined {
    if (this.inFlight < this.maxInFlight && this.slotWaiters.length === 0) {
      this.inFlight++;
      return undefined;
    }
    return new Promise((resolve, reject) => {
      const w = {
        resolve: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        },
        reject: (e: Error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        const i = this.slotWaiters.indexOf(w);
        if (i >= 0) this.slotWaiters.splice(i, 1);
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.slotWaiters.push(w);
    });
  }

  private releaseSlot(): void {
    const next = this.slotWaiters.shift();
    if (next !== undefined) next.resolve(); // the slot passes on
    else this.inFlight--;
  }

  /**
   * Sends one request and waits for its answer; a refusal is thrown as its
   * ServerError (the answer is on the error's `response`). If the signal
   * aborts first, the call rejects with its reason at once and a grant that
   * arrives later for lockKeys is released.
   */
  async call(kind: RequestType, body: Body, o: CallOptions = {}): Promise<Response> {
    if (this.err !== null) throw this.err;
    if (this.gone !== null) throw this.gone;
    const signal = o.signal;
    signal?.throwIfAborted();
    if (o.counted !== false) {
      const wait = this.acquireSlot(signal);
      if (wait !== undefined) await wait;
    }
    const p = this.newPending(o);
    const answer = new Promise<Response>((resolve, reject) => {
      p.resolve = resolve;
      p.reject = reject;
    });
    if (this.err !== null || this.gone !== null || signal?.aborted) {
      if (p.counted) this.releaseSlot();
      throw this.err ?? this.gone ?? signal?.reason;
    }
    try {
      this.send(kind, body, p);
    } catch (e) {
      if (p.counted) this.releaseSlot();
      throw e;
    }
    o.queued?.();
    let resp: Response;
    if (signal === undefined) {
      try {
        resp = await answer;
      } catch (e) {
        o.settled?.();
        throw e;
      }
    } else {
      let onAbort: (() => void) | undefined;
      const given = new Promise<never>((_, reject) => {
        onAbort = () => {
          // An answer already in wins: the caller gets it.
          if (p.answered) return;
          // The answer (or the link's end) settles it.
          p.abandoned = true;
          reject(signal.reason);
        };
        signal.addEventListener("abort", onAbort, { once: true });
      });
      given.catch(() => {});
      try {
        resp = await Promise.race([answer, given]);
      } catch (e) {
        if (!p.abandoned) o.settled?.();
        throw e;
      } finally {
        signal.removeEventListener("abort", onAbort as () => void);
      }
    }
    const err = errorOf(kind, resp);
    if (err !== null) {
      o.settled?.();
      throw err;
    }
    return resp;
  }

  /**
   * Sends a request whose answer nobody reads (best effort); false if the
   * link has ended or drains, and sends nothing. (On a cluster, while the
   * session moves, the request is queued and sent once it is resumed.)
   */
  detached(kind: RequestType, body: Body): boolean {
    if (this.err !== null || this.draining) return false;
    try {
      this.send(kind, body, this.newPending({ counted: false }));
    } catch {
      // too large to send: nothing to release then
    }
    return true;
  }

  /** Whether a caller waits for the answer to a Lock, Enqueue or Wait on the link (one whose grant may cross its close). */
  get waiting(): boolean {
    return this.pend.some((p) => this.awaited(p));
  }

  private awaited(p: Pending): boolean {
    return p.lockKeys !== undefined && p.reject !== undefined && !p.answered && !p.abandoned;
  }

  /** Pending answers (for tests). */
  get pending(): number {
    return this.pend.length;
  }

  /**
   * Sends a Ping whenever nothing was sent for a quarter of the session
   * timeout, and on a session leaves a node that leaves a request that
   * should be answered at once unanswered for half the TTL
   * (unansweredTooLong; the probe, liveness.ts, notices a silent node long
   * before).
   */
  private tick(): void {
    if (this.tickTimer !== null) clearTimeout(this.tickTimer);
    this.tickTimer = null;
    if (this.err !== null) return;
    const interval = Math.max(this.limits.sessionTimeout / 4, 10);
    const t = now();
    let wake = t + interval;
    if (this.cur !== null) {
      wake = this.lastSend + interval;
      const head = this.pend[0];
      if (this.session !== 0n && head !== undefined && !mayWait(head.kind)) {
        const waited = t - head.sent;
        const ttl = nanos(this.limits.sessionTimeout);
        if (unansweredTooLong(head.kind, nanos(waited), ttl)) {
          this.fail(`no answer from ${this.addr} for ${Math.round(waited)} ms`, undefined, "", this.addr);
          return;
        }
        // Looked at again when it would have waited half the TTL, the
        // limit unansweredTooLong sets.
        wake = Math.min(wake, head.sent + millis(ttl / 2n));
      }
      if (t >= wake) {
        // Pings behind a waiting Lock are read (they keep the owner alive)
        // but not answered until the Lock is; past max_pipeline unanswered
        // requests the server stops reading.
        const cap = this.limits.maxPipeline > 0 ? this.limits.maxPipeline : 1024;
        if (!this.draining && this.pingsOut < cap) {
          this.pingsOut++;
          const p = this.newPending({ counted: false });
          p.tick = true;
          this.send(RequestType.Ping, undefined, p);
        } else {
          this.lastSend = t;
        }
        wake = t + interval;
      }
    } else {
      // The session moves: resume() ticks again once it is back.
      return;
    }
    this.tickTimer = setTimeout(() => this.tick(), Math.max(1, wake - now()));
    this.tickTimer.unref();
  }
}
