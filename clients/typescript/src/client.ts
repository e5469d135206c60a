// The Client: one pipelined connection to a dlock server (on a cluster, to
// its leader, with a session that rides through failovers), the calls, and
// which of its locks holds which key. Mirrors clients/go/client.go.
//
// The ownership rule (docs/CLIENTS.md, point 4): each lock has an owner of
// its own: tasks sharing one client that lock the same key take turns, first
// come first served, exactly as separate processes do; unrelated locks share
// the client's one pipelined connection, and a lock whose key another lock
// of this client holds, or that must wait, is taken on a connection of its
// own.
//
// The server counts a connection (on a cluster, its session) as one owner
// and grants a key that owner holds again at once, so the client keeps a
// claim count per key for its shared connection: a key is claimed from the
// moment a Lock or Enqueue naming it is queued there until the client knows
// that connection's owner no longer holds or waits for it (its Unlock is
// queued, the try was refused, a given-up call's late grant was released,
// the connection ended). A Lock is first sent without waiting (try_lock) on
// the shared connection, pipelined with everything else, unless one of its
// keys is claimed there; then, and when the try finds a key busy and the
// caller wants to wait, it is taken on a connection (on a cluster, a
// session) of its own, opened for it and closed when it is unlocked, so the
// wait holds back no other call.

import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RequestLockSchema } from "./gen/dlock_pb.js";
import { AcquireTimeoutError, BusyError, ConnectionLostError, DlockError, LockLostError, NotHeldError, ProtocolError } from "./errors.js";
import { Dialer, serverList, tlsFromEnv } from "./dial.js";
import type { TlsOptions } from "./dial.js";
import { Link } from "./link.js";
import { Lock } from "./lock.js";
import type { LockOwner } from "./lock.js";
import { Queued } from "./enqueue.js";
import { Election } from "./election.js";
import { keyInfoOf, now, toMicros } from "./types.js";
import type { ClientEvent, KeyInfo, Limits, ServerStats } from "./types.js";

export interface ConnectOptions {
  /** Sent with every request; default DLOCK_TOKEN. */
  token?: string;
  /** TLS (node:tls options: ca, cert, key, ...); the server's certificate must name the host dialled. Default: DLOCK_TLS_CA, DLOCK_TLS_CERT, DLOCK_TLS_KEY (PEM files); without DLOCK_TLS_CA, plain TCP. null: plain TCP. */
  tls?: TlsOptions | null;
  /** Bounds a connect (ms); given several servers each gets a share of it (at least half a second). Default 5000. */
  connectTimeout?: number;
  /** How long before a lock's safety deadline it is reported lost when no answer moved the deadline: the time its holder gets to stop (ms). At most a quarter of the lease or session timeout is used. Default 2000. */
  safetyMargin?: number;
  /** The most requests unanswered at once on the shared connection; further calls wait. Default 256 (and never more than the server's max_pipeline). */
  maxInFlight?: number;
  /** The TTL asked for the client's sessions on a cluster (ms, at least 1000); default: the cluster's. */
  sessionTTL?: number;
  /** Told when the session moves between cluster nodes. */
  onEvent?: (e: ClientEvent) => void;
  /** Gives the connect up. */
  signal?: AbortSignal;
}

export interface LockOptions {
  /** How long to wait for busy keys (ms). Absent (or Infinity): as long as it takes (until `signal` aborts). 0: not at all (BusyError if a key is busy). */
  wait?: number;
  /** Takes the keys as a lease of this length (ms): it outlives the connection and is renewed every third of it while held (see `keep`). Absent or 0: held until unlocked or until the connection (session) ends. */
  lease?: number;
  /** Renews a lease in the background (default true). */
  keep?: boolean;
  /** Takes every key shared (true: a reader lock), or those named (the others exclusively). */
  shared?: boolean | string[];
  /** With `shared`: at most this many holders of each shared key at once (a semaphore). Everyone sharing a key must name the same limit. */
  limit?: number;
  /** What Inspect and Watch show for this hold (at most 1024 bytes; a string is sent as UTF-8): an election's leader identity. */
  value?: string | Uint8Array;
  /** Gives the lock up: a waiting Lock is withdrawn on the server, and a grant that crosses the abort is released. The call rejects with the signal's reason. */
  signal?: AbortSignal;
}

type Body = MessageInitShape<typeof RequestLockSchema>;

/**
 * How long a connection of its own, given up, waits for a grant that crossed
 * the cancel (ms), and how long that grant's release on a connection opened
 * for it may take.
 */
const DRAIN_LIMIT = 10_000;

/** Resolves when `signal` aborts (at once if it has). */
function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** The keys of a call: one key or several. */
export type Keys = string | readonly string[];

function keysOf(keys: Keys): string[] {
  return typeof keys === "string" ? [keys] : [...keys];
}

export function valueBytes(v: string | Uint8Array | undefined): Uint8Array {
  if (v === undefined) return new Uint8Array(0);
  return typeof v === "string" ? new TextEncoder().encode(v) : v;
}

/** The RequestLock of a Lock or Enqueue. */
export function lockBody(keys: string[], o: LockOptions, tryLock: boolean): Body {
  const body: Body = { keys, releaseMicro: toMicros(o.lease ?? 0), value: valueBytes(o.value) };
  const shared = o.shared === true || ((o.limit ?? 0) > 0 && o.shared === undefined) ? keys : Array.isArray(o.shared) ? o.shared : [];
  if (shared.length > 0) {
    // Only set when asked, so an exclusive Lock is encoded exactly as by
    // every older client.
    body.sharedKeys = shared;
    body.limit = o.limit ?? 0;
  }
  if (tryLock || o.wait === 0) body.tryLock = true;
  else if (o.wait !== undefined && Number.isFinite(o.wait) && o.wait > 0) body.waitMicro = toMicros(o.wait);
  return body;
}

/** A refusal of a try: BusyError instead of AcquireTimeoutError. */
function busy(e: unknown): unknown {
  if (e instanceof AcquireTimeoutError && !(e instanceof BusyError)) {
    const b = new BusyError(e.request, e.status, e.text, e.keys, e.leader);
    return b;
  }
  return e;
}

/**
 * Connects to `servers`: one HOST:PORT, a cluster's nodes as a
 * comma-separated list or an array (default: DLOCK_SERVER, else
 * 127.0.0.1:7436). It says Hello to learn the server's limits and session
 * timeout and, on a cluster, finds the leader (following the others'
 * NotLeader answers) and opens a session there.
 *
 * Throws a ConnectError naming each address tried and why it failed (with
 * one server, a refusal's own ServerError: AccessDeniedError for a refused
 * token, LimitReachedError), or a NotOneClusterError when one of several
 * servers is a single server.
 */
export async function connect(servers?: string | string[], opts: ConnectOptions = {}): Promise<Client> {
  const addrs = serverList(servers);
  const token = opts.token ?? process.env.DLOCK_TOKEN ?? "";
  const tls = opts.tls === undefined ? tlsFromEnv() : opts.tls;
  if (opts.sessionTTL !== undefined && opts.sessionTTL < 1000) {
    // A cluster refuses sessions shorter than a second (InvalidArgument).
    throw new DlockError(`dlock: sessionTTL ${opts.sessionTTL} ms must be at least 1000`);
  }
  const dialer = new Dialer({
    addrs,
    token,
    tls,
    connectTimeout: opts.connectTimeout ?? 5000,
    sessionTTL: opts.sessionTTL ?? 0,
    onEvent: opts.onEvent,
  });
  const link = await Link.open(dialer, opts.maxInFlight ?? 256, false, opts.signal);
  return new Client(dialer, link, opts.safetyMargin ?? 2000, opts.maxInFlight ?? 256);
}

/**
 * A connection to a dlock server, or to a cluster's leader with a session;
 * make one with `connect()`. Its methods may be called by any number of
 * tasks at once: their requests are pipelined on the one connection and
 * answered in order.
 *
 * Each lock has an owner of its own: tasks sharing one client that lock the
 * same key take turns, first come first served, exactly as separate
 * processes do; unrelated locks share the client's one pipelined
 * connection, and a lock whose key another lock of this client holds, or
 * that must wait, is taken on a connection of its own.
 *
 * Against a single server, when the connection ends every pending call
 * fails with a ConnectionLostError, later calls fail at once, and `ended`
 * aborts: there is no reconnect, since the server released every lock held
 * without a lease. Against a cluster, the client resumes its session on the
 * new leader through failovers (see `onEvent`); it ends only when the
 * session does.
 */
export class Client implements LockOwner, AsyncDisposable {
  /** @internal */
  readonly link: Link;
  /** @internal */
  readonly dialer: Dialer;
  /** @internal */
  readonly margin: number;
  private readonly claims = new Map<string, number>();
  private readonly locks = new Set<Lock>();
  /** Connections of the client's own: waiting locks' and Watches'. */
  private readonly side = new Set<Link>();
  /** Connections of given-up waits, half-closed and draining a late grant: close() waits for them to end. */
  private readonly draining = new Set<Link>();
  /** Unlocks by fence of late grants on connections opened for them (releaseLate): close() waits for them. */
  private readonly releasing = new Set<Promise<void>>();
  private watchers: Link[] = [];
  private closed: Promise<void> | null = null;

  /** @internal */
  constructor(dialer: Dialer, link: Link, margin: number, _maxInFlight: number) {
    this.dialer = dialer;
    this.link = link;
    this.margin = margin;
    link.onEnd = (err, closing) => this.onEnd(err, closing);
    if (link.err !== null) queueMicrotask(() => this.onEnd(link.err as Error, false));
  }

  /** What the server said in answer to Hello; on a cluster, `sessionTimeout` is the session's TTL. */
  get limits(): Limits {
    return this.link.limits;
  }

  /** The cluster session the client acts for; 0n on a single server. */
  get session(): bigint {
    return this.link.session;
  }

  /** The node connected to now (on a cluster, the leader). */
  get addr(): string {
    return this.link.addr;
  }

  /** Aborted when the connection (on a cluster: the session) has ended; its reason says why (a ConnectionLostError). */
  get ended(): AbortSignal {
    return this.link.ended.signal;
  }

  /**
   * Ends the connection cleanly (on a cluster, the session too): the server
   * releases the locks held without a lease. Leases stop being renewed and
   * their Locks are reported lost ("closed"); on the server they run until
   * they end or are unlocked by fence. Leaves no socket or timer behind.
   *
   * A Lock, Enqueue or Queued's wait() still waiting (it rejects with
   * ConnectionLostError), or given up (its signal aborted), whose grant may
   * still be on its way is the exception, on the client's connection as on
   * a Lock's own: its connection is half-closed, and the promise settles only
   * once that connection has ended and a grant that arrived on it, a lease
   * too, was released by fence (on a connection opened for it), or once the
   * drain limit (10 s) has passed.
   */
  close(): Promise<void> {
    if (this.closed !== null) return this.closed;
    const why = new ConnectionLostError("closed by the client");
    this.dialer.closing.abort(why);
    const closing: Promise<void>[] = [];
    // An Enqueue or a Wait (or a try-Lock) on the client's connection may
    // be granted as the server reads the close: drained as a Lock's own.
    if (this.link.waiting) this.drainAside(this.link, why);
    else closing.push(this.link.close("closed by the client"));
    for (const s of [...this.side]) {
      // A Lock that waits may be granted as the server reads the close:
      // drained as if given up, so that grant is read and released.
      if (s.forLock && s.waiting) this.drainAside(s, why);
      else closing.push(s.close("closed by the client"));
    }
    this.side.clear();
    // Not closed: each ends by itself once the server has closed its side
    // (it withdrew the request) or its drain limit passed, and tells
    // releaseLate of a grant that crossed the abort or the close.
    const drained = [...this.draining].map((s) => aborted(s.ended.signal));
    this.watchers = [];
    this.onEnd(this.link.err ?? why, true);
    this.closed = (async () => {
      await Promise.all([...closing, ...drained]);
      // A grant read just before its connection ended is handed on in a
      // microtask (Link.onResponse): let it reach releaseLate.
      await new Promise((resolve) => setImmediate(resolve));
      while (this.releasing.size > 0) await Promise.all(this.releasing);
    })();
    return this.closed;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private onEnd(err: Error, closing: boolean): void {
    if (!closing && this.closed !== null) return;
    this.claims.clear();
    if (closing) {
      for (const s of this.side) void s.close("the client was closed");
      this.side.clear();
    } else {
      // A Lock's connection of its own is another owner, which lives on
      // (and ends) by itself; Watches go with the client.
      for (const s of [...this.side]) {
        if (!s.forLock) {
          this.side.delete(s);
          void s.close("the client's connection ended");
        }
      }
      this.watchers = [];
    }
    for (const l of [...this.locks]) {
      if (closing) {
        l.setLost("closed", "the client was closed", err);
      } else if (!l.own && l.lease === 0) {
        // A lease outlives the connection: it is reported lost only when it
        // could have run out (its watchdog).
        l.setLost("connection", err instanceof ConnectionLostError ? err.reason : String(err), err);
      }
    }
  }

  // -- the ownership rule's books ---------------------------------------

  private anyClaimed(keys: string[]): boolean {
    return keys.some((k) => (this.claims.get(k) ?? 0) > 0);
  }

  private claim(keys: string[]): () => void {
    for (const k of keys) this.claims.set(k, (this.claims.get(k) ?? 0) + 1);
    let done = false;
    return () => {
      if (!done) {
        done = true;
        this.unclaim(keys);
      }
    };
  }

  /** @internal */
  unclaim(keys: string[]): void {
    for (const k of new Set(keys)) {
      const n = (this.claims.get(k) ?? 0) - 1;
      if (n > 0) this.claims.set(k, n);
      else this.claims.delete(k);
    }
  }

  /** @internal */
  forget(lock: Lock): void {
    this.locks.delete(lock);
  }

  /** @internal Closes a connection of the client's own cleanly (on a cluster ending its session): what it holds without a lease is released, what it waits for withdrawn. */
  dropSide(link: Link): void {
    // One close() drains ends by itself.
    if (this.draining.has(link)) return;
    this.side.delete(link);
    void link.close("not needed");
  }

  // -- locks --------------------------------------------------------------

  /**
   * Takes all `keys` at once, waiting in line (FIFO) for busy ones as `opts`
   * say, and returns the held Lock with its fencing token.
   *
   * Throws AcquireTimeoutError (with the busy keys) when the wait runs out,
   * BusyError with `wait: 0`; a ServerError subclass for invalid keys or a
   * server limit (ModeConflictError, LimitMismatchError, ...);
   * ConnectionLostError; the signal's reason when it aborts.
   *
   * The request is first sent without waiting on the client's connection
   * (pipelined with every other call), unless another lock of this client
   * holds or asks for one of its keys there. Then, and if keys are busy, the
   * Lock waits in line on a connection (on a cluster, a session) of its
   * own, so the wait holds back no other call, and the Lock it returns is
   * held by that connection, which unlock() closes. If the signal aborts
   * while the request waits, the call rejects at once and that connection is
   * half-closed: the server withdraws the request (on a cluster, ends that
   * session), and a grant that crossed the abort, a lease too, is released
   * by fence.
   */
  async lock(keys: Keys, opts: LockOptions = {}): Promise<Lock> {
    const ks = keysOf(keys);
    const uniq = [...new Set(ks)];
    opts.signal?.throwIfAborted();
    if (this.link.err !== null) throw this.link.err;
    if (this.anyClaimed(uniq)) return this.lockAside(ks, opts);
    const unclaim = this.claim(uniq);
    let queued = false;
    // Taken before the request is queued: never later than the real send
    // time, so deadlines counted from it are on the safe side.
    const sent = now();
    let resp;
    try {
      resp = await this.link.call(RequestType.Lock, lockBody(ks, opts, true), {
        signal: opts.signal,
        lockKeys: ks,
        queued: () => (queued = true),
        settled: unclaim,
      });
    } catch (e) {
      if (!queued) unclaim();
      if (e instanceof AcquireTimeoutError && opts.wait !== 0 && !opts.signal?.aborted) return this.lockAside(ks, opts);
      throw opts.wait === 0 ? busy(e) : e;
    }
    return this.granted(this.link, ks, resp.fence, opts, sent, unclaim);
  }

  /**
   * Runs `fn` holding `keys` (see lock()), with the lock's `lost` signal
   * (pass it on to what you do under the lock), and unlocks at the end. If
   * `fn` throws, that error is thrown after unlocking; if it returns and the
   * lock was lost meanwhile (or was no longer held at the unlock), a
   * LockLostError is thrown, since the work was not protected to its end.
   */
  async withLock<T>(keys: Keys, opts: LockOptions, fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T): Promise<T> {
    const lock = await this.lock(keys, opts);
    let result: T;
    try {
      result = await fn(lock.lost, lock);
    } catch (e) {
      await lock.unlock().catch(() => {});
      throw e;
    }
    await lock.release();
    return result;
  }

  /** Waits for busy keys on a connection (on a cluster, a session) of its own. */
  private async lockAside(keys: string[], o: LockOptions): Promise<Lock> {
    const ln = await this.openSide(o.signal, true);
    const sent = now();
    let resp;
    try {
      resp = await ln.call(RequestType.Lock, lockBody(keys, o, false), { signal: o.signal, lockKeys: keys });
    } catch (e) {
      if (o.signal?.aborted) {
        // Given up: half-closed, the server withdraws the request, and a
        // grant that crossed (a lease outlives the connection) is released
        // by fence (releaseLate).
        this.drainAside(ln);
      } else {
        this.dropSide(ln);
      }
      throw o.wait === 0 ? busy(e) : e;
    }
    return this.granted(ln, keys, resp.fence, o, sent, null);
  }

  /** @internal Gives up a connection of its own whose request was abandoned (or, from close(), the client's connection): half-closed, so the server withdraws the request, and a grant that crossed (a lease outlives the connection) is released by fence (releaseLate). `fail` (close()): what a caller still waiting on it is rejected with. */
  drainAside(ln: Link, fail?: Error): void {
    this.side.delete(ln);
    this.draining.add(ln);
    const ended = ln.onEnd;
    ln.onEnd = (err, closing) => {
      this.draining.delete(ln);
      ended(err, closing);
    };
    ln.drain((k, fence) => this.releaseLate(k, fence), DRAIN_LIMIT, fail);
  }

  /**
   * Releases, by fence, a grant that reached a connection of its own given
   * up meanwhile (a lease outlives it): on the client's connection, or,
   * when that has ended (a connection of its own outlives it; on a cluster
   * a session that is moving has not ended) or the client was closed, on a
   * connection opened for the Unlock, so the lease does not keep others
   * out until it runs out. On failure (NotHeld: it ended or was released
   * meanwhile; no server reached) the lease runs out on its own. close()
   * waits for it.
   */
  private releaseLate(keys: string[], fence: bigint): void {
    if (this.link.detached(RequestType.Unlock, { keys, fence })) return;
    const release = this.unlockOnNew(keys, fence, true).catch(() => {});
    this.releasing.add(release);
    void release.then(() => this.releasing.delete(release));
  }

  /**
   * One Unlock by fence on a connection (on a cluster, a session) opened
   * for it and closed after, within the drain limit. afterClose: also once
   * the client is closed (a late grant's release, which close() waits
   * for). Throws what the connect or the Unlock failed with.
   */
  private async unlockOnNew(keys: string[], fence: bigint, afterClose: boolean): Promise<void> {
    const signal = AbortSignal.timeout(DRAIN_LIMIT);
    const ln = await Link.open(this.dialer, 1, true, signal, afterClose);
    try {
      await ln.call(RequestType.Unlock, { keys, fence }, { signal });
    } finally {
      await ln.close("an unlock by fence sent");
    }
  }

  /**
   * @internal The Unlock of a lock that may be a lease failed with `cause`
   * because its connection (on a cluster, its session) ended before the
   * answer came, perhaps before it was sent: a session that ends while it
   * moves between nodes fails what it had queued. A lease outlives the
   * session, so the Unlock is sent again by fence on a connection opened
   * for it (within the drain limit): resolves once that released the keys;
   * NotHeldError if they were not so held any more (the lease ran out, or
   * the first Unlock was applied though its answer was lost); `cause` if no
   * server could be reached, or the client was closed.
   */
  async unlockAgain(keys: string[], fence: bigint, cause: ConnectionLostError): Promise<void> {
    if (this.closed !== null) throw cause;
    try {
      await this.unlockOnNew(keys, fence, false);
    } catch (e) {
      if (e instanceof NotHeldError) throw e;
      throw cause;
    }
  }

  /** @internal A connection of the client's own (on a cluster, with a session of its own). */
  async openSide(signal: AbortSignal | undefined, forLock: boolean): Promise<Link> {
    if (this.link.err !== null) throw this.link.err;
    const ln = await Link.open(this.dialer, forLock ? 0 : 1, true, signal);
    ln.forLock = forLock;
    if (this.link.err !== null || this.closed !== null) {
      void ln.close("the client's connection ended");
      throw this.link.err ?? new ConnectionLostError("closed by the client");
    }
    this.side.add(ln);
    return ln;
  }

  /** @internal The Lock for a grant of `keys` under `fence` to a request sent at `sent` on `ln`: the client's connection, or one of the lock's own. */
  async granted(ln: Link, keys: string[], fence: bigint, o: LockOptions, sent: number, unclaim: (() => void) | null): Promise<Lock> {
    const own = ln !== this.link;
    const lease = o.lease ?? 0;
    // The safety deadline counts from the Lock's send time, which after a
    // long wait may be about to pass when the grant arrives, although the
    // server started the lease only at the grant. The answer cannot prove
    // when that was, so a lease is renewed and a lock without one pinged,
    // which moves the deadline to now.
    const t = now();
    const refresh = lease > 0 ? t - sent > lease / 3 : t - ln.fresh > ln.limits.sessionTimeout / 4;
    if (refresh) {
      try {
        if (lease > 0) {
          await ln.call(RequestType.Renew, { keys, fence, releaseMicro: toMicros(lease) });
          sent = t;
        } else {
          await ln.call(RequestType.Ping, undefined);
        }
      } catch (e) {
        // Nobody will hold this grant: release it.
        ln.detached(RequestType.Unlock, { keys, fence });
        unclaim?.();
        if (own) this.dropSide(ln);
        if (e instanceof NotHeldError) {
          throw new LockLostError("not-held", keys, fence, `the lease of ${lease} ms ran out before its grant could be renewed`, e);
        }
        throw e;
      }
    }
    const lock = new Lock(this, ln, own, keys, fence, lease, sent, o.keep !== false);
    // Its watchdog may find it lost already (a wait that outlasted its
    // deadline): it forgot itself then, and must not be remembered.
    if (!lock.lost.aborted) this.locks.add(lock);
    if (own) {
      ln.onEnd = (err, closing) => {
        if (closing) lock.setLost("closed", "the client was closed", err);
        else if (lock.lease === 0) lock.setLost("connection", err instanceof ConnectionLostError ? err.reason : String(err), err);
      };
    }
    if (ln.err !== null && lease === 0) lock.setLost("connection", String(ln.err), ln.err);
    return lock;
  }

  /**
   * A Lock in two steps: answered at once with the Lock when the keys are
   * free, or with a Queued place in line whose wait() collects the grant.
   * The request keeps its FIFO place meanwhile (on a cluster, across a
   * change of leader too); `wait` counts from now.
   *
   * A Queued on the client's connection holds back, while its wait() is
   * pending, the answers to calls made after it (answers come in request
   * order). An Enqueue whose key another lock of this client holds or asks
   * for is sent on a connection of its own, as a waiting Lock is.
   */
  async enqueue(keys: Keys, opts: LockOptions = {}): Promise<Lock | Queued> {
    const ks = keysOf(keys);
    const uniq = [...new Set(ks)];
    opts.signal?.throwIfAborted();
    if (this.link.err !== null) throw this.link.err;
    let ln = this.link;
    let unclaim: (() => void) | null = null;
    if (this.anyClaimed(uniq)) {
      ln = await this.openSide(opts.signal, true);
    } else {
      unclaim = this.claim(uniq);
    }
    let queued = false;
    const sent = now();
    let resp;
    try {
      resp = await ln.call(RequestType.Enqueue, lockBody(ks, opts, false), {
        signal: opts.signal,
        lockKeys: ks,
        queued: () => (queued = true),
        settled: unclaim ?? undefined,
      });
    } catch (e) {
      if (!queued) unclaim?.();
      if (ln !== this.link) {
        if (opts.signal?.aborted) {
          // Given up, as a waiting Lock: half-closed, so a grant (a lease
          // outlives the connection) that crossed is released by fence.
          this.drainAside(ln);
        } else {
          this.dropSide(ln);
        }
      }
      throw opts.wait === 0 ? busy(e) : e;
    }
    if (resp.status === ResponseStatus.Queued) {
      return new Queued(this, ln, ks, opts, sent, resp.ticket, resp.place, unclaim);
    }
    return this.granted(ln, ks, resp.fence, opts, sent, unclaim);
  }

  // -- by fence ---------------------------------------------------------------

  /** Releases `keys` held under `fence`, whichever connection took them: how a restarted process releases a lease it took earlier. NotHeldError (with the keys) if they are not so held. */
  async unlock(keys: Keys, fence: bigint): Promise<void> {
    await this.link.call(RequestType.Unlock, { keys: keysOf(keys), fence });
  }

  /** Sets the lease of `keys` held under `fence` to now + `lease` ms. NotHeldError (with the keys) if they are not so held. */
  async renew(keys: Keys, fence: bigint, lease: number): Promise<void> {
    await this.link.call(RequestType.Renew, { keys: keysOf(keys), fence, releaseMicro: toMicros(lease) });
  }

  /** Replaces the value of `keys` held under `fence` (what Inspect and Watch show). NotHeldError if they are not so held. */
  async proclaim(keys: Keys, fence: bigint, value: string | Uint8Array, link: Link = this.link): Promise<void> {
    await link.call(RequestType.Proclaim, { keys: keysOf(keys), fence, value: valueBytes(value) });
  }

  // -- looking ----------------------------------------------------------------

  /** A round trip to the server (ms). */
  async ping(opts: { signal?: AbortSignal } = {}): Promise<number> {
    const start = now();
    await this.link.call(RequestType.Ping, undefined, { signal: opts.signal });
    return now() - start;
  }

  /** Who holds and who waits for each of `keys`, in order. Changes nothing. */
  async inspect(keys: Keys, opts: { signal?: AbortSignal } = {}): Promise<KeyInfo[]> {
    const ks = keysOf(keys);
    if (ks.length === 0) throw new DlockError("dlock: inspect needs at least one key; stats() describes the server");
    const resp = await this.link.call(RequestType.Inspect, { keys: ks }, { signal: opts.signal });
    return resp.keyInfo.map(keyInfoOf);
  }

  /** The server's counts of connections, held keys, waiting requests, sessions and grants. */
  async stats(opts: { signal?: AbortSignal } = {}): Promise<ServerStats> {
    const resp = await this.link.call(RequestType.Inspect, {}, { signal: opts.signal });
    const s = resp.serverStats;
    return {
      connections: s?.connections ?? 0n,
      heldKeys: s?.heldKeys ?? 0n,
      waitingRequests: s?.waitingRequests ?? 0n,
      sessions: s?.sessions ?? 0n,
      grants: s?.grants ?? 0n,
      handoffs: s?.handoffs ?? 0n,
    };
  }

  /**
   * Waits until the first holder of `key` (the one with the lowest fence,
   * `holders[0]`) is not the one named by `known` (its fence and value;
   * absent: the key is free), or until `limit` ms pass (default 30 s, or
   * half the session timeout if shorter), and returns the key as it is
   * then: the server answers as soon as the change is applied (on a
   * cluster, committed). Compare `holders[0]` with what you knew to tell a
   * change from the limit.
   *
   * It runs on a connection of its own (kept for the next Watch), so it
   * holds back no other call; if the signal aborts, that connection is
   * closed and the server forgets the Watch. WatchLimitError when the
   * server has its most Watches parked.
   */
  async watch(
    key: string,
    known?: { fence: bigint; value?: string | Uint8Array } | null,
    opts: { limit?: number; signal?: AbortSignal } = {},
  ): Promise<KeyInfo> {
    const limit = opts.limit ?? Math.min(30_000, this.limits.sessionTimeout / 2);
    const body: Body = {
      keys: [key],
      fence: known?.fence ?? 0n,
      value: valueBytes(known?.value),
      waitMicro: toMicros(limit),
    };
    let w = this.watchers.pop();
    if (w === undefined || w.err !== null) w = await this.openSide(opts.signal, false);
    let resp;
    try {
      resp = await w.call(RequestType.Watch, body, { signal: opts.signal, counted: false });
    } catch (e) {
      // Abandoned or broken: a clean close withdraws the parked Watch.
      this.dropSide(w);
      throw e;
    }
    if (this.side.has(w) && this.watchers.length < 2 && this.link.err === null && this.closed === null) {
      this.watchers.push(w);
    } else {
      this.dropSide(w);
    }
    if (resp.keyInfo.length === 0) throw new ProtocolError("dlock: Watch answered without key_info");
    return keyInfoOf(resp.keyInfo[0]);
  }

  /** The election on `key` (see Election). */
  election(key: string): Election {
    return new Election(this, key);
  }
}
