/**
 * The dlock client for Node.js: one pipelined connection to a dlock server,
 * or to a cluster's leader with a session that rides through failovers.
 *
 * Each lock has an owner of its own: tasks (threads, goroutines) sharing one
 * client that lock the same key take turns, first come first served, exactly
 * as separate processes do; unrelated locks share the client's one
 * pipelined connection, and a lock whose key another lock of this client
 * holds, or that must wait, is taken on a connection of its own.
 *
 *     const client = await connect();            // DLOCK_SERVER, DLOCK_TOKEN
 *     await using lock = await client.lock("reports/daily", { lease: 30_000 });
 *     await work(lock.fence, lock.lost);          // lost: an AbortSignal
 *
 * @module
 */

export { connect, Client } from "./client.js";
export type { ConnectOptions, LockOptions, Keys } from "./client.js";
export { Lock } from "./lock.js";
export { CLOCK_RATE_BOUND } from "./rules.js";
export { Queued } from "./enqueue.js";
export { Election } from "./election.js";
export type { Leader } from "./election.js";
export { serverList, tlsFromEnv, tlsFiles, DEFAULT_SERVER, CLIENT_ALPN } from "./dial.js";
export type { TlsOptions } from "./dial.js";
export { silenceLimit } from "./liveness.js";
export { keepsSessionAlive } from "./link.js";
export type { ClientEvent, KeyHolder, KeyInfo, Limits, ServerStats } from "./types.js";
export * from "./errors.js";
