// The client's rules, as pure functions: what an answer proves, when a held
// lock must be given up, when a session moves to another node, what is
// numbered and sent again. Mirrors src/rules.rs of the Rust library, the one
// written form of the rules; test/rules.test.ts runs the shared vectors
// (clients/conformance/rules.json) that it writes against this file.
//
// No I/O and no clock of their own: the caller passes the times. Times and
// durations are integer nanoseconds (bigint), so that the arithmetic is
// Rust's Duration arithmetic to the nanosecond (the deadline's shrink by the
// clock rate bound is Duration::mul_f64, rounded to the nearest
// nanosecond); `nanos` and `millis` convert from and to the client's
// performance.now() milliseconds.

import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";

/**
 * How much faster the server's clock may run than the client's, as a
 * fraction of elapsed time. Clocks disciplined by NTP differ in rate by at
 * most 500 ppm (the kernel's slew limit), free-running quartz by about 100
 * ppm; 0.1 % leaves room beyond both. Only rates matter: the clocks' values
 * never meet.
 */
export const CLOCK_RATE_BOUND = 0.001;

const NANOS_PER_SEC = 1_000_000_000n;

/** Milliseconds (performance.now(), or a duration) in whole nanoseconds, rounded to the nearest. */
export function nanos(ms: number): bigint {
  if (!Number.isFinite(ms)) throw new RangeError(`dlock: ${ms} ms is no time`);
  return BigInt(Math.round(ms * 1e6));
}

/** Nanoseconds in milliseconds. */
export function millis(ns: bigint): number {
  return Number(ns) / 1e6;
}

/** Rust's Duration::as_secs_f64. */
function asSecsF64(d: bigint): number {
  return Number(d / NANOS_PER_SEC) + Number(d % NANOS_PER_SEC) / 1e9;
}

/** Rust's Duration::from_secs_f64: the nanoseconds nearest to `secs`, ties to even. */
function fromSecsF64(secs: number): bigint {
  if (!(secs >= 0) || !Number.isFinite(secs)) throw new RangeError(`dlock: ${secs} s is no duration`);
  if (secs === 0) return 0n;
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, secs);
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  // secs = mant × 2^shift exactly (subnormals have no implicit bit).
  const mant = biased === 0 ? fraction : fraction | (1n << 52n);
  const shift = (biased === 0 ? 1 : biased) - 1023 - 52;
  const exact = mant * NANOS_PER_SEC;
  if (shift >= 0) return exact << BigInt(shift);
  const s = BigInt(-shift);
  const whole = exact >> s;
  const rest = exact & ((1n << s) - 1n);
  const half = 1n << (s - 1n);
  return rest > half || (rest === half && (whole & 1n) === 1n) ? whole + 1n : whole;
}

/** Rust's Duration::mul_f64. */
export function mulF64(d: bigint, by: number): bigint {
  return fromSecsF64(by * asSecsF64(d));
}

function min(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}

function max(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
}

/**
 * The latest moment a lock is still certainly held, for a window (a lease
 * or a session timeout) that started at the server no earlier than `sent`:
 * the window shortened by CLOCK_RATE_BOUND of itself, in case the server's
 * clock runs faster than the client's.
 */
export function deadline(sent: bigint, window: bigint): bigint {
  const shrink = mulF64(window, CLOCK_RATE_BOUND);
  return sent + (window > shrink ? window - shrink : 0n);
}

/**
 * The safety margin in force for `window`: the configured one, at most a
 * quarter of the window, so short windows still leave three quarters for
 * renewing.
 */
export function margin(configured: bigint, window: bigint): bigint {
  return min(configured, window / 4n);
}

/**
 * Whether a lock whose deadline is `deadline` is in jeopardy at `now`: its
 * holder must stop, since only `margin` is left before the server may hand
 * the lock on.
 */
export function inJeopardy(now: bigint, deadline: bigint, margin: bigint): boolean {
  return now + margin >= deadline;
}

/** A send time and the lease the request set (or asked for). */
export type Stamp = readonly [sent: bigint, lease: bigint];

/** What a client knows of how long one of its locks lasts at the server. */
export class Hold {
  /**
   * @param lease A lease: when the Lock, or the latest Renew answered, was
   *   sent, and the lease it set. null: the lock lives as long as its owner
   *   (the connection, or on a cluster the session).
   * @param unconfirmed The renewal whose lease ends first among those sent
   *   since the latest one was answered. The server may have applied any of
   *   them though its answer never came, and applies them in the order
   *   sent, so until the latest-sent renewal is answered the lock may end
   *   with this one: a renewal to a shorter lease, or the first Renew of a
   *   lock without a lease, which makes it a lease.
   * @param latest The renewal sent last: its answer supersedes every
   *   renewal sent before it.
   */
  constructor(
    public lease: Stamp | null,
    public unconfirmed: Stamp | null = null,
    public latest: Stamp | null = null,
  ) {}

  /** A lock granted to a request sent at `sent`, with `lease` if it asked for one. */
  static granted(sent: bigint, lease: bigint | null): Hold {
    return new Hold(lease === null ? null : [sent, lease]);
  }

  /** The safety deadline, given the send time of the latest answer that proved the owner alive (`ownerAcked`) and the owner's timeout. */
  deadline(ownerAcked: bigint, ownerTimeout: bigint): bigint {
    const held = this.lease === null ? deadline(ownerAcked, ownerTimeout) : deadline(this.lease[0], this.lease[1]);
    return this.unconfirmed === null ? held : min(held, deadline(this.unconfirmed[0], this.unconfirmed[1]));
  }

  /**
   * The window the safety margin is taken from: the lease, or the owner's
   * timeout, or an unconfirmed renewal's lease if shorter (a renewal to 2 s
   * of a 60 s lease must leave time to renew, not a margin as long as the
   * new lease).
   */
  window(ownerTimeout: bigint): bigint {
    const held = this.lease === null ? ownerTimeout : this.lease[1];
    return this.unconfirmed === null ? held : min(held, this.unconfirmed[1]);
  }

  /**
   * When a keeper renews this lock, and to what lease: a third into the
   * lease in force, to that lease again. null for a lock without a lease,
   * even when an unanswered Renew may have made it one: that Renew's answer
   * comes before any later one's (answers keep the order of requests), so a
   * renewal sent behind it could prove nothing sooner, and renewing to the
   * lease in force while a shorter renewal is unanswered would undo the
   * shortening the owner asked for. Until the answer comes, the deadline
   * follows the unanswered renewal. As `Hold::renewal` in src/rules.rs.
   */
  renewal(): Stamp | null {
    return this.lease === null ? null : [this.lease[0] + this.lease[1] / 3n, this.lease[1]];
  }

  /** A Renew to `lease` was sent at `sent`: once sent, the server may apply it though its answer never comes. Returns whether the hold changed. */
  renewSent(sent: bigint, lease: bigint): boolean {
    this.latest = [sent, lease];
    const sooner = this.unconfirmed === null || deadline(sent, lease) < deadline(this.unconfirmed[0], this.unconfirmed[1]);
    if (sooner) this.unconfirmed = [sent, lease];
    return sooner;
  }

  /**
   * The Renew to `lease` sent at `sent` was answered: the server replaces a
   * lease's end with each Renew, in the order sent, so the latest-sent
   * renewal answered is the one in force, even if it set a shorter lease.
   * Only the answer to the renewal sent last supersedes every other: one
   * sent later may still be applied after this one, and `unconfirmed` keeps
   * only the soonest end of those in flight, so it stays (on the safe side)
   * until that answer. Renewals are told apart by send time and lease, so
   * of two sent at one instant the first's answer does not clear the
   * second. Returns whether the hold changed.
   */
  renewAnswered(sent: bigint, lease: bigint): boolean {
    const newer = this.lease === null || this.lease[0] <= sent;
    if (newer) this.lease = [sent, lease];
    const last = this.latest !== null && this.latest[0] === sent && this.latest[1] === lease;
    if (last) {
      this.unconfirmed = null;
      this.latest = null;
    }
    return newer || last;
  }
}

/**
 * Whether the answer `status` to a request of `kind` proves the owner was
 * alive when the request was sent, and so moves the deadline of the locks
 * bound to it. On a single server every answer does: the connection is the
 * owner. On a session only an answer from a command that kept the session
 * alive does; a refusal, an Inspect, a NotLeader or a request the cluster
 * could not commit proves nothing.
 */
export function movesDeadline(onSession: boolean, kind: RequestType, status: ResponseStatus): boolean {
  if (!onSession) return true;
  const K = RequestType;
  switch (status) {
    case ResponseStatus.Ok:
      return kind === K.Ping || kind === K.Lock || kind === K.Unlock || kind === K.Renew || kind === K.Enqueue;
    case ResponseStatus.AcquireTimeout:
      return kind === K.Lock || kind === K.Enqueue;
    case ResponseStatus.Queued:
      return kind === K.Enqueue;
    case ResponseStatus.NotHeld:
      return kind === K.Unlock || kind === K.Renew;
    default:
      return false;
  }
}

/** Where a session must go on, named as in the vectors. */
export type Elsewhere =
  /** The cluster ended the session: its locks without a lease may be another's. */
  | { means: "session_ended" }
  /** The node does not lead (any more) and did not act: go on at the leader, `leader` if it named one. */
  | { means: "not_leader"; leader: string | null }
  /** The node could not commit in time: the request may still be applied, so only a resend under the same number is safe. */
  | { means: "no_quorum" };

/**
 * On a session, whether the answer `status` means the request was not acted
 * on at this node and the session must go on elsewhere (or has ended), and
 * why; null: it was answered here. `leader` is the address a NotLeader
 * named, if any.
 */
export function elsewhere(status: ResponseStatus, leader: string | null): Elsewhere | null {
  switch (status) {
    // The cluster ended the session (its TTL ran out while the client
    // could not reach it): its locks may be another's now.
    case ResponseStatus.UnknownSession:
      return { means: "session_ended" };
    // The node stopped leading and did not act: send the request (and
    // everything behind it) again to the new leader.
    case ResponseStatus.NotLeader:
      return { means: "not_leader", leader };
    // It could not commit in time: it may still be applied, so only a
    // resend under the same number is safe, after a fresh look for the
    // leader.
    case ResponseStatus.Unavailable:
      return { means: "no_quorum" };
    // The node is stopping (a rolling restart): the session goes on at the
    // next leader, where what is unanswered is sent again under its number,
    // so nothing is lost or done twice.
    case ResponseStatus.ShuttingDown:
      return { means: "not_leader", leader: null };
    default:
      return null;
  }
}

/**
 * How a request of `kind` uses a session: whether it acts for the
 * session's owner, and whether it is numbered with `seq` and so sent again
 * after a reconnect under the same number. What changes the table is
 * numbered; a Wait changes nothing (sent again after a failover, the new
 * leader finds its ticket in the session) and an Inspect only reads.
 */
export function sessionUse(kind: RequestType): { actsForSession: boolean; numbered: boolean } {
  switch (kind) {
    case RequestType.Lock:
    case RequestType.Unlock:
    case RequestType.Renew:
    case RequestType.Enqueue:
      return { actsForSession: true, numbered: true };
    case RequestType.Inspect:
    case RequestType.Wait:
      return { actsForSession: true, numbered: false };
    default:
      return { actsForSession: false, numbered: false };
  }
}

/** Requests whose answer may rightly take long: a Lock and a Wait wait for busy keys, a Watch for a change, up to its limit. */
export function mayWait(kind: RequestType): boolean {
  return kind === RequestType.Lock || kind === RequestType.Wait || kind === RequestType.Watch;
}

/**
 * How long a session may be looked for after its stream broke at `broke`:
 * it lives a TTL after the last command that kept it alive, the latest
 * answered one (`acked`) or, while the stream was open, the node's own
 * keep-alives, which the client does not see while a Lock waits. Past this
 * no node knows it.
 */
export function sessionLivesUntil(acked: bigint, broke: bigint, ttl: bigint): bigint {
  return max(acked, broke) + ttl;
}

/**
 * Whether the oldest unanswered request on a session, of `kind` and waiting
 * for `waited`, shows a node that accepts but does not answer (a paused or
 * stalled node, a path that drops without a reset): one that may not
 * rightly wait, unanswered for half a TTL.
 */
export function unansweredTooLong(kind: RequestType, waited: bigint, ttl: bigint): boolean {
  return !mayWait(kind) && waited >= ttl / 2n;
}

/** The election timeout assumed for a node that does not state one (dlock-server's default), ns. */
export const DEFAULT_ELECTION_TIMEOUT = 200_000_000n;
/** The shortest silence taken for a stall, ns: a healthy node on a loaded machine may take a few hundred milliseconds to answer a Ping, and a false alarm costs a reconnect. */
export const MIN_SILENCE = 1_500_000_000n;
/** The shortest silence limit whatever the TTL, ns: below it a healthy node's scheduling delays would count as silence. */
export const SILENCE_FLOOR = 250_000_000n;

/**
 * How long a node may leave the silent-node probe (liveness.ts) unanswered
 * before it is taken for gone: three election timeouts (by then the others
 * have replaced it if it led), at least MIN_SILENCE, and at most a quarter
 * of the session's `ttl` (which wins: a short TTL must leave room to
 * resume), but never below SILENCE_FLOOR, so that a node stating no TTL
 * does not make the probe spin. `electionTimeout` is the node's, if it
 * states one (null: DEFAULT_ELECTION_TIMEOUT). The twin of
 * rules::silence_limit in src/rules.rs.
 */
export function silenceLimit(electionTimeout: bigint | null, ttl: bigint): bigint {
  const election = electionTimeout ?? DEFAULT_ELECTION_TIMEOUT;
  const max = (a: bigint, b: bigint): bigint => (a > b ? a : b);
  const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);
  return max(min(max(3n * election, MIN_SILENCE), ttl / 4n), SILENCE_FLOOR);
}

/**
 * Whether a link that last heard from its node (read any frame from it) at
 * `lastHeard` has gone silent at `now` for `limit` (silenceLimit): once the
 * probe finds the node silent, such a link breaks off and resumes its
 * session elsewhere; one that heard from the node within the limit stays,
 * since the probe's own connection was slow, not the node, and asks again
 * a limit after it last heard, unless the probe has been answered since
 * (link.ts's recheck). (A probe answered Unavailable sends every link away,
 * whatever it heard.) The twin of rules::gone_silent in src/rules.rs.
 */
export function goneSilent(lastHeard: bigint, now: bigint, limit: bigint): boolean {
  return lastHeard + limit <= now;
}
