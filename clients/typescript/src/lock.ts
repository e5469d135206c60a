// Lock: keys held together under one fencing token, and when they can no
// longer be assumed held (docs/CLIENTS.md, "Sessions, pings and when a lock
// is lost"). Mirrors clients/go/lock.go.
//
// Every Lock has a safety deadline: the latest moment it is certainly still
// held, judged from this side alone.
//  - A lease ends no sooner than the lease after the last answered Lock or
//    Renew was sent.
//  - A lock without a lease is released when the server ends the
//    connection (on a cluster: the session), which it may do once nothing
//    kept it alive for the session timeout; so the deadline is the send time
//    of the last request whose answer proves the owner alive, plus the
//    session timeout. On a single server any answer proves it; on a cluster
//    only the answer to a command the cluster committed for the session (a
//    deposed leader's NotLeader proves nothing).
//  - A Renew sent and not answered may have been applied: until an answer
//    to it or to a later renewal comes, the lock ends no later than its
//    lease after it was sent, a lock without a lease too (the Renew makes
//    it a lease).
// Each is shortened by CLOCK_RATE_BOUND. `lost` is aborted a safety margin
// before the deadline unless an answer moved it on, and at once when the
// connection of a lock without a lease ends. Stop using the lock then, and
// pass `fence` to the resource you protect, which should refuse a lower
// fence than it has seen: a paused process cannot notice in time that its
// lock was lost. The arithmetic is rules.ts's (Hold, margin, inJeopardy).

import { RequestType } from "./gen/dlock_pb.js";
import { AcquireTimeoutError, ConnectionLostError, DlockError, LockLostError, NotHeldError, ServerError } from "./errors.js";
import type { LostReason } from "./errors.js";
import type { Link } from "./link.js";
import { Hold, deadline, inJeopardy, margin, millis, nanos } from "./rules.js";
import { now, toMicros } from "./types.js";

/** A lease of `ms` as the server takes it: in whole microseconds (null for none). */
function leaseOf(ms: number): bigint | null {
  const us = toMicros(ms);
  return us > 0n ? us * 1000n : null;
}

/** What a Lock needs of the client that made it. */
export interface LockOwner {
  readonly margin: number;
  /** The lock left the client's books: unlocked or lost. */
  forget(lock: Lock): void;
  /** The Unlock of a lock on the shared connection is queued there: its keys are free for this client's other locks. */
  unclaim(keys: string[]): void;
  /** A connection of the client's own is not needed any more. */
  dropSide(link: Link): void;
  proclaim(keys: string[], fence: bigint, value: string | Uint8Array, link: Link): Promise<void>;
  /** A lease's Unlock failed with `cause` as its connection (session) ended: sends it again by fence elsewhere (Client.unlockAgain). */
  unlockAgain(keys: string[], fence: bigint, cause: ConnectionLostError): Promise<void>;
}

export class Lock implements AsyncDisposable {
  /** The keys held, in the order locked. */
  readonly keys: string[];
  /** The grant's fencing token: pass it to the resource the lock protects, which should refuse a lower token than it has seen. */
  readonly fence: bigint;
  /** Aborted when the lock can no longer be assumed held; its `reason` is the LockLostError saying why. */
  readonly lost: AbortSignal;
  /** @internal The connection that holds it: the client's, or (own) one of its own, closed when the lock is unlocked. */
  readonly link: Link;
  /** @internal */
  readonly own: boolean;
  private readonly owner: LockOwner;
  private readonly lostCtl = new AbortController();
  /** How long the lock lasts at the server, as far as the client knows: its lease, if any, and the renewals whose answer has not come (on the rules' nanoseconds of the performance.now() clock). */
  private readonly hold: Hold;
  private released = false;
  private readonly keep: boolean;
  private watchdogTimer: NodeJS.Timeout | null = null;
  private keeperTimer: NodeJS.Timeout | null = null;
  /** Renewals go one at a time, each stamped with its send time once the one before is answered, so the latest stamp is the lease the server applied last. */
  private renewing: Promise<unknown> = Promise.resolve();
  /** The keys are claimed on the shared connection until the Unlock is queued there. */
  private claimed: boolean;

  /** @internal */
  constructor(owner: LockOwner, link: Link, own: boolean, keys: string[], fence: bigint, lease: number, sent: number, keep: boolean) {
    this.owner = owner;
    this.link = link;
    this.own = own;
    this.keys = keys;
    this.fence = fence;
    this.lost = this.lostCtl.signal;
    this.hold = Hold.granted(nanos(sent), leaseOf(lease));
    this.keep = keep;
    this.claimed = !own;
    this.arm();
  }

  /** The lease length (ms), as the server applies it (in whole microseconds); 0 for a lock held without a lease. */
  get lease(): number {
    return this.hold.lease === null ? 0 : millis(this.hold.lease[1]);
  }

  /** Why the lock was lost; null while held (or once unlocked). */
  get error(): LockLostError | null {
    return this.lost.aborted ? (this.lost.reason as LockLostError) : null;
  }

  /** Whether unlock() was called. */
  get isReleased(): boolean {
    return this.released;
  }

  /** The safety deadline (on the performance.now() clock): after it the server may hand the lock to someone else. */
  get deadline(): number {
    return millis(this.bounds().deadline);
  }

  /** Milliseconds until the safety deadline (negative when past). */
  remaining(): number {
    return this.deadline - now();
  }

  /** The safety deadline and the margin in force, in nanoseconds. */
  private bounds(): { deadline: bigint; margin: bigint } {
    const timeout = nanos(this.link.limits.sessionTimeout);
    return {
      deadline: this.hold.deadline(nanos(this.link.fresh), timeout),
      margin: margin(nanos(this.owner.margin), this.hold.window(timeout)),
    };
  }

  /** Whether the lock is in jeopardy at `t` (ms): past its alarm, a margin before its deadline. */
  private inJeopardy(t: number): boolean {
    const b = this.bounds();
    return inJeopardy(nanos(t), b.deadline, b.margin);
  }

  /**
   * Throws the LockLostError if the lock is lost, or if its alarm has passed
   * though the watchdog has not run yet: it reads the clock now (a paused or
   * busy process runs its timers late).
   */
  check(): void {
    if (!this.lost.aborted && !this.released && this.inJeopardy(now())) {
      this.setLost("deadline", this.pastDeadline());
    }
    const err = this.error;
    if (err !== null) throw err;
  }

  private pastDeadline(): string {
    const u = this.hold.unconfirmed;
    if (u !== null && this.bounds().deadline === deadline(u[0], u[1])) {
      return `a renewal to a lease of ${millis(u[1])} ms was not answered in time, and the server may have applied it`;
    }
    if (this.hold.lease !== null) return `the lease of ${this.lease} ms was not renewed in time`;
    return `no answer from the server proves the owner alive within the session timeout of ${this.link.limits.sessionTimeout} ms; the server may end it and hand the lock on`;
  }

  /** (Re)arms the watchdog at the alarm, and the keeper a third into the lease. */
  private arm(): void {
    if (this.lost.aborted || this.released) return;
    this.rewatch();
    if (this.keeperTimer !== null) clearTimeout(this.keeperTimer);
    this.keeperTimer = null;
    const renewal = this.hold.renewal();
    if (renewal !== null && this.keep) {
      const at = millis(renewal[0]);
      this.keeperTimer = setTimeout(() => this.keepAlive(), Math.max(0, at - now()));
      this.keeperTimer.unref();
    }
  }

  /** Sets the watchdog afresh: the alarm may have come nearer (a renewal sent, or one to a shorter lease answered). */
  private rewatch(): void {
    if (this.watchdogTimer !== null) clearTimeout(this.watchdogTimer);
    this.watchdog();
  }

  /** Reports the lock lost at its alarm unless an answer moved it; re-armed lazily (answers that move the deadline on leave the timer, which looks again when it fires). */
  private watchdog(): void {
    this.watchdogTimer = null;
    if (this.lost.aborted || this.released) return;
    const t = now();
    if (this.inJeopardy(t)) {
      this.setLost("deadline", this.pastDeadline());
      return;
    }
    const b = this.bounds();
    const wait = millis(b.deadline - b.margin) - t;
    this.watchdogTimer = setTimeout(() => this.watchdog(), Math.min(wait + 1, 2 ** 31 - 1));
    this.watchdogTimer.unref();
  }

  private async keepAlive(): Promise<void> {
    this.keeperTimer = null;
    if (this.lost.aborted || this.released || this.hold.lease === null) return;
    try {
      await this.renew();
    } catch (e) {
      if (this.lost.aborted || this.released) return;
      if (e instanceof NotHeldError) {
        this.setLost("not-held", "the server no longer holds the lease (NotHeld on Renew)", e);
      } else if (e instanceof ServerError && !(e instanceof AcquireTimeoutError)) {
        this.setLost("renew-refused", "the server refused to renew the lease", e);
      }
      // The connection is gone: the lease outlives it, and the watchdog
      // reports it lost when it could have run out.
    }
  }

  /** @internal Reports the lock lost, once (not once released). */
  setLost(kind: LostReason, text: string, cause?: unknown): void {
    if (this.lost.aborted || this.released) return;
    this.stopTimers();
    this.lostCtl.abort(new LockLostError(kind, this.keys, this.fence, text, cause));
    this.owner.forget(this);
    if (kind !== "connection" && kind !== "closed") {
      // The server may still hold it for this owner: released by fence (it
      // never touches a later grant), so the client's other locks on its
      // keys do not wait for it in vain.
      this.link.detached(RequestType.Unlock, { keys: this.keys, fence: this.fence });
    }
    this.unclaim();
    if (this.own) this.owner.dropSide(this.link);
  }

  private unclaim(): void {
    if (this.claimed) {
      this.claimed = false;
      this.owner.unclaim(this.keys);
    }
  }

  private stopTimers(): void {
    if (this.watchdogTimer !== null) clearTimeout(this.watchdogTimer);
    if (this.keeperTimer !== null) clearTimeout(this.keeperTimer);
    this.watchdogTimer = null;
    this.keeperTimer = null;
  }

  /**
   * Releases the keys, by fence (so a later grant to someone else is never
   * touched). NotHeldError if they were no longer held (the lease ran out);
   * ConnectionLostError if the connection is gone (a lock without a lease is
   * then released already). Unlocking twice does nothing.
   *
   * A lease outlives its connection (on a cluster, its session): if that
   * ends before the Unlock is answered, perhaps before it was sent (a
   * session that ends while it moves to a new leader), the Unlock is sent
   * again by fence on a connection opened for it, within 10 s. It resolves
   * if that released the keys; NotHeldError if they were not so held any
   * more (the lease ran out, or the first Unlock was applied after all);
   * ConnectionLostError if no server could be reached (or the client was
   * closed): the lease then runs until it ends.
   */
  async unlock(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.stopTimers();
    this.owner.forget(this);
    let call: Promise<unknown>;
    try {
      // Not counted against the in-flight bound: queued at once, so the
      // keys are free for this client's other locks from here on (the
      // server acts on requests in the order sent).
      call = this.link.call(RequestType.Unlock, { keys: this.keys, fence: this.fence }, { counted: false, queued: () => this.unclaim() });
    } finally {
      this.unclaim();
    }
    try {
      await call;
    } catch (e) {
      if (!(e instanceof ConnectionLostError) || !this.mayBeLease()) throw e;
      await this.owner.unlockAgain(this.keys, this.fence, e);
    } finally {
      if (this.own) this.owner.dropSide(this.link);
    }
  }

  /** Whether the server may hold the keys as a lease, which outlives the connection: taken with one, or a Renew sent. */
  private mayBeLease(): boolean {
    return this.hold.lease !== null || this.hold.unconfirmed !== null || this.hold.latest !== null;
  }

  /**
   * Sets the lease to now + `lease` ms (default: the lease it has). A lock
   * taken without a lease becomes a lease: it then outlives the connection,
   * and is renewed every third of it unless taken with `keep: false`.
   *
   * It returns when the lock is lost at the latest: a renewal held up (a
   * failover, a frozen path) never keeps its caller past the moment the
   * lock must be given up; the error is then the LockLostError.
   * NotHeldError if the keys are no longer held.
   */
  async renew(lease?: number, opts: { signal?: AbortSignal } = {}): Promise<void> {
    // In whole microseconds, as the server takes it.
    const ns = lease === undefined ? (this.hold.lease?.[1] ?? null) : leaseOf(lease);
    if (ns === null) throw new DlockError(`dlock: renew of ${JSON.stringify(this.keys)} needs a positive lease, not ${lease}`);
    const lostNow = this.error;
    if (lostNow !== null) throw lostNow;
    if (this.released) throw new DlockError("dlock: renew of a lock already unlocked");
    const turn = this.renewing.then(() => this.renewOnce(ns, opts.signal));
    this.renewing = turn.catch(() => {});
    return turn;
  }

  private async renewOnce(lease: bigint, signal?: AbortSignal): Promise<void> {
    const lostNow = this.error;
    if (lostNow !== null) throw lostNow;
    const sent = nanos(now());
    // Once sent, the server may apply it though its answer never comes (an
    // error, an abort): until an answer to it or to a later renewal, the
    // lock ends no later than this lease from now, also a lock without a
    // lease, which it makes one (it is still reported lost when its
    // connection ends, until an answer says it is a lease).
    if (this.hold.renewSent(sent, lease)) this.rewatch();
    const stop = signal === undefined ? this.lost : AbortSignal.any([signal, this.lost]);
    try {
      await this.link.call(RequestType.Renew, { keys: this.keys, fence: this.fence, releaseMicro: lease / 1000n }, { signal: stop });
    } catch (e) {
      const lostNow = this.error;
      if (lostNow !== null) throw lostNow;
      throw e;
    }
    // The server replaces the lease end with each Renew, in the order sent,
    // so the latest-sent one answered is in force.
    this.hold.renewAnswered(sent, lease);
    this.arm();
  }

  /** Replaces the value of the keys (what Inspect and Watch show: an election's leader identity). NotHeldError if they are no longer held. */
  proclaim(value: string | Uint8Array): Promise<void> {
    return this.owner.proclaim(this.keys, this.fence, value, this.link);
  }

  /**
   * Unlocks, as `await using` does at the end of its block. If the lock was
   * lost meanwhile (or the unlock finds it no longer held), throws the
   * LockLostError: the work was not protected to its end.
   */
  async release(): Promise<void> {
    if (this.released) return;
    try {
      this.check();
    } catch (e) {
      await this.unlock().catch(() => {});
      throw e;
    }
    try {
      await this.unlock();
    } catch (e) {
      if (e instanceof NotHeldError) {
        throw new LockLostError("not-held", this.keys, this.fence, `not held any more when unlocked (${e.message})`, e);
      }
      if (e instanceof ConnectionLostError && this.hold.lease === null) {
        throw new LockLostError("connection", this.keys, this.fence, e.reason, e);
      }
      throw e;
    }
  }

  /** `await using lock = await client.lock("k")`: released at the end of the block (see release()). */
  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}
