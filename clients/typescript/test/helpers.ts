// Real dlock-server processes for the tests: single servers on 127.0.0.1:0
// (the port read from the server's "listening" log line, so none is
// guessed) and clusters on loopback ports reserved below the ephemeral
// range (a node must know its peers' addresses before it starts), as the
// conformance kit and the Go and Python tests do. The binary is
// DLOCK_SERVER_BIN, else target/debug/dlock-server of this checkout. Every
// wait is bounded and waits for a condition; nothing sleeps and hopes.

import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import type { TestContext } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { RequestSchema, RequestType, ResponseSchema, ResponseStatus } from "../src/gen/dlock_pb.js";
import type { Response } from "../src/gen/dlock_pb.js";
import { connect } from "../src/index.js";
import type { Client, ConnectOptions } from "../src/index.js";

/** The package's folder (tests run from dist/test). */
export const PKG = path.resolve(__dirname, "..", "..");
export const REPO = path.resolve(PKG, "..", "..");
export const SERVER_BIN =
  process.env.DLOCK_SERVER_BIN || path.join(process.env.CARGO_TARGET_DIR || path.join(REPO, "target"), "debug", "dlock-server");

/** Bounds anything a test waits for: a hang fails the test, not CI. */
export const LIMIT = 30_000;

/** The flags of every test cluster node: a short election timeout keeps failovers to a second or two and still rides out the stalls of a loaded two-core machine. */
export const NODE_FLAGS = ["--heartbeat", "100ms", "--election-timeout", "500ms"];

type Cleanup = Pick<TestContext, "after"> | { after(fn: () => unknown): void };


/**
 * Whether every thread of `pid` is stopped (T in /proc/PID/task/TID/stat);
 * one that has exited (Z, X, gone) counts too, for the test's next step
 * reports that.
 */
function allThreadsStopped(pid: number): boolean {
  let tasks: string[];
  try {
    tasks = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return true;
  }
  return tasks.every((tid) => {
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
    } catch {
      return true;
    }
    const state = stat.slice(stat.lastIndexOf(")") + 1).trim().split(/\s+/)[0] ?? "";
    return "TtZX".includes(state) && state !== "";
  });
}
export class Server {
  addr = "";
  readonly proc: ChildProcess;
  readonly log: string[] = [];
  private exited: Promise<void>;

  private constructor(args: string[]) {
    if (!fs.existsSync(SERVER_BIN)) {
      throw new Error(`${SERVER_BIN} not found: build it with \`cargo build -p dlock-server\` or set DLOCK_SERVER_BIN`);
    }
    this.proc = spawn(SERVER_BIN, args, { stdio: ["ignore", "ignore", "pipe"] });
    this.exited = new Promise((resolve) => this.proc.once("exit", () => resolve()));
  }

  /** Starts a server with `flags` on `listen` and waits until it says where it listens. */
  static async start(t: Cleanup, flags: string[] = [], listen = "127.0.0.1:0"): Promise<Server> {
    const s = new Server(["--listen", listen, "--log-level", "info", ...flags]);
    t.after(() => s.kill());
    await new Promise<void>((resolve, reject) => {
      let buf = "";
      const timer = setTimeout(() => reject(new Error(`dlock-server did not say where it listens within ${LIMIT} ms: ${s.log.join("\n")}`)), LIMIT);
      // Drains stderr for the server's whole life, so a chatty server never blocks on a full pipe.
      s.proc.stderr?.on("data", (d: Buffer) => {
        buf += d.toString();
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (s.log.length < 2000) s.log.push(line);
          const m = /listening addr=(\S+)/.exec(line);
          if (m && s.addr === "") {
            s.addr = m[1];
            clearTimeout(timer);
            resolve();
          }
        }
      });
      s.proc.once("exit", (code) => {
        clearTimeout(timer);
        if (s.addr === "") reject(new Error(`dlock-server exited (${code}) before listening: ${s.log.join("\n")}`));
      });
    });
    return s;
  }

  /**
   * Sends `sig`; after SIGSTOP it returns once every thread of the server has
   * stopped, for kill(2) returns before that, and on a busy machine a thread
   * already running could still answer a request sent just after.
   */
  signal(sig: NodeJS.Signals): void {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill(sig);
    if (sig !== "SIGSTOP" || this.proc.pid === undefined) return;
    const deadline = Date.now() + 10_000;
    const pause = new Int32Array(new SharedArrayBuffer(4));
    while (!allThreadsStopped(this.proc.pid) && Date.now() < deadline) Atomics.wait(pause, 0, 0, 1);
  }

  async kill(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGCONT");
      this.proc.kill("SIGKILL");
    }
    await this.exited;
  }

  async exit(): Promise<void> {
    await this.exited;
  }
}

/** A listening socket on a free loopback port below the ephemeral range, held until its node binds the port. */
async function reservePort(): Promise<net.Server> {
  let high = 32768;
  try {
    high = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").split(/\s+/)[0]) || high;
  } catch {
    // the default range
  }
  const low = 10_000;
  const start = low + Math.floor(Math.random() * (high - low));
  for (let i = 0; i < high - low; i++) {
    const port = low + ((start - low + i) % (high - low));
    const srv = net.createServer();
    const ok = await new Promise<boolean>((resolve) => {
      srv.once("error", () => resolve(false));
      srv.listen(port, "127.0.0.1", () => resolve(true));
    });
    if (ok) return srv;
  }
  throw new Error("no free loopback port");
}

function closeServer(s: net.Server): Promise<void> {
  return new Promise((resolve) => s.close(() => resolve()));
}

/** Node processes of one cluster: started, killed, paused and resumed by the test. */
export class Cluster {
  addrs: string[] = [];
  private peers: string[] = [];
  private members = "";
  private held: (net.Server[] | null)[] = [];
  nodes: (Server | null)[] = [];
  private paused = new Set<number>();
  private root = "";
  private flags: string[] = [];

  private constructor(private readonly t: Cleanup) {}

  static async start(t: Cleanup, n: number, flags: string[] = []): Promise<Cluster> {
    const c = new Cluster(t);
    c.root = fs.mkdtempSync(path.join(os.tmpdir(), "dlock-ts-cluster-"));
    c.flags = [...NODE_FLAGS, ...flags];
    for (let i = 0; i < n; i++) {
      const pair = [await reservePort(), await reservePort()];
      c.held.push(pair);
      c.addrs.push(`127.0.0.1:${(pair[0].address() as net.AddressInfo).port}`);
      c.peers.push(`127.0.0.1:${(pair[1].address() as net.AddressInfo).port}`);
    }
    c.members = c.addrs.map((a, i) => `${i + 1}=${a}@${c.peers[i]}`).join(",");
    c.nodes = new Array(n).fill(null);
    t.after(async () => {
      await c.stop();
      fs.rmSync(c.root, { recursive: true, force: true });
    });
    await Promise.all(c.addrs.map((_, i) => c.startNode(i)));
    return c;
  }

  get servers(): string {
    return this.addrs.join(",");
  }

  /** Node `i`'s peer port (--peer-listen). */
  peerAddr(i: number): string {
    return this.peers[i];
  }

  async startNode(i: number): Promise<void> {
    const held = this.held[i];
    this.held[i] = null;
    if (held) for (const s of held) await closeServer(s);
    this.nodes[i] = await Server.start(
      this.t,
      [
        "--data-dir", path.join(this.root, `node${i + 1}`),
        "--node-id", String(i + 1),
        "--peer-listen", this.peers[i],
        "--initial-cluster", this.members,
        ...this.flags,
      ],
      this.addrs[i],
    );
  }

  async kill(i: number): Promise<void> {
    const node = this.nodes[i];
    this.nodes[i] = null;
    this.paused.delete(i);
    await node?.kill();
  }

  pause(i: number): void {
    this.nodes[i]?.signal("SIGSTOP");
    this.paused.add(i);
  }

  resume(i: number): void {
    if (this.paused.has(i)) {
      this.nodes[i]?.signal("SIGCONT");
      this.paused.delete(i);
    }
  }

  /** Node i's view of the cluster; null if it does not answer. */
  async status(i: number): Promise<Response["cluster"] | null> {
    if (this.nodes[i] === null || this.paused.has(i)) return null;
    try {
      const r = await rawCall(this.addrs[i], { version: 2, id: 1n, type: RequestType.ClusterStatus }, 500);
      return r.status === ResponseStatus.Ok ? r.cluster : null;
    } catch {
      return null;
    }
  }

  /** Waits for a node other than `other` (-1: any) that every answering node agrees leads, and that answers an Inspect (a majority confirmed its lead). */
  async leader(other = -1): Promise<number> {
    const deadline = performance.now() + LIMIT;
    while (performance.now() < deadline) {
      const votes = new Map<bigint, number>();
      let answered = 0;
      for (let i = 0; i < this.nodes.length; i++) {
        const s = await this.status(i);
        if (s) {
          answered++;
          if (s.leaderId !== 0n) votes.set(s.leaderId, (votes.get(s.leaderId) ?? 0) + 1);
        }
      }
      for (const [id, n] of votes) {
        const i = Number(id) - 1;
        if (n === answered && i !== other && this.nodes[i] !== null && !this.paused.has(i)) {
          const s = await this.status(i);
          if (s?.role === "Leader") {
            try {
              const r = await rawCall(this.addrs[i], { version: 2, id: 1n, type: RequestType.Inspect }, 1000);
              if (r.status === ResponseStatus.Ok) return i;
            } catch {
              // not yet
            }
          }
        }
      }
      await delay(20);
    }
    throw new Error(`no leader other than node ${other} within ${LIMIT} ms`);
  }

  async stop(): Promise<void> {
    for (let i = 0; i < this.nodes.length; i++) {
      this.resume(i);
      await this.kill(i);
    }
    for (const h of this.held) if (h) for (const s of h) await closeServer(s);
  }
}

/** A pause that is part of what a test does (a hold), never a wait for something to happen. */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `cond` (a cheap check of state another task or process changes) until it holds, failing after LIMIT. */
export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, limit = LIMIT): Promise<void> {
  const deadline = performance.now() + limit;
  for (;;) {
    try {
      if (await cond()) return;
    } catch {
      // not yet
    }
    if (performance.now() > deadline) throw new Error(`${what}: not within ${limit} ms`);
    await delay(10);
  }
}

/** Resolves with what `p` resolves to, or fails after `limit` ms naming `what`. */
export async function within<T>(what: string, p: Promise<T>, limit = LIMIT): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${limit} ms`)), limit);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

export function rawFrame(req: MessageInitShape<typeof RequestSchema>): Buffer {
  const body = toBinary(RequestSchema, create(RequestSchema, req));
  const f = Buffer.alloc(4 + body.length);
  f.writeUInt32BE(body.length, 0);
  f.set(body, 4);
  return f;
}

/** Writes `frames` on a connection of its own, outside the client under test, and reads `n` answers. */
export function rawExchange(addr: string, frames: Buffer[], n: number, timeout = LIMIT): Promise<Response[]> {
  const i = addr.lastIndexOf(":");
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)) });
    const out: Response[] = [];
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`after ${out.length} answers: no more within ${timeout} ms`));
    }, timeout);
    sock.on("connect", () => {
      for (const f of frames) sock.write(f);
    });
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const len = buf.readUInt32BE(0);
        out.push(fromBinary(ResponseSchema, buf.subarray(4, 4 + len)));
        buf = buf.subarray(4 + len);
      }
      if (out.length >= n) {
        clearTimeout(timer);
        sock.destroy();
        resolve(out);
      }
    });
    sock.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    sock.on("close", () => {
      clearTimeout(timer);
      if (out.length < n) reject(new Error(`closed after ${out.length} answers`));
    });
  });
}

export async function rawCall(addr: string, req: MessageInitShape<typeof RequestSchema>, timeout = LIMIT): Promise<Response> {
  return (await rawExchange(addr, [rawFrame(req)], 1, timeout))[0];
}

/** A client closed after the test. */
export async function client(t: Cleanup, servers?: string | string[], opts: ConnectOptions = {}): Promise<Client> {
  const c = await connect(servers, opts);
  t.after(() => c.close());
  return c;
}

/**
 * A TCP proxy in front of a server whose path can be frozen: it then stops
 * moving bytes either way, without a reset, as a cut network path does;
 * what it read is held back, and delivered if it is thawed. A half-close is
 * passed on as one, so a client's FIN reaches the server while the server's
 * answers still come back.
 */
export class Proxy {
  addr = "";
  private frozen = false;
  /** What arrived while frozen, in order: delivered by thaw(). */
  private held: (() => void)[] = [];
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  /** The connections in the order accepted: the client's side, then the server's. */
  private readonly conns: [net.Socket, net.Socket][] = [];

  private constructor(to: string) {
    const i = to.lastIndexOf(":");
    this.server = net.createServer({ allowHalfOpen: true }, (inbound) => {
      const out = net.connect({ host: to.slice(0, i), port: Number(to.slice(i + 1)), allowHalfOpen: true });
      this.conns.push([inbound, out]);
      for (const s of [inbound, out]) {
        this.sockets.add(s);
        s.on("error", () => {});
        s.on("close", () => this.sockets.delete(s));
        if (this.frozen) s.pause();
      }
      const pipe = (from: net.Socket, dest: net.Socket) => {
        from.on("data", (d) => this.pass(() => dest.write(d)));
        from.on("end", () => this.pass(() => dest.end()));
      };
      pipe(inbound, out);
      pipe(out, inbound);
    });
  }

  static async start(t: Cleanup, to: string): Promise<Proxy> {
    const p = new Proxy(to);
    await new Promise<void>((resolve) => p.server.listen(0, "127.0.0.1", () => resolve()));
    p.addr = `127.0.0.1:${(p.server.address() as net.AddressInfo).port}`;
    t.after(() => p.close());
    return p;
  }

  /** Forwards now, or once thawed. (One event loop: whatever arrives after freeze() returned is held.) */
  private pass(forward: () => void): void {
    if (this.frozen) this.held.push(forward);
    else forward();
  }

  /** Holds back everything sent either way from now on; sockets stop reading, so senders' buffers fill. */
  freeze(): void {
    this.frozen = true;
    for (const s of this.sockets) s.pause();
  }

  /** Delivers what was held back, in order, and moves bytes again. */
  thaw(): void {
    this.frozen = false;
    const held = this.held;
    this.held = [];
    for (const forward of held) forward();
    for (const s of this.sockets) s.resume();
  }

  /** Resets both sides of the nth connection accepted (from 0), as a broken network path does. */
  reset(n: number): void {
    for (const s of this.conns[n]) s.resetAndDestroy();
  }

  close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** Resolves when `signal` aborts (at once if it has). */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}
