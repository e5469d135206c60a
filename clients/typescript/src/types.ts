// Plain values the client hands out: the server's limits, keys as Inspect
// and Watch see them, and session events. Durations are milliseconds, as
// everywhere in Node; fences are bigints (they are 64-bit, near 1.8e18: a
// number would lose them).

import type { KeyInfo as PbKeyInfo, ServerLimits } from "./gen/dlock_pb.js";

/** What the server said in answer to Hello. */
export interface Limits {
  /** The server may end a connection from which no request arrived for this long (ms), releasing its locks without a lease. On a cluster: the session's TTL. */
  sessionTimeout: number;
  maxLease: number;
  maxKeys: number;
  maxKeyLen: number;
  /** The largest request body the server takes; a larger one is refused here before sending. */
  maxFrame: number;
  maxPipeline: number;
  /** A cluster node, whose sessions outlive a broken connection for their TTL. */
  resumableSessions: boolean;
  /** A cluster node's election timeout (ms); 0 when it does not say. */
  electionTimeout: number;
}

/** Assumed for a server older than Hello (it answers InvalidType): its defaults and the 60 s idle timeout of those servers. */
export const legacyLimits: Limits = {
  sessionTimeout: 60_000,
  maxLease: 30 * 24 * 3600_000,
  maxKeys: 256,
  maxKeyLen: 1024,
  maxFrame: 16384,
  maxPipeline: 1024,
  resumableSessions: false,
  electionTimeout: 0,
};

export function limitsOf(l: ServerLimits | undefined): Limits {
  return {
    sessionTimeout: fromMicros(l?.sessionTimeoutMicro ?? 0n),
    maxLease: fromMicros(l?.maxLeaseMicro ?? 0n),
    maxKeys: l?.maxKeys ?? 0,
    maxKeyLen: l?.maxKeyLen ?? 0,
    maxFrame: l?.maxFrame ?? 0,
    maxPipeline: l?.maxPipeline ?? 0,
    resumableSessions: l?.resumableSessions ?? false,
    electionTimeout: fromMicros(l?.electionTimeoutMicro ?? 0n),
  };
}

/** Microseconds as milliseconds. */
export function fromMicros(us: bigint): number {
  return Number(us) / 1000;
}

/** Milliseconds in whole microseconds, at least 1 for a positive duration (a positive limit below a microsecond still means "a little", not "none"). */
export function toMicros(ms: number): bigint {
  if (!(ms > 0)) return 0n;
  if (!Number.isFinite(ms)) return 0n;
  return BigInt(Math.max(1, Math.floor(ms * 1000)));
}

/** One holder of a key. */
export interface KeyHolder {
  fence: bigint;
  /** Until its lease ends (ms); 0 when held without a lease. */
  leaseRemaining: number;
  /** Held by the connection (or session) that asked. */
  heldByCaller: boolean;
  /** Address of the holder's connection, when it is connected. */
  addr: string;
  value: Uint8Array;
  /** How long it has held (ms). */
  heldFor: number;
}

/** A key as Inspect or Watch saw it. */
export interface KeyInfo {
  key: string;
  /** Holders, by fence; empty when the key is free. The first is the one that has held it longest (of a key held exclusively, the only one). */
  holders: KeyHolder[];
  /** Holders the server left out (never the caller's), to keep its answer within 4 MiB. */
  holdersOmitted: number;
  shared: boolean;
  /** The limit the shared holders agreed on; 0 = none. */
  limit: number;
  waiters: number;
}

export function keyInfoOf(i: PbKeyInfo): KeyInfo {
  const holders: KeyHolder[] =
    i.holders.length > 0
      ? i.holders.map((h) => ({
          fence: h.fence,
          leaseRemaining: fromMicros(h.leaseRemainingMicro),
          heldByCaller: h.heldByCaller,
          addr: h.holderAddr,
          value: h.value,
          heldFor: fromMicros(h.heldMicro),
        }))
      : i.fence !== 0n
        ? [
            {
              fence: i.fence,
              leaseRemaining: fromMicros(i.leaseRemainingMicro),
              heldByCaller: i.heldByCaller,
              addr: i.holderAddr,
              value: i.value,
              heldFor: fromMicros(i.heldMicro),
            },
          ]
        : [];
  return {
    key: i.key,
    holders,
    holdersOmitted: i.holdersOmitted,
    shared: i.shared,
    limit: i.limit,
    waiters: i.waiters,
  };
}

/** The server's counts. */
export interface ServerStats {
  connections: bigint;
  heldKeys: bigint;
  waitingRequests: bigint;
  sessions: bigint;
  grants: bigint;
  handoffs: bigint;
}

/** A move of a client's session between cluster nodes. */
export interface ClientEvent {
  /** "reconnecting": the connection to `addr` broke (`reason` says how); "resumed": the session was resumed on `addr`, `after` ms after the break. */
  kind: "reconnecting" | "resumed";
  addr: string;
  session: bigint;
  reason?: string;
  after?: number;
}

/** Monotonic milliseconds: every deadline of the client is on this clock. */
export const now = (): number => performance.now();
