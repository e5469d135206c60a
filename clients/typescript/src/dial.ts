// Where to connect and how: the server list (DLOCK_SERVER), the token
// (DLOCK_TOKEN), TLS (DLOCK_TLS_CA, DLOCK_TLS_CERT, DLOCK_TLS_KEY, read as
// the dlock command and the other clients read them), and finding the node
// to use: on a cluster the leader, following the others' NotLeader answers,
// where a session is opened or resumed. Mirrors clients/go/dial.go.

import * as fs from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";
import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";
import type { Response } from "./gen/dlock_pb.js";
import {
  AccessDeniedError,
  ConnectError,
  ConnectionLostError,
  DlockError,
  NotOneClusterError,
  ServerError,
  TlsError,
  errorOf,
} from "./errors.js";
import type { Attempt } from "./errors.js";
import { FrameConn, PROTOCOL_VERSION, encodeFrame } from "./framing.js";
import type { RequestInit } from "./framing.js";
import { legacyLimits, limitsOf, now, toMicros } from "./types.js";
import type { ClientEvent, Limits } from "./types.js";
import type { NodeWatch } from "./liveness.js";
import { elsewhere } from "./rules.js";

/** dlock-server's default listen address. */
export const DEFAULT_SERVER = "127.0.0.1:7436";

// Ids of the handshake's requests: above the ids of calls, which count up
// from 1, so an answer can never be taken for another's.
export const HELLO_ID = 0xffff_ffff_ffff_ffffn;
const OPEN_SESSION_ID = 0xffff_ffff_ffff_fffen;

/** The shortest time one node gets to answer when there are several. */
const MIN_ATTEMPT = 500;
// The pause between rounds of the nodes: an election takes a few hundred
// milliseconds at best, and every pause adds to the failover.
const FIRST_PAUSE = 20;
const MAX_PAUSE = 250;

/**
 * Parses where to connect: one HOST:PORT, a cluster's nodes as a
 * comma-separated list, or an array of them. Empty: DLOCK_SERVER, else
 * 127.0.0.1:7436. Throws for an entry that is not HOST:PORT, naming it.
 */
export function serverList(servers?: string | string[]): string[] {
  let items: string[];
  if (servers === undefined || (typeof servers === "string" && servers.trim() === "")) {
    const env = process.env.DLOCK_SERVER ?? "";
    items = (env.trim() === "" ? DEFAULT_SERVER : env).split(",");
  } else {
    items = typeof servers === "string" ? servers.split(",") : servers;
  }
  const addrs: string[] = [];
  for (const raw of items) {
    const item = raw.trim();
    if (item === "") continue;
    splitAddr(item);
    addrs.push(item);
  }
  if (addrs.length === 0) throw new DlockError(`dlock: server list ${JSON.stringify(servers ?? "")} names no address`);
  return addrs;
}

/** Host and port of HOST:PORT ([::1]:7436 for IPv6). */
export function splitAddr(addr: string): { host: string; port: number } {
  const i = addr.lastIndexOf(":");
  let host = i > 0 ? addr.slice(0, i) : "";
  const port = Number(addr.slice(i + 1));
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  if (i <= 0 || host === "" || !Number.isInteger(port) || port <= 0 || port > 65535 || !/^\d+$/.test(addr.slice(i + 1))) {
    throw new DlockError(`dlock: server ${JSON.stringify(addr)} is not HOST:PORT`);
  }
  return { host, port };
}

/**
 * The TLS protocol name (ALPN) this client offers when the TLS options name
 * none: dlock_proto::tls::CLIENT_ALPN, which the Rust client offers too.
 */
export const CLIENT_ALPN = "dlock";

/**
 * Whether a handshake failed on the server's alert no_application_protocol
 * (120): OpenSSL's code ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL, or its
 * words where the code is another.
 */
function noApplicationProtocol(e: unknown): boolean {
  const err = e as { code?: unknown; message?: unknown };
  return (
    err?.code === "ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL" ||
    (typeof err?.message === "string" && /alert no application protocol|alert number 120/.test(err.message))
  );
}

/**
 * OpenSSL's words for a handshake's error, "ssl: tlsv1 alert no
 * application protocol", rather than its whole line of codes and sources.
 */
function tlsDetail(e: unknown): string {
  const err = e as { reason?: unknown; message?: unknown };
  return typeof err?.reason === "string" && err.reason !== "" ? `ssl: ${err.reason}` : String(err?.message);
}

/** TLS settings: node:tls's connection options (ca, cert, key, ...). */
export type TlsOptions = Omit<tls.ConnectionOptions, "socket" | "host" | "port">;

/**
 * The TLS settings DLOCK_TLS_CA, DLOCK_TLS_CERT and DLOCK_TLS_KEY describe
 * (PEM files: the CA that signed the server's certificate, and this
 * client's certificate and key for a server that asks for one); null (plain
 * TCP) when DLOCK_TLS_CA is unset.
 */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env): TlsOptions | null {
  return tlsFiles(env.DLOCK_TLS_CA || undefined, env.DLOCK_TLS_CERT || undefined, env.DLOCK_TLS_KEY || undefined);
}

/** TLS that trusts the CA in the PEM file `ca` and, with `cert` and `key`, presents that certificate (mutual TLS). TLS 1.2 at least. */
export function tlsFiles(ca?: string, cert?: string, key?: string): TlsOptions | null {
  if ((cert === undefined) !== (key === undefined)) {
    throw new DlockError("dlock: a TLS client certificate and its key go together (DLOCK_TLS_CERT, DLOCK_TLS_KEY)");
  }
  if (ca === undefined) {
    if (cert !== undefined) {
      throw new DlockError("dlock: a TLS client certificate needs a CA to verify the server with (DLOCK_TLS_CA)");
    }
    return null;
  }
  const opts: TlsOptions = { ca: fs.readFileSync(ca), minVersion: "TLSv1.2" };
  if (cert !== undefined && key !== undefined) {
    opts.cert = fs.readFileSync(cert);
    opts.key = fs.readFileSync(key);
  }
  return opts;
}

/** A stream to a node, ready for a link. */
export interface Established {
  conn: FrameConn;
  addr: string;
  limits: Limits;
  /** The session opened or resumed; 0 on a single server. */
  session: bigint;
  /** When the last request of the handshake was sent: the server (and the session) was alive no earlier. */
  ackedFrom: number;
}

/** Why one node did not serve. */
interface NodeFailure {
  error: Error;
  notLead?: boolean;
  leader?: string;
  /** The cluster no longer knows the session. */
  gone?: boolean;
  /** No use trying any other node: access denied, a bad argument. */
  fatal?: boolean;
  answered?: boolean;
}

export interface DialerOptions {
  addrs: string[];
  token: string;
  tls: TlsOptions | null;
  connectTimeout: number;
  sessionTTL: number;
  onEvent?: (e: ClientEvent) => void;
}

/** What every connect and reconnect of a client needs: where, how, and whom to tell. It holds no connection. */
export class Dialer {
  readonly addrs: string[];
  readonly token: string;
  readonly tls: TlsOptions | null;
  readonly connectTimeout: number;
  readonly sessionTTL: number;
  private readonly onEventCb?: (e: ClientEvent) => void;
  /** The node that last opened or resumed a session: tried first, since it was the leader. */
  leader = "";
  /** Nodes a probe found silent that have not answered since: tried last (liveness.ts). */
  readonly suspects = new Set<string>();
  readonly watches = new Map<string, NodeWatch>();
  /** Aborted by the client's close: connects and resumes in progress give up. */
  readonly closing = new AbortController();

  constructor(o: DialerOptions) {
    this.addrs = o.addrs;
    this.token = o.token;
    this.tls = o.tls;
    this.connectTimeout = o.connectTimeout;
    this.sessionTTL = o.sessionTTL;
    this.onEventCb = o.onEvent;
  }

  event(e: ClientEvent): void {
    if (this.onEventCb === undefined) return;
    // On a turn of its own: a callback that throws must not break the client.
    queueMicrotask(() => {
      try {
        this.onEventCb?.(e);
      } catch {
        // the program's own bug; the client goes on
      }
    });
  }

  suspect(addr: string, silent: boolean): void {
    if (silent) {
      this.suspects.add(addr);
      if (this.leader === addr) this.leader = "";
    } else {
      this.suspects.delete(addr);
    }
  }

  /**
   * Connects to a node among the servers before `deadline`: on a cluster
   * the leader, opening a session (session 0) or resuming `session`. Tried
   * in order: `prefer` (a leader some node named), the last known leader,
   * the servers in order, suspects last; each leader a node names right
   * after that node. `avoid` (a node just found silent) comes last and only
   * with at most MIN_ATTEMPT, in a round where no other node answered or
   * the others name it leader.
   *
   * persist: keep going round the servers until the deadline (a session to
   * resume). Otherwise (a new client) stop after a round in which no node
   * answered at all, so that a dead server is reported at once.
   *
   * afterClose: the client's close() does not stop it (the release of a
   * late grant, which close() waits for); `signal` must bound it then.
   */
  async establish(
    session: bigint,
    deadline: number,
    persist: boolean,
    prefer = "",
    avoid = "",
    signal?: AbortSignal,
    afterClose = false,
  ): Promise<Established> {
    let attempts: Attempt[] = [];
    let pause = FIRST_PAUSE;
    const n = this.addrs.length;
    const perNode = n > 1 ? Math.max(this.connectTimeout / n, MIN_ATTEMPT) : this.connectTimeout;
    const stop = afterClose ? anySignal(signal) : anySignal(signal, this.closing.signal);
    for (;;) {
      const queue: string[] = [];
      const quiet: string[] = [];
      const seen = new Set<string>();
      const add = (a: string) => {
        if (a !== "" && a !== avoid && !seen.has(a)) {
          seen.add(a);
          (this.suspects.has(a) ? quiet : queue).push(a);
        }
      };
      add(prefer);
      add(this.leader);
      for (const a of this.addrs) add(a);
      queue.push(...quiet);
      const tried = new Set<string>();
      let answered = false;
      let namedAvoided = false;
      while (queue.length > 0 || (avoid !== "" && (namedAvoided || !answered) && !tried.has(avoid))) {
        const addr = queue.length > 0 ? (queue.shift() as string) : avoid;
        if (tried.has(addr)) continue;
        tried.add(addr);
        const t = now();
        if (t >= deadline && attempts.length > 0) break;
        let share = perNode;
        if (addr === avoid && share > MIN_ATTEMPT) share = MIN_ATTEMPT;
        share = Math.max(1, Math.min(share, deadline - t));
        stop.throwIfAborted();
        const r = await this.tryNode(addr, session, share, stop);
        if ("conn" in r) {
          if (r.session !== 0n) this.leader = addr;
          return r;
        }
        stop.throwIfAborted();
        if (r.gone) {
          throw new ConnectionLostError(`session ${session} has ended: its locks without a lease may be another's`, r.error);
        }
        if (r.fatal) throw r.error;
        answered = answered || r.answered === true;
        attempts.push({ addr, error: r.error });
        if (r.notLead && r.leader === avoid && avoid !== "") {
          namedAvoided = true;
        } else if (r.notLead && r.leader) {
          queue.unshift(r.leader);
        } else if ((!r.answered || r.notLead) && this.leader === addr) {
          // A dead old leader (or one that says it leads no more, or is
          // stopping) must not cost every round its time.
          this.leader = "";
        }
      }
      const t = now();
      if (t >= deadline || (!persist && !answered)) throw unreachable(attempts);
      // An election takes a few heartbeats: do not hammer the nodes.
      await sleep(Math.min(pause, deadline - t), stop, true);
      pause = Math.min(pause * 2, MAX_PAUSE);
      if (attempts.length > 4 * n) attempts = attempts.slice(attempts.length - 4 * n);
    }
  }

  /** Connects to `addr` within `limit` ms, asks its limits and, on a cluster node, opens or resumes the session there. */
  private async tryNode(addr: string, session: bigint, limit: number, signal: AbortSignal): Promise<Established | NodeFailure> {
    const deadline = now() + limit;
    let stage = "connect";
    let conn: FrameConn;
    try {
      conn = await this.connect(addr, deadline, signal);
    } catch (e) {
      // A TLS setup that does not fit the server's is the same on every
      // node: not tried elsewhere, the user has an option to change.
      return { error: e as Error, fatal: e instanceof TlsError };
    }
    let ok = false;
    try {
      const failed = (err: Error, answered: boolean): NodeFailure => {
        if (err instanceof TimeoutError) err = new Error(`no answer to ${stage} within ${Math.round(limit)} ms`);
        return { error: new Error(`${addr}: ${err.message}`, { cause: err }), answered };
      };
      stage = "Hello";
      const helloSent = now();
      let resp: Response;
      try {
        resp = await exchange(conn, { version: PROTOCOL_VERSION, id: HELLO_ID, accessToken: this.token, type: RequestType.Hello }, deadline, signal);
      } catch (e) {
        let err = e as Error;
        if (this.tls === null && /closed/.test(err.message)) {
          err = new Error(`${err.message} (if the server speaks TLS, set DLOCK_TLS_CA)`);
        }
        return failed(err, false);
      }
      let limits: Limits;
      if (resp.status === ResponseStatus.Ok) {
        limits = limitsOf(resp.limits);
      } else if (resp.status === ResponseStatus.InvalidType) {
        limits = { ...legacyLimits }; // a server older than Hello: assume its defaults
      } else {
        const e = errorOf(RequestType.Hello, resp) as ServerError;
        // Not "answered": a node that turns clients away (LimitReached,
        // ShuttingDown) is no reason to go round the nodes again.
        return { error: e, fatal: e instanceof AccessDeniedError };
      }
      if (!limits.resumableSessions) {
        // Several addresses must be one cluster's nodes: a single server
        // among them shares no locks with the rest, and a client that fell
        // back to it from a node that is down would lock beside a holder of
        // the same key there. (Resuming, it is just a node that cannot
        // serve, below.)
        if (session === 0n && this.addrs.length > 1) {
          return { error: new NotOneClusterError(addr), fatal: true };
        }
        if (session !== 0n) {
          return { error: new Error(`${addr} is not a cluster node: it cannot resume a session`), answered: true };
        }
        ok = true;
        return { conn, addr, limits, session: 0n, ackedFrom: helloSent };
      }
      stage = "OpenSession";
      const open: RequestInit = {
        version: PROTOCOL_VERSION,
        id: OPEN_SESSION_ID,
        accessToken: this.token,
        type: RequestType.OpenSession,
        session,
        sessionTtlMicro: this.sessionTTL > 0 ? toMicros(this.sessionTTL) : 0n,
      };
      const sent = now();
      try {
        resp = await exchange(conn, open, deadline, signal);
      } catch (e) {
        return failed(e as Error, false);
      }
      if (resp.status === ResponseStatus.Ok) {
        ok = true;
        if (resp.sessionTtlMicro > 0n) limits.sessionTimeout = Number(resp.sessionTtlMicro) / 1000;
        return { conn, addr, limits, session: resp.session, ackedFrom: sent };
      }
      if (resp.status === ResponseStatus.AccessDenied || resp.status === ResponseStatus.InvalidArgument) {
        return { error: errorOf(RequestType.OpenSession, resp) as Error, fatal: true };
      }
      const away = elsewhere(resp.status, resp.leaderAddr || null);
      if (away?.means === "not_leader") {
        // Stopping (a rolling restart) is as a node that does not lead, and
        // names no leader, so it is not tried first again.
        let why = "not the leader, and no leader is known yet";
        if (resp.status === ResponseStatus.ShuttingDown) why = "shutting down";
        else if (away.leader !== null) why = `not the leader (the leader is ${away.leader})`;
        return { error: new Error(`${addr}: ${why}`), notLead: true, leader: away.leader ?? "", answered: true };
      }
      if (away?.means === "session_ended" && session !== 0n) {
        return { error: errorOf(RequestType.OpenSession, resp) as Error, gone: true };
      }
      // Unavailable (no quorum) and other refusals: look on.
      return { error: errorOf(RequestType.OpenSession, resp) as Error, answered: true };
    } finally {
      // Until the node has answered, an attempt given up ends with a reset:
      // a clean close would end a session the node may just have resumed.
      if (!ok) conn.reset();
    }
  }

  /** The TCP (and TLS) connection to `addr` by `deadline`. */
  async connect(addr: string, deadline: number, signal?: AbortSignal, unref = false): Promise<FrameConn> {
    const { host, port } = splitAddr(addr);
    const raw = net.connect({ host, port, noDelay: true, keepAlive: true, keepAliveInitialDelay: 10_000 });
    if (unref) raw.unref();
    let socket: net.Socket = raw;
    try {
      await settle(raw, "connect", deadline, signal, `connect to ${addr}`);
      if (this.tls !== null) {
        const opts: tls.ConnectionOptions = { ...this.tls, socket: raw, host };
        // Offer dlock's TLS protocol name, as the Rust client does: a
        // client port names none and takes any client, a cluster's TLS peer
        // port refuses it at once (no_application_protocol), by which a
        // client given that port is told so. Options that name protocols
        // of their own are left as the user gave them.
        if (opts.ALPNProtocols === undefined) opts.ALPNProtocols = [CLIENT_ALPN];
        // The server's certificate must name the host dialled; an IP
        // literal is checked against its IP names (and sent as no SNI).
        if (opts.servername === undefined && net.isIP(host) === 0) opts.servername = host;
        const ts = tls.connect(opts);
        socket = ts;
        try {
          await settle(ts, "secureConnect", deadline, signal, `TLS handshake with ${addr}`);
        } catch (e) {
          if (noApplicationProtocol(e)) throw new TlsError("not-a-client-port", addr, tlsDetail(e), e);
          throw new Error(`TLS handshake with ${addr} failed: ${(e as Error).message}${certificateHint(e, host)}`, { cause: e });
        }
      }
    } catch (e) {
      socket.destroy();
      try {
        raw.resetAndDestroy();
      } catch {
        raw.destroy();
      }
      throw e;
    }
    return new FrameConn(socket, raw);
  }
}

/** OpenSSL's codes, as Node gives them, of a server certificate no trusted CA signed. */
const UNTRUSTED = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_SIGNATURE_FAILURE",
]);

/**
 * What to change when the handshake failed on the server's certificate, as
 * " (...)" after Node's words, else "" (as with_certificate_hint of
 * src/transport.rs in the Rust client).
 */
function certificateHint(e: unknown, host: string): string {
  const code = (e as { code?: unknown }).code;
  if (typeof code !== "string") return "";
  if (UNTRUSTED.has(code)) {
    return " (the server's certificate is not signed by the CA this client trusts: give tls.ca (DLOCK_TLS_CA) the CA file that signed it, the ca.pem of `dlock-server cert`)";
  }
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    return ` (the server's certificate does not name ${host}: dial a name or address it holds, or give the server a certificate for ${host} (dlock-server cert create-node NAME --addr ${host}))`;
  }
  if (code === "CERT_HAS_EXPIRED" || code === "CERT_NOT_YET_VALID") {
    return " (the server's certificate is not valid now (expired, or the clocks disagree): renew it (dlock-server cert create-node) and send the server SIGHUP)";
  }
  return "";
}

/** A deadline that passed while waiting for a node. */
export class TimeoutError extends Error {}

/** Waits for `event` on `socket` until `deadline`. */
function settle(socket: net.Socket, event: string, deadline: number, signal: AbortSignal | undefined, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const done = (err?: Error) => {
      clearTimeout(timer);
      socket.off(event, onOk);
      socket.off("error", onErr);
      socket.off("close", onClose);
      signal?.removeEventListener("abort", onAbort);
      if (err) reject(err);
      else resolve();
    };
    const onOk = () => done();
    const onErr = (e: Error) => done(e);
    const onClose = () => done(new Error(`${what}: the connection closed`));
    const onAbort = () => done(signal?.reason instanceof Error ? signal.reason : new Error("aborted"));
    socket.once(event, onOk);
    socket.once("error", onErr);
    socket.once("close", onClose);
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    timer = setTimeout(() => done(new TimeoutError(`no answer to ${what} within the time given`)), Math.max(0, deadline - now()));
  });
}

/** Sends `req` and reads its answer, before a link takes the stream. */
export async function exchange(conn: FrameConn, req: RequestInit, deadline: number, signal?: AbortSignal): Promise<Response> {
  conn.write(encodeFrame(req));
  const answer = conn.next();
  // Rejected later when the stream is given up after a timeout: nobody waits then.
  answer.catch(() => {});
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    const resp = await Promise.race([
      answer,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new TimeoutError("no answer in time")), Math.max(0, deadline - now()));
        if (signal !== undefined) {
          onAbort = () => reject(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
          if (signal.aborted) onAbort();
          else signal.addEventListener("abort", onAbort, { once: true });
        }
      }),
    ]);
    // request_id 0 with an error: the server turned the connection away
    // (too many connections) before reading anything.
    if (resp.requestId !== req.id && !(resp.requestId === 0n && resp.status !== ResponseStatus.Ok)) {
      throw new Error(`answer to request ${resp.requestId}, expected ${req.id}`);
    }
    return resp;
  } finally {
    clearTimeout(timer);
    if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
  }
}

/** The error for a connect that found no node: with one attempt that a server refused, that refusal itself. */
function unreachable(attempts: Attempt[]): Error {
  if (attempts.length === 1 && attempts[0].error instanceof ServerError) return attempts[0].error;
  // The latest reason for each address, in the order first tried.
  const latest: Attempt[] = [];
  for (const a of attempts) {
    const i = latest.findIndex((l) => l.addr === a.addr);
    if (i >= 0) latest[i] = { addr: a.addr, error: a.error };
    else latest.push(a);
  }
  return new ConnectError(latest);
}

/** Waits `ms`, or rejects with the signal's reason. `ref`: keeps the process alive meanwhile. */
export function sleep(ms: number, signal?: AbortSignal, ref = false): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    if (!ref) t.unref();
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A signal aborted when any of `signals` is. */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  const given = signals.filter((s): s is AbortSignal => s !== undefined);
  if (given.length === 1) return given[0];
  return AbortSignal.any(given);
}
