// An AbortSignal gives a waiting Lock up on the server: the request is
// withdrawn at once (its connection of its own is half-closed), the
// client's other calls go on, and a grant that crosses the abort is
// released.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Queued, type LockOptions } from "../src/index.js";
import { Cluster, Proxy, Server, aborted, client, waitFor, within } from "./helpers.js";

async function cancelWithdraws(t: { after(fn: () => unknown): void }, servers: string, opts: LockOptions = {}): Promise<void> {
  const holder = await client(t, servers);
  const waiter = await client(t, servers);
  const third = await client(t, servers);
  const key = `cancel/${opts.lease ?? 0}`;
  const held = await holder.lock(key);
  const waiters = async () => (await holder.inspect(key))[0].waiters;
  const ctl = new AbortController();
  const waiting = waiter.lock(key, { ...opts, signal: ctl.signal });
  await waitFor("the Lock waits in line", async () => (await waiters()) === 1);
  ctl.abort();
  await assert.rejects(within("the aborted Lock", waiting), (e: Error) => e.name === "AbortError");
  // The server withdraws the request.
  await waitFor("the aborted request is withdrawn", async () => (await waiters()) === 0);
  // Nothing on the waiter's client is held back behind it.
  assert.ok((await within("a ping", waiter.ping(), 5000)) >= 0);
  held.check();
  // Nothing stands between the holder and the next one.
  await held.unlock();
  const got = await third.lock(key, { wait: 0 });
  await got.unlock();
  // The waiter's client still takes locks, waiting ones too.
  const again = await waiter.lock(key, { wait: 5000 });
  await again.unlock();
}

test("aborting a waiting Lock withdraws it on the server", async (t) => {
  const s = await Server.start(t);
  await cancelWithdraws(t, s.addr);
  await cancelWithdraws(t, s.addr, { lease: 60_000 });
});

test("aborting a waiting Lock withdraws it on a cluster", async (t) => {
  const cl = await Cluster.start(t, 3, ["--session-ttl", "6s"]);
  await cl.leader();
  await cancelWithdraws(t, cl.servers);
});

test("an already aborted signal sends nothing", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  await assert.rejects(c.lock("k", { signal: AbortSignal.abort() }), (e: Error) => e.name === "AbortError");
  assert.equal((await c.inspect("k"))[0].holders.length, 0);
});

test("a lease granted as its Lock is aborted is released all the same", async (t) => {
  const s = await Server.start(t);
  const holder = await client(t, s.addr);
  const waiter = await client(t, s.addr);
  const third = await client(t, s.addr);
  const key = "crossing";
  for (let i = 0; i < 20; i++) {
    const held = await holder.lock(key);
    const ctl = new AbortController();
    const got = waiter.lock(key, { lease: 60_000, signal: ctl.signal }).catch(() => null);
    await waitFor("in line", async () => (await third.inspect(key))[0].waiters === 1);
    void held.unlock();
    ctl.abort();
    const l = await within("the aborted Lock", got);
    // The grant won the race: an ordinary Lock.
    if (l !== null) await l.unlock();
    await waitFor("the key free again", async () => {
      const l = await third.lock(key, { wait: 0 });
      await l.unlock();
      return true;
    });
  }
});

test("a lease granted as its Lock is aborted is released after the client's connection ended", async (t) => {
  // A waiting Lock with a lease, on a connection of its own, is aborted
  // just as its grant crosses the abort, after the client's connection
  // ended (the Lock's connection outlives it): the grant is released by
  // fence on a connection opened for it, not left to hold the key until
  // the lease runs out.
  const s = await Server.start(t);
  const proxy = await Proxy.start(t, s.addr);
  const other = await client(t, s.addr);
  const key = "late";
  const info = async () => (await other.inspect(key))[0];
  const held = await other.lock(key);
  const c = await client(t, proxy.addr); // the proxy's connection 0
  const ctl = new AbortController();
  const waiting = c.lock(key, { lease: 3_600_000, signal: ctl.signal }); // tried on 0, waits on 1
  waiting.catch(() => {});
  await waitFor("the Lock waits in line", async () => (await info()).waiters === 1);
  proxy.reset(0);
  await within("the client's connection ends", aborted(c.ended));
  proxy.freeze();
  await held.unlock(); // granted to the waiting Lock; the grant waits in the proxy
  await waitFor("the grant", async () => (await info()).waiters === 0);
  const granted = (await info()).holders[0]?.fence ?? 0n;
  assert.ok(granted > held.fence, `after the unlock of fence ${held.fence}: ${granted}`);
  ctl.abort(); // the Lock's connection is half-closed
  await assert.rejects(within("the aborted Lock", waiting), (e: Error) => e.name === "AbortError");
  proxy.thaw();
  await waitFor("the late lease released", async () => (await info()).holders.length === 0);
});

test("a lease granted as its Lock is aborted is released before close() settles", async (t) => {
  // As above, but the client is closed while the grant is on its way:
  // close() stops new connections for the client, yet the late lease is
  // released by fence on a connection opened for it, and close() settles
  // only after that (as the Go and Python clients do).
  const s = await Server.start(t);
  const proxy = await Proxy.start(t, s.addr);
  const other = await client(t, s.addr);
  const key = "late-close";
  const info = async () => (await other.inspect(key))[0];
  const held = await other.lock(key);
  const c = await client(t, proxy.addr);
  const ctl = new AbortController();
  const waiting = c.lock(key, { lease: 3_600_000, signal: ctl.signal }); // tried on 0, waits on 1
  waiting.catch(() => {});
  await waitFor("the Lock waits in line", async () => (await info()).waiters === 1);
  proxy.freeze();
  await held.unlock(); // granted to the waiting Lock; the grant waits in the proxy
  await waitFor("the grant", async () => (await info()).waiters === 0);
  ctl.abort(); // the Lock's connection is half-closed (the FIN waits in the proxy too)
  await assert.rejects(within("the aborted Lock", waiting), (e: Error) => e.name === "AbortError");
  const closing = c.close();
  proxy.thaw();
  await within("close()", closing);
  assert.deepEqual((await info()).holders, [], "the late lease is released once close() has settled");
});

test("a lease granted as its client is closed is released before close() settles", async (t) => {
  // A Lock with a lease still waits as its client is closed, and its grant
  // crosses the close: close() half-closes the Lock's connection and reads
  // on, as an abort does, so the late lease is released by fence before
  // close() settles; the Lock fails as before (ConnectionLostError).
  const s = await Server.start(t);
  const proxy = await Proxy.start(t, s.addr);
  const other = await client(t, s.addr);
  const key = "late-close-waiting";
  const info = async () => (await other.inspect(key))[0];
  const held = await other.lock(key);
  const c = await client(t, proxy.addr);
  const waiting = c.lock(key, { lease: 3_600_000 }); // tried on 0, waits on 1
  waiting.catch(() => {});
  await waitFor("the Lock waits in line", async () => (await info()).waiters === 1);
  proxy.freeze();
  await held.unlock(); // granted to the waiting Lock; the grant waits in the proxy
  await waitFor("the grant", async () => (await info()).waiters === 0);
  const granted = (await info()).holders[0]?.fence ?? 0n;
  assert.ok(granted > held.fence, `after the unlock of fence ${held.fence}: ${granted}`);
  const closing = c.close(); // the FIN waits in the proxy too
  await assert.rejects(within("the waiting Lock", waiting), (e: Error) => e.name === "ConnectionLostError");
  proxy.thaw();
  await within("close()", closing);
  const l = await other.lock(key, { wait: 5000 }); // AcquireTimeoutError while the late lease holds
  await l.unlock();
});

test("a lease granted on the client's connection as it is closed is released before close() settles", async (t) => {
  // A Queued's wait() with a lease waits on the client's own connection as
  // the client is closed, and its grant crosses the close: close()
  // half-closes that connection and reads on, as it does a waiting Lock's
  // own, so the late lease is released by fence before close() settles;
  // the wait() fails as before (ConnectionLostError).
  const s = await Server.start(t);
  const proxy = await Proxy.start(t, s.addr);
  const other = await client(t, s.addr);
  const key = "late-close-shared";
  const info = async () => (await other.inspect(key))[0];
  const held = await other.lock(key);
  const c = await client(t, proxy.addr); // the proxy's connection 0
  const q = await c.enqueue(key, { lease: 3_600_000 });
  const on = (x: unknown) => (x as { link: unknown }).link;
  assert.ok(q instanceof Queued && on(q) === on(c), "queued on the client's connection");
  const waiting = q.wait(); // on connection 0
  waiting.catch(() => {});
  await new Promise((resolve) => setImmediate(resolve)); // the Wait is written
  proxy.freeze();
  await held.unlock(); // granted to the queued request; the answer to its Wait waits in the proxy
  await waitFor("the grant", async () => (await info()).waiters === 0);
  const granted = (await info()).holders[0]?.fence ?? 0n;
  assert.ok(granted > held.fence, `after the unlock of fence ${held.fence}: ${granted}`);
  const closing = c.close(); // the FIN waits in the proxy too
  await assert.rejects(within("the waiting wait()", waiting), (e: Error) => e.name === "ConnectionLostError");
  proxy.thaw();
  await within("close()", closing);
  const l = await other.lock(key, { wait: 5000 }); // AcquireTimeoutError while the late lease holds
  await l.unlock();
});
