// Errors of the dlock client, every one a DlockError (test with instanceof).
//
// A refusal by the server is a ServerError of the class of its status
// (AcquireTimeoutError, NotHeldError, ...: one class per ResponseStatus of
// proto/dlock.proto but Ok and Queued, which are no errors), carrying the
// status, the server's error_text, which names the key, limit or option at
// fault, and the keys the answer lists. A broken connection (on a cluster: a
// session that ended) is a ConnectionLostError, a connect that found no
// server a ConnectError naming every address tried, a list of servers that
// is no cluster a NotOneClusterError, a lock that can no longer be assumed
// held a LockLostError.

import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";
import type { Response } from "./gen/dlock_pb.js";

export { RequestType, ResponseStatus };

/** The base class of every error of this package. */
export class DlockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A request the server refused: its status, its explanation and the keys it lists. */
export class ServerError extends DlockError {
  /** The type of the request refused. */
  readonly request: RequestType;
  readonly status: ResponseStatus;
  /** The server's error_text: names the key, limit or option at fault. */
  readonly text: string;
  /** Busy keys (AcquireTimeout), keys not held (NotHeld), keys in conflict (ModeConflict, LimitMismatch). */
  readonly keys: string[];
  /** The leader's address a NotLeader answer names, when known. */
  readonly leader: string;

  constructor(request: RequestType, status: ResponseStatus, text: string, keys: string[] = [], leader = "") {
    let message = `dlock: ${RequestType[request] ?? request} refused: ${ResponseStatus[status] ?? status}`;
    if (text) message += `: ${text}`;
    if (keys.length > 0 && !text.includes(keys[0])) message += ` (keys ${JSON.stringify(keys)})`;
    super(message);
    this.request = request;
    this.status = status;
    this.text = text;
    this.keys = keys;
    this.leader = leader;
  }
}

/** The frame did not decode as a Request (a bug in a client). */
export class GeneralError extends ServerError {}
/** The request's version is neither 0 nor 2. */
export class VersionError extends ServerError {}
/** The request type is unknown to the server (for Hello: an older server). */
export class InvalidTypeError extends ServerError {}
/** The token (DLOCK_TOKEN) is missing or wrong, or has no rule for these keys. */
export class AccessDeniedError extends ServerError {}
/** The server is stopping; nothing was done. */
export class ShuttingDownError extends ServerError {}
/** A server-wide limit (connections, waiters, held keys, tickets) is reached. */
export class LimitReachedError extends ServerError {}
/** The request is over the server's max_frame (refused here before sending, or by the server, which then closes the connection). */
export class FrameTooLargeError extends ServerError {}
/** Cluster: this node does not lead and did nothing (the client follows it by itself). */
export class NotLeaderError extends ServerError {}
/** Cluster: the request could not be committed in time (the client sends it again by itself). */
export class UnavailableError extends ServerError {}
/** More keys than the server's max_keys. */
export class TooManyKeysError extends ServerError {}
/** An empty key or one over max_key_len bytes. */
export class InvalidKeyError extends ServerError {}
/** The request names no keys. */
export class NoKeysError extends ServerError {}
/** An option is out of range, or options contradict each other. */
export class InvalidArgumentError extends ServerError {}
/** Keys still busy when the wait ran out; `keys` lists them. */
export class AcquireTimeoutError extends ServerError {}
/** A lock that was not to wait (`wait: 0`) found keys busy; `keys` lists them. */
export class BusyError extends AcquireTimeoutError {}
/** Unlock, Renew or Proclaim named keys not held (under that fence); `keys` lists them. */
export class NotHeldError extends ServerError {}
/** The session ended (on a cluster: its TTL ran out, or it was closed): its locks without a lease may be another's. */
export class UnknownSessionError extends ServerError {}
/** The keys (listed) are held or asked for in the other mode (shared against exclusive) by the same owner. */
export class ModeConflictError extends ServerError {}
/** The keys (listed) are shared under another limit by their holders and waiters. */
export class LimitMismatchError extends ServerError {}
/** A Wait named a ticket the session does not hold. */
export class UnknownTicketError extends ServerError {}
/** A value over 1024 bytes. */
export class ValueTooLargeError extends ServerError {}
/** The server has its most Watches parked, or Watch is off. */
export class WatchLimitError extends ServerError {}

type ServerErrorClass = new (
  request: RequestType,
  status: ResponseStatus,
  text: string,
  keys?: string[],
  leader?: string,
) => ServerError;

/** The class of each status that is an error. */
export const errorClasses: Partial<Record<ResponseStatus, ServerErrorClass>> = {
  [ResponseStatus.General]: GeneralError,
  [ResponseStatus.Version]: VersionError,
  [ResponseStatus.InvalidType]: InvalidTypeError,
  [ResponseStatus.AccessDenied]: AccessDeniedError,
  [ResponseStatus.ShuttingDown]: ShuttingDownError,
  [ResponseStatus.LimitReached]: LimitReachedError,
  [ResponseStatus.FrameTooLarge]: FrameTooLargeError,
  [ResponseStatus.NotLeader]: NotLeaderError,
  [ResponseStatus.Unavailable]: UnavailableError,
  [ResponseStatus.TooManyKeys]: TooManyKeysError,
  [ResponseStatus.InvalidKey]: InvalidKeyError,
  [ResponseStatus.NoKeys]: NoKeysError,
  [ResponseStatus.InvalidArgument]: InvalidArgumentError,
  [ResponseStatus.AcquireTimeout]: AcquireTimeoutError,
  [ResponseStatus.NotHeld]: NotHeldError,
  [ResponseStatus.UnknownSession]: UnknownSessionError,
  [ResponseStatus.ModeConflict]: ModeConflictError,
  [ResponseStatus.LimitMismatch]: LimitMismatchError,
  [ResponseStatus.UnknownTicket]: UnknownTicketError,
  [ResponseStatus.ValueTooLarge]: ValueTooLargeError,
  [ResponseStatus.WatchLimit]: WatchLimitError,
};

/** The error for an answer with `status`, of its class (a ServerError for a status this client does not know). */
export function serverError(
  request: RequestType,
  status: ResponseStatus,
  text: string,
  keys: string[] = [],
  leader = "",
): ServerError {
  const Class = errorClasses[status] ?? ServerError;
  return new Class(request, status, text, keys, leader);
}

/** The error for a non-Ok answer to a request of type `kind`; null for Ok (and Queued to an Enqueue). */
export function errorOf(kind: RequestType, resp: Response): ServerError | null {
  if (resp.status === ResponseStatus.Ok) return null;
  if (resp.status === ResponseStatus.Queued && kind === RequestType.Enqueue) return null;
  return serverError(kind, resp.status, resp.errorText, [...resp.keys], resp.leaderAddr);
}

/**
 * The connection (on a cluster: the session) ended: every call pending on
 * it, and every later one, fails with this. The server released every lock
 * it held without a lease.
 */
export class ConnectionLostError extends DlockError {
  readonly reason: string;
  constructor(reason: string, cause?: unknown) {
    const detail = cause instanceof Error && !reason.includes(cause.message) ? `: ${cause.message}` : "";
    super(`dlock: connection lost: ${reason}${detail}`, cause === undefined ? undefined : { cause });
    this.reason = reason;
  }
}

/** One address tried while connecting, and why it did not serve. */
export interface Attempt {
  addr: string;
  error: Error;
}

/**
 * A connect (or a session's resume) that found no server to use: every
 * address tried and why each failed. With one attempt whose error is a
 * ServerError (AccessDenied, LimitReached), that error is thrown instead.
 */
export class ConnectError extends DlockError {
  readonly attempts: Attempt[];
  constructor(attempts: Attempt[]) {
    const parts = attempts.map((a) => `${a.addr}: ${a.error.message}`);
    super(parts.length === 0 ? "dlock: no server to connect to" : `dlock: no server reachable: ${parts.join("; ")}`);
    this.attempts = attempts;
  }
}

/** What a TlsError found. */
export type TlsProblem =
  /**
   * The server's TLS refused the protocol name (ALPN) "dlock" this client
   * offers, with the alert no_application_protocol: it is no dlock client
   * port, most likely a cluster node's peer port (its --peer-listen), which
   * names its own.
   */
  "not-a-client-port";

/**
 * A connect whose TLS setup does not fit the server's; the message says
 * what to change. Thrown as it is, without trying the other servers (a
 * cluster's nodes share their TLS setup): a ConnectError whose one attempt
 * is this address. Its `cause` is node:tls's error.
 */
export class TlsError extends ConnectError {
  readonly problem: TlsProblem;
  readonly addr: string;
  /** What the handshake found, in node:tls's words. */
  readonly detail: string;
  constructor(problem: TlsProblem, addr: string, detail: string, cause?: unknown) {
    // The words of the Rust client's Error::NotAClientPort.
    const text = `dlock: the server at ${addr} refuses dlock's TLS protocol name (${detail}): it is no dlock client port, most likely a cluster node's peer port (its --peer-listen): give a client port instead (a node's --listen)`;
    super([{ addr, error: new Error(text) }]);
    this.message = text;
    if (cause !== undefined) (this as { cause?: unknown }).cause = cause;
    this.problem = problem;
    this.addr = addr;
    this.detail = detail;
  }
}

/**
 * Several servers were given, and the one that answered is a single
 * server, not a node of a cluster (its Hello limits do not say
 * resumableSessions). A list must name one cluster's nodes: single servers
 * share no locks, so a client that moved on to the next when the first was
 * down would lock beside a holder of the same key on the first. Thrown at
 * once, without trying the other servers. The Rust client's
 * Error::NotOneCluster, in its words.
 */
export class NotOneClusterError extends DlockError {
  /** The single server's address. */
  readonly addr: string;
  constructor(addr: string) {
    super(
      `dlock: ${addr} is a single server, not a cluster node: several addresses must be the nodes of one cluster, since single servers share no locks (give this server's address alone)`,
    );
    this.addr = addr;
  }
}

/** Why a lock can no longer be assumed held. */
export type LostReason =
  /** The connection (session) of a lock without a lease ended: the server released it. */
  | "connection"
  /** No answer from the server proves the lock held much longer: its safety deadline is within the margin. */
  | "deadline"
  /** The server says the keys are not held under this fence (the lease ran out, or someone released it by fence). */
  | "not-held"
  /** The server refused to renew the lease for another reason. */
  | "renew-refused"
  /** The client was closed. */
  | "closed";

/** A lock can no longer be assumed held: `Lock.lost` is aborted with this as its reason. */
export class LockLostError extends DlockError {
  readonly kind: LostReason;
  readonly keys: string[];
  readonly fence: bigint;
  readonly text: string;
  constructor(kind: LostReason, keys: string[], fence: bigint, text: string, cause?: unknown) {
    super(`dlock: lock on ${JSON.stringify(keys)} (fence ${fence}) lost: ${text}`, cause === undefined ? undefined : { cause });
    this.kind = kind;
    this.keys = keys;
    this.fence = fence;
    this.text = text;
  }
}

/** The server sent something this client cannot understand. */
export class ProtocolError extends DlockError {}
