// Noticing that a cluster node has gone silent, even while every request on
// a link waits rightly (a Lock in line holds back the answers behind it,
// Pings included). Mirrors clients/go/liveness.go and src/liveness.rs.
//
// A node that stalls instead of dying (SIGSTOP, a VM freeze, an fsync
// stall) or sits behind a path that drops packets without a reset keeps its
// sockets open and says nothing. The rest of the cluster replaces it as
// leader within 3 to 4 election timeouts, and from then on nobody keeps the
// client's session alive: it must resume on the new leader well within the
// session's TTL. The links' own answers cannot tell in time (they come in
// request order), so one probe per client and node pings on a connection of
// its own, with no session, which the node answers at once without a
// commit. When a Ping (or the probe's Hello) goes unanswered for the silence
// limit, every link on that node that has not heard from it within the
// limit either (rules.ts's goneSilent) breaks off and resumes its session
// elsewhere, and the node is tried last until it answers again; a link that
// heard within the limit stays, but goes as soon as it too has heard
// nothing for the limit, unless the probe has been answered since (the
// probe counts its answers: NodeWatch.answered). A Ping answered
// Unavailable sends every link on it away at once, whatever they heard
// (the node said it cannot serve). A node that refuses the probe outright
// (down, full, access denied) is left to the links, which see that
// themselves. The probe's sockets and timers keep no process alive: the
// links' sockets do.

import { RequestType, ResponseStatus } from "./gen/dlock_pb.js";
import { HELLO_ID, TimeoutError, exchange, sleep } from "./dial.js";
import type { Dialer } from "./dial.js";
import { PROTOCOL_VERSION } from "./framing.js";
import type { FrameConn } from "./framing.js";
import { now } from "./types.js";
import { millis, nanos, silenceLimit as silenceLimitNs } from "./rules.js";
/** The longest pause between probe attempts on a node that refuses them. */
const MAX_PROBE_RETRY = 5000;

/**
 * How long a node may leave a probe unanswered before it is taken for gone
 * (ms): three election timeouts (by then the others have replaced it if it
 * led; 0: the node states none), at least 1.5 s, at most a quarter of the
 * session's TTL (which wins: a short TTL must leave room to resume), so that
 * finding a new leader and resuming there fit in what is left; but never
 * below 250 ms, so that a node stating no TTL does not make the probe spin.
 * In milliseconds; rules.ts's silenceLimit is the rule, in nanoseconds (as
 * rules::silence_limit in src/rules.rs; the shared vectors,
 * test/rules.test.ts, hold them together).
 */
export function silenceLimit(election: number, ttl: number): number {
  return millis(silenceLimitNs(election > 0 ? nanos(election) : null, nanos(Math.max(ttl, 0))));
}

/** What one round of probing found: `silent` (or, with `cannotServe`, answered Unavailable) after `waited` ms. */
interface Finding {
  silent: boolean;
  waited: number;
  cannotServe?: boolean;
}

/** What a probe tells: a link on the node. */
export interface Watched {
  /** `cannotServe`: the node answered Unavailable, rather than nothing. */
  nodeSilent(addr: string, waited: number, cannotServe: boolean): void;
}

/** The probe of one node, shared by every link of a client on it; it stops when the last link lets go. */
export class NodeWatch {
  readonly links = new Set<Watched>();
  private readonly stop = new AbortController();
  private answers = 0;

  constructor(
    private readonly dialer: Dialer,
    readonly addr: string,
    private readonly limit: number,
  ) {
    this.run().catch(() => {
      // stopped
    });
  }

  /**
   * How many of the probe's Hellos and Pings the node answered so far: a
   * link that outlived a silence report learns from it that the node
   * answers again.
   */
  get answered(): number {
    return this.answers;
  }

  /** Lets go of the probe; the last link stops it. */
  unsubscribe(l: Watched): void {
    this.links.delete(l);
    if (this.links.size === 0 && this.dialer.watches.get(this.addr) === this) {
      this.dialer.watches.delete(this.addr);
      this.stop.abort();
    }
  }

  private async run(): Promise<void> {
    let retry = this.limit / 2;
    while (!this.stop.signal.aborted) {
      const { silent, waited, cannotServe } = await this.untilSilent();
      if (this.stop.signal.aborted) return;
      if (silent) {
        this.dialer.suspect(this.addr, true);
        for (const l of [...this.links]) l.nodeSilent(this.addr, waited, cannotServe === true);
        retry = this.limit / 2;
      } else {
        retry = Math.min(retry * 2, MAX_PROBE_RETRY);
      }
      await sleep(retry, this.stop.signal);
    }
  }

  /**
   * Pings the node on a connection of the probe's own, a third of the limit
   * apart, until an answer is the limit late: silent. Not silent when the
   * node refuses or the connection breaks (that is no silence) or the probe
   * is stopped. Each answer that shows the node serving is counted
   * (answered).
   */
  private async untilSilent(): Promise<Finding> {
    const signal = this.stop.signal;
    const started = now();
    let conn: FrameConn;
    try {
      conn = await this.dialer.connect(this.addr, started + this.limit, signal, true);
    } catch {
      const waited = now() - started;
      return { silent: !signal.aborted && waited >= this.limit, waited };
    }
    // No session on it: a clean close ends nothing.
    conn.socket.unref();
    try {
      return await this.ping(conn, started);
    } finally {
      conn.destroy();
    }
  }

  private async ping(conn: FrameConn, started: number): Promise<Finding> {
    const signal = this.stop.signal;
    try {
      const resp = await exchange(
        conn,
        { version: PROTOCOL_VERSION, id: HELLO_ID, accessToken: this.dialer.token, type: RequestType.Hello },
        started + this.limit,
        signal,
      );
      if (resp.status !== ResponseStatus.Ok && resp.status !== ResponseStatus.InvalidType) return { silent: false, waited: 0 };
    } catch (e) {
      return { silent: !signal.aborted && e instanceof TimeoutError, waited: now() - started };
    }
    // InvalidType too: a server that predates Hello, answering (as the
    // Rust probe counts it).
    this.answers++;
    this.dialer.suspect(this.addr, false);
    for (let id = 1n; ; id++) {
      try {
        await sleep(this.limit / 3, signal);
      } catch {
        return { silent: false, waited: 0 };
      }
      const sent = now();
      let resp;
      try {
        resp = await exchange(
          conn,
          { version: PROTOCOL_VERSION, id, accessToken: this.dialer.token, type: RequestType.Ping },
          sent + this.limit,
          signal,
        );
      } catch (e) {
        return { silent: !signal.aborted && e instanceof TimeoutError, waited: now() - sent };
      }
      // It answers but cannot serve: it counts itself leader with no
      // majority behind it (cut off from its peers, or stopping). As good
      // as silent for the sessions on it, and sooner (docs/PROTOCOL.md,
      // "Noticing a node that cannot serve").
      if (resp.status === ResponseStatus.Unavailable) return { silent: true, waited: now() - sent, cannotServe: true };
      if (resp.status !== ResponseStatus.Ok) return { silent: false, waited: 0 };
      this.answers++;
    }
  }
}

/** Subscribes `l` to the probe of `addr`, starting one if no link of the client has one running. */
export function watchNode(dialer: Dialer, addr: string, limit: number, l: Watched): NodeWatch {
  let w = dialer.watches.get(addr);
  if (w === undefined || dialer.closing.signal.aborted) {
    w = new NodeWatch(dialer, addr, limit);
    dialer.watches.set(addr, w);
  }
  w.links.add(l);
  return w;
}
