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
// Both are shortened by CLOCK_RATE_BOUND. `lost` is aborted a safety margin
// before the deadline unless an answer moved it on, and at once when the
// connection of a lock without a lease ends. Stop using the lock then, and
// pass `fence` to the resource you protect, which should refuse a lower
// fence than it has seen: a paused process cannot notice in time that its
// lock was lost.

import { RequestType } from "./gen/dlock_pb.js";
import { AcquireTimeoutError, ConnectionLostError, DlockError, LockLostError, NotHeldError, ServerError } from "./errors.js";
import type { LostReason } from "./errors.js";
import type { Link } from "./link.js";
import { now, toMicros } from "./types.js";

/**
 * How much faster the server's clock may run than the client's, as a
 * fraction of elapsed time. Clocks disciplined by NTP differ in rate by at
 * most 500 ppm; 0.1 % leaves room beyond that. Only rates matter.
 */
export const CLOCK_RATE_BOUND = 0.001;

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
  private leaseMs: number;
  /** The send time of the last answered Lock or Renew. */
  private leaseSent: number;
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
    this.leaseMs = lease;
    this.leaseSent = sent;
    this.keep = keep;
    this.claimed = !own;
    this.arm();
  }

  /** The lease length (ms); 0 for a lock held without a lease. */
  get lease(): number {
    return this.leaseMs;
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
    return this.bounds()[0];
  }

  /** Milliseconds until the safety deadline (negative when past). */
  remaining(): number {
    return this.deadline - now();
  }

  private bounds(): [number, number] {
    let window = this.leaseMs;
    let sent = this.leaseSent;
    if (window === 0) {
      window = this.link.limits.sessionTimeout;
      sent = this.link.fresh;
    }
    const deadline = sent + window - window * CLOCK_RATE_BOUND;
    return [deadline, deadline - Math.min(this.owner.margin, window / 4)];
  }

  /**
   * Throws the LockLostError if the lock is lost, or if its alarm has passed
   * though the watchdog has not run yet: it reads the clock now (a paused or
   * busy process runs its timers late).
   */
  check(): void {
    if (!this.lost.aborted && !this.released && now() >= this.bounds()[1]) {
      this.setLost("deadline", this.pastDeadline());
    }
    const err = this.error;
    if (err !== null) throw err;
  }

  private pastDeadline(): string {
    if (this.leaseMs > 0) return `the lease of ${this.leaseMs} ms was not renewed in time`;
    return `no answer from the server proves the owner alive within the session timeout of ${this.link.limits.sessionTimeout} ms; the server may end it and hand the lock on`;
  }

  /** (Re)arms the watchdog at the alarm, and the keeper a third into the lease. */
  private arm(): void {
    if (this.lost.aborted || this.released) return;
    if (this.watchdogTimer === null) this.watchdog();
    if (this.keeperTimer !== null) clearTimeout(this.keeperTimer);
    this.keeperTimer = null;
    if (this.leaseMs > 0 && this.keep) {
      const at = this.leaseSent + this.leaseMs / 3;
      this.keeperTimer = setTimeout(() => this.keepAlive(), Math.max(0, at - now()));
      this.keeperTimer.unref();
    }
  }

  /** Reports the lock lost at its alarm unless an answer moved it; re-armed lazily (answers move the deadline without touching the timer). */
  private watchdog(): void {
    this.watchdogTimer = null;
    if (this.lost.aborted || this.released) return;
    const alarm = this.bounds()[1];
    const wait = alarm - now();
    if (wait <= 0) {
      this.setLost("deadline", this.pastDeadline());
      return;
    }
    this.watchdogTimer = setTimeout(() => this.watchdog(), Math.min(wait + 1, 2 ** 31 - 1));
    this.watchdogTimer.unref();
  }

  private async keepAlive(): Promise<void> {
    this.keeperTimer = null;
    if (this.lost.aborted || this.released || this.leaseMs === 0) return;
    try {
      await this.renew(this.leaseMs);
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
    } finally {
      if (this.own) this.owner.dropSide(this.link);
    }
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
    const ms = lease ?? this.leaseMs;
    if (!(ms > 0)) throw new DlockError(`dlock: renew of ${JSON.stringify(this.keys)} needs a positive lease, not ${lease}`);
    const lostNow = this.error;
    if (lostNow !== null) throw lostNow;
    if (this.released) throw new DlockError("dlock: renew of a lock already unlocked");
    const turn = this.renewing.then(() => this.renewOnce(ms, opts.signal));
    this.renewing = turn.catch(() => {});
    return turn;
  }

  private async renewOnce(ms: number, signal?: AbortSignal): Promise<void> {
    const lostNow = this.error;
    if (lostNow !== null) throw lostNow;
    const sent = now();
    // Once sent, the server may apply it though its answer never comes (an
    // error, an abort): a lease ending sooner than the one in force counts
    // from now on, answered or not. (Not for a lock without a lease: taken
    // for a lease, it would no longer be reported lost when its connection
    // ends.)
    if (this.leaseMs !== 0 && sent + ms < this.leaseSent + this.leaseMs) {
      this.leaseMs = ms;
      this.leaseSent = sent;
    }
    const stop = signal === undefined ? this.lost : AbortSignal.any([signal, this.lost]);
    try {
      await this.link.call(RequestType.Renew, { keys: this.keys, fence: this.fence, releaseMicro: toMicros(ms) }, { signal: stop });
    } catch (e) {
      const lostNow = this.error;
      if (lostNow !== null) throw lostNow;
      throw e;
    }
    // The server replaces the lease end with each Renew, in the order sent,
    // and renewals go one at a time, so the latest-sent one is in force.
    if (this.leaseMs === 0 || sent >= this.leaseSent) {
      this.leaseMs = ms;
      this.leaseSent = sent;
    }
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
      if (e instanceof ConnectionLostError && this.leaseMs === 0) {
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
