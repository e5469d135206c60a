// The client against a single real server: locking, the lease keeper,
// release and renew by fence, shared locks and semaphores, Inspect,
// withLock and `await using`, the environment, and a close that leaves
// nothing running.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as net from "node:net";
import {
  AcquireTimeoutError,
  BusyError,
  Client,
  ConnectionLostError,
  DlockError,
  FrameTooLargeError,
  LockLostError,
  NotHeldError,
  NotOneClusterError,
  connect,
  serverList,
} from "../src/index.js";
import { PKG, Server, aborted, client, delay, waitFor, within } from "./helpers.js";

test("serverList reads one address, a comma list, an array and DLOCK_SERVER, and names a bad entry", () => {
  assert.deepEqual(serverList("127.0.0.1:1"), ["127.0.0.1:1"]);
  assert.deepEqual(serverList(" a:1, b:2 ,,[::1]:3"), ["a:1", "b:2", "[::1]:3"]);
  assert.deepEqual(serverList(["x:4"]), ["x:4"]);
  const old = process.env.DLOCK_SERVER;
  try {
    process.env.DLOCK_SERVER = "n1:7,n2:8";
    assert.deepEqual(serverList(), ["n1:7", "n2:8"]);
    delete process.env.DLOCK_SERVER;
    assert.deepEqual(serverList(""), ["127.0.0.1:7436"]);
  } finally {
    if (old === undefined) delete process.env.DLOCK_SERVER;
    else process.env.DLOCK_SERVER = old;
  }
  assert.throws(() => serverList("nohost"), (e: Error) => e instanceof DlockError && e.message.includes('"nohost"'));
  assert.throws(() => serverList("h:99999"), DlockError);
});

test("a lock is granted with a fence that rises, excludes another client, and unlocks", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  assert.equal(a.limits.sessionTimeout, 10_000);
  assert.equal(a.session, 0n);
  const l1 = await a.lock("k");
  assert.equal(typeof l1.fence, "bigint");
  assert.deepEqual(l1.keys, ["k"]);
  assert.equal(l1.lost.aborted, false);
  await assert.rejects(b.lock("k", { wait: 0 }), (e: Error) => e instanceof BusyError && e instanceof AcquireTimeoutError && (e as BusyError).keys[0] === "k");
  await assert.rejects(b.lock("k", { wait: 50 }), (e: Error) => e instanceof AcquireTimeoutError && !(e instanceof BusyError));
  const waiting = b.lock(["k", "other"]);
  await waitFor("b waits in line", async () => (await a.inspect("k"))[0].waiters === 1);
  await l1.unlock();
  await l1.unlock(); // twice does nothing
  const l2 = await within("b's grant", waiting);
  assert.ok(l2.fence > l1.fence);
  assert.deepEqual(l2.keys, ["k", "other"]);
  // It waited: on a connection of its own, not b's shared one.
  assert.equal(l2.own, true);
  const [info] = await b.inspect("k");
  assert.equal(info.holders[0].fence, l2.fence);
  assert.equal(info.holders[0].heldByCaller, false);
  await l2.unlock();
  assert.equal((await a.inspect("k"))[0].holders.length, 0);
});

test("withLock passes the lost signal, unlocks at the end, and rethrows the function's error after unlocking", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  const r = await c.withLock("w", {}, async (signal, lock) => {
    assert.equal(signal, lock.lost);
    assert.equal((await c.inspect("w"))[0].holders[0].fence, lock.fence);
    return 42;
  });
  assert.equal(r, 42);
  assert.equal((await c.inspect("w"))[0].holders.length, 0);
  await assert.rejects(
    c.withLock("w", {}, async () => {
      throw new Error("boom");
    }),
    /boom/,
  );
  assert.equal((await c.inspect("w"))[0].holders.length, 0);
});

test("await using unlocks at the end of the block", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  let fence: bigint;
  {
    await using lock = await c.lock("u");
    fence = lock.fence;
    assert.equal((await c.inspect("u"))[0].holders[0].fence, fence);
  }
  assert.equal((await c.inspect("u"))[0].holders.length, 0);
  {
    await using c2 = await connect(s.addr);
    assert.ok((await c2.ping()) >= 0);
  }
});

test("a lease is kept by its keeper past its length, renewed and released by fence from another client", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  const other = await client(t, s.addr);
  const lock = await c.lock("lease", { lease: 900 });
  assert.equal(lock.lease, 900);
  const firstDeadline = lock.deadline;
  // Three lease lengths: without renewals it would have ended twice over.
  await waitFor("the keeper renews", () => lock.deadline > firstDeadline + 1000);
  await delay(900);
  assert.equal(lock.lost.aborted, false);
  const [info] = await other.inspect("lease");
  assert.equal(info.holders[0].fence, lock.fence);
  assert.ok(info.holders[0].leaseRemaining > 0);
  // By fence, from another client: renew, then release.
  await other.renew("lease", lock.fence, 60_000);
  await other.unlock("lease", lock.fence);
  await assert.rejects(other.unlock("lease", lock.fence), (e: Error) => e instanceof NotHeldError && (e as NotHeldError).keys[0] === "lease");
  // The keeper finds it gone at its next renewal.
  await within("the lock is reported lost", aborted(lock.lost));
  const err = lock.error as LockLostError;
  assert.ok(err instanceof LockLostError);
  assert.equal(err.kind, "not-held");
  assert.throws(() => lock.check(), LockLostError);
});

test("renew turns a lock without a lease into a lease that outlives the connection", async (t) => {
  const s = await Server.start(t);
  const c = await connect(s.addr);
  const other = await client(t, s.addr);
  const lock = await c.lock("r");
  await lock.renew(60_000);
  assert.equal(lock.lease, 60_000);
  await c.close();
  // Closed: the lock is no longer watched here, but the lease holds on the server.
  assert.equal((lock.error as LockLostError).kind, "closed");
  const [info] = await other.inspect("r");
  assert.equal(info.holders[0].fence, lock.fence);
  await other.unlock("r", lock.fence);
});

test("shared locks admit many holders, a semaphore its limit, and an exclusive lock waits for all", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  const r1 = await a.lock("doc", { shared: true });
  const r2 = await b.lock("doc", { shared: true });
  const [info] = await a.inspect("doc");
  assert.equal(info.shared, true);
  assert.equal(info.holders.length, 2);
  await assert.rejects(b.lock("doc", { wait: 0 }), BusyError);
  await r1.unlock();
  await r2.unlock();
  const p1 = await a.lock("pool", { limit: 2 });
  const p2 = await b.lock("pool", { limit: 2 });
  await assert.rejects(b.lock("pool", { limit: 2, wait: 0 }), BusyError);
  assert.equal((await a.inspect("pool"))[0].limit, 2);
  await p1.unlock();
  await p2.unlock();
});

test("a value is shown by Inspect and replaced by proclaim", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  const lock = await c.lock("v", { value: "me" });
  assert.equal(Buffer.from((await c.inspect("v"))[0].holders[0].value).toString(), "me");
  await lock.proclaim("you");
  assert.equal(Buffer.from((await c.inspect("v"))[0].holders[0].value).toString(), "you");
  await lock.unlock();
  const stats = await c.stats();
  assert.ok(stats.connections >= 1n);
});

test("a request over the server's max_frame is refused before sending and the connection lives on", async (t) => {
  const s = await Server.start(t, ["--max-frame", "64"]);
  const c = await client(t, s.addr);
  await assert.rejects(c.lock("k".repeat(100)), FrameTooLargeError);
  assert.ok((await c.ping()) >= 0);
  assert.equal(c.ended.aborted, false);
});

test("a broken connection fails pending calls, reports locks without a lease lost at once and ends the client", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  const lock = await c.lock("gone");
  const lease = await c.lock("gone/lease", { lease: 60_000 });
  await s.kill();
  await within("lost", aborted(lock.lost));
  assert.equal((lock.error as LockLostError).kind, "connection");
  assert.ok(c.ended.aborted);
  assert.ok(c.ended.reason instanceof ConnectionLostError);
  // A lease outlives the connection: lost only when it could have run out.
  assert.equal(lease.lost.aborted, false);
  await assert.rejects(c.ping(), ConnectionLostError);
  await assert.rejects(c.lock("x"), ConnectionLostError);
});

test("close() leaves no socket or timer that keeps a process alive, with locks, leases and a waiting lock", async (t) => {
  const s = await Server.start(t);
  const holder = await client(t, s.addr);
  await holder.lock("busy");
  const script = `
    const { connect } = require(${JSON.stringify(PKG + "/dist/src/index.js")});
    (async () => {
      const c = await connect(${JSON.stringify(s.addr)});
      await c.lock("a");
      await c.lock("b", { lease: 30000 });
      const waiting = c.lock("busy").catch((e) => e);
      for (;;) { const [i] = await c.inspect("busy"); if (i.waiters === 1) break; }
      await c.close();
      const e = await waiting;
      console.log(e.constructor.name);
      setTimeout(() => { console.log("still alive"); }, 20000).unref();
    })();`;
  const r = spawnSync(process.execPath, ["-e", script], { timeout: 20_000, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim(), "ConnectionLostError");
});

test("a client keeps its process alive while a lock waits", async (t) => {
  const s = await Server.start(t);
  const holder = await client(t, s.addr);
  const held = await holder.lock("kept");
  const script = `
    const { connect } = require(${JSON.stringify(PKG + "/dist/src/index.js")});
    (async () => {
      const c = await connect(${JSON.stringify(s.addr)});
      const l = await c.lock("kept");
      console.log("granted");
      await c.close();
    })();`;
  const { spawn } = await import("node:child_process");
  const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  await waitFor("the child waits in line", async () => (await holder.inspect("kept"))[0].waiters === 1);
  await held.unlock();
  const code = await within("the child ends", new Promise((resolve) => child.on("exit", resolve)));
  assert.equal(code, 0);
  assert.equal(out.trim(), "granted");
});

test("many tasks pipeline unrelated locks on the one connection", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  await Promise.all(
    Array.from({ length: 32 }, async (_, i) => {
      for (let j = 0; j < 20; j++) {
        const l = await c.lock(`p/${i}`);
        assert.equal(l.own, false);
        await l.unlock();
      }
    }),
  );
  const stats = await c.stats();
  assert.equal(stats.connections, 1n);
});

test("DLOCK_TOKEN is sent when no token is given", async (t) => {
  const fs = await import("node:fs");
  const os = await import("node:os");
  const path = await import("node:path");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "dlock-ts-token-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.writeFileSync(path.join(dir, "tokens"), "sesame\n", { mode: 0o600 });
  const s = await Server.start(t, ["--token-file", path.join(dir, "tokens")]);
  const old = process.env.DLOCK_TOKEN;
  process.env.DLOCK_TOKEN = "sesame";
  let c: Client;
  try {
    c = await connect(s.addr);
  } finally {
    if (old === undefined) delete process.env.DLOCK_TOKEN;
    else process.env.DLOCK_TOKEN = old;
  }
  t.after(() => c.close());
  await (await c.lock("t")).unlock();
});

test("a list that leads to a single server is refused", async (t) => {
  // Two single servers share no locks: given as a list, the client moved to the second when the first
  // was down and locked there, beside a holder of the same key on the first. A list must name one
  // cluster's nodes (as the Rust client's src/dial.rs has it).
  const first = await Server.start(t);
  const second = await Server.start(t);
  const gone = net.createServer();
  await new Promise<void>((resolve) => gone.listen(0, "127.0.0.1", () => resolve()));
  const down = `127.0.0.1:${(gone.address() as net.AddressInfo).port}`;
  await new Promise<void>((resolve) => gone.close(() => resolve()));
  for (const list of [[down, second.addr], `${first.addr},${second.addr}`]) {
    await assert.rejects(
      connect(list, { connectTimeout: 5000 }),
      (e: unknown) => {
        assert.ok(e instanceof NotOneClusterError && e instanceof DlockError, `${list}: ${String(e)}`);
        assert.ok([first.addr, second.addr].includes(e.addr), e.message);
        assert.ok(e.message.startsWith(`dlock: ${e.addr} is a single server`) && e.message.includes("alone"), e.message);
        return true;
      },
    );
  }
  // One address is a single server's, as always.
  const alone = await client(t, second.addr);
  await alone.ping();
});
