// The client against real three-node clusters: leaders killed, paused past
// the session TTL, and deposed while they stay up. Every wait is bounded and
// waits for an event the client or the cluster reports.

import { test } from "node:test";
import assert from "node:assert/strict";
import { keepsSessionAlive, silenceLimit, RequestType, ResponseStatus } from "../src/index.js";
import type { Client, ClientEvent, Lock } from "../src/index.js";
import { Cluster, LIMIT, aborted, client, delay, waitFor, within } from "./helpers.js";

/** The test clusters' session TTL: a paused leader must be replaced, and the session resumed, well within a lock's deadline on a loaded machine. */
const TTL = 6000;

/** Collects a client's events; `next` waits for one of a kind about another node than `not`. */
class Events {
  private seen: ClientEvent[] = [];
  private waiters: (() => void)[] = [];
  on = (e: ClientEvent): void => {
    this.seen.push(e);
    for (const w of this.waiters.splice(0)) w();
  };
  async next(kind: ClientEvent["kind"], not: string): Promise<ClientEvent> {
    const deadline = performance.now() + LIMIT;
    for (;;) {
      const i = this.seen.findIndex((e) => e.kind === kind && e.addr !== not);
      if (i >= 0) return this.seen.splice(0, i + 1)[i];
      if (performance.now() > deadline) throw new Error(`no ${kind} event within ${LIMIT} ms`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 100);
      });
    }
  }
}

async function waiters(c: Client, key: string): Promise<number> {
  return (await c.inspect(key))[0].waiters;
}

test("only answers of committed commands prove a session alive", () => {
  const proving = new Set([
    `${RequestType.Ping}/${ResponseStatus.Ok}`,
    `${RequestType.Lock}/${ResponseStatus.Ok}`,
    `${RequestType.Unlock}/${ResponseStatus.Ok}`,
    `${RequestType.Renew}/${ResponseStatus.Ok}`,
    `${RequestType.Enqueue}/${ResponseStatus.Ok}`,
    `${RequestType.Lock}/${ResponseStatus.AcquireTimeout}`,
    `${RequestType.Enqueue}/${ResponseStatus.AcquireTimeout}`,
    `${RequestType.Enqueue}/${ResponseStatus.Queued}`,
    `${RequestType.Unlock}/${ResponseStatus.NotHeld}`,
    `${RequestType.Renew}/${ResponseStatus.NotHeld}`,
  ]);
  for (const k of Object.values(RequestType).filter((v): v is number => typeof v === "number")) {
    for (const s of Object.values(ResponseStatus).filter((v): v is number => typeof v === "number")) {
      assert.equal(keepsSessionAlive(k, s), proving.has(`${k}/${s}`), `${RequestType[k]} answered ${ResponseStatus[s]}`);
    }
  }
});

test("the silence limit follows the Rust library", () => {
  assert.equal(silenceLimit(0, 10_000), 1500);
  assert.equal(silenceLimit(500, 10_000), 1500);
  assert.equal(silenceLimit(1000, 20_000), 3000);
  assert.equal(silenceLimit(1000, 4000), 1000);
});

test("a killed leader is ridden through with the lock and the places in line kept", async (t) => {
  const cl = await Cluster.start(t, 3, ["--session-ttl", "6s"]);
  const old = await cl.leader();
  const ev = new Events();
  const holder = await client(t, cl.servers, { onEvent: ev.on });
  const first = await client(t, cl.servers);
  const second = await client(t, cl.servers);
  const l = await holder.lock("k");
  const g1 = first.lock("k");
  await waitFor("first in line", async () => (await waiters(holder, "k")) === 1);
  const g2 = second.lock("k");
  await waitFor("second in line", async () => (await waiters(holder, "k")) === 2);
  let secondGranted = false;
  void g2.then(() => (secondGranted = true), () => {});
  await cl.kill(old);
  await ev.next("resumed", cl.addrs[old]);
  await holder.ping();
  l.check();
  // The waiting Locks were sent again under their numbers: still two in
  // line, and the holder still holds.
  await waitFor("both waiters back in line", async () => {
    const [i] = await holder.inspect("k");
    return i.waiters === 2 && i.holders[0]?.fence === l.fence && i.holders[0].heldByCaller;
  });
  await l.unlock();
  const a = await within("the first waiter's grant", g1);
  assert.ok(a.fence > l.fence);
  assert.equal(secondGranted, false, "the second waiter was granted while the first held");
  await a.unlock();
  const b = await within("the second waiter's grant", g2);
  assert.ok(b.fence > a.fence);
  await b.unlock();
});

test("a leader paused past the session TTL costs the holder nothing and the waiter keeps its place", async (t) => {
  const cl = await Cluster.start(t, 3, ["--session-ttl", "6s"]);
  const old = await cl.leader();
  const ev = new Events();
  const holder = await client(t, cl.servers, { onEvent: ev.on });
  assert.equal(holder.addr, cl.addrs[old]);
  const waiter = await client(t, cl.servers);
  const l = await holder.lock("k");
  const lease = await holder.lock("k/lease", { lease: 4000 });
  const waiting = waiter.lock("k");
  await waitFor("the waiter in line", async () => (await waiters(holder, "k")) === 1);
  const paused = performance.now();
  cl.pause(old);
  t.after(() => cl.resume(old));
  const resumed = await ev.next("resumed", cl.addrs[old]);
  assert.equal(resumed.session, holder.session);
  assert.ok(performance.now() - paused < TTL, "the session moved past its TTL");
  // Past the TTL counted from the pause: a session only the old leader kept would be gone.
  await delay(TTL + 1000 - (performance.now() - paused));
  l.check();
  lease.check();
  const [info] = await holder.inspect("k");
  assert.equal(info.holders[0].fence, l.fence);
  assert.equal(info.waiters, 1);
  cl.resume(old);
  await l.unlock();
  const got = await within("the waiter's grant", waiting);
  assert.ok(got.fence > l.fence);
  await got.unlock();
  await lease.unlock();
});

test("a deposed leader that stays up never leaves a lock held here that the cluster gave away", async (t) => {
  // A leader paused until the others replace it, then resumed, answers the
  // Pings that queued up with NotLeader. Those answers must not keep the
  // lock "held" here: either the holder resumes its session on the new
  // leader and keeps the lock, or it counts the lock lost before anyone
  // else is granted it. The holder knows the old leader's address alone,
  // so it finds the new one only once the old one answers again.
  const cl = await Cluster.start(t, 3, ["--session-ttl", "6s"]);
  const old = await cl.leader();
  const ev = new Events();
  const holder = await client(t, cl.addrs[old], { onEvent: ev.on });
  const l = await holder.lock("k");
  cl.pause(old);
  t.after(() => cl.resume(old));
  const next = await cl.leader(old);
  cl.resume(old);
  const other = await client(t, cl.addrs[next]);
  const taken = other.lock("k", { wait: 3 * TTL });
  const outcome = await within(
    "an outcome",
    Promise.race([
      taken.then((tl: Lock) => ({ kind: "taken" as const, tl })),
      aborted(l.lost).then(() => ({ kind: "lost" as const })),
      ev.next("resumed", cl.addrs[old]).then(() => ({ kind: "resumed" as const })),
    ]),
  );
  t.diagnostic(`outcome: ${outcome.kind}`);
  if (outcome.kind === "taken") {
    assert.throws(() => l.check(), "k was granted to another client while the holder's lock was not lost");
    await outcome.tl.unlock();
  } else if (outcome.kind === "resumed") {
    await holder.ping();
    l.check();
    const [info] = await holder.inspect("k");
    assert.equal(info.holders[0].fence, l.fence);
    assert.equal(info.holders[0].heldByCaller, true);
    await l.unlock();
    await (await within("the other's grant", taken)).unlock();
  } else {
    await (await within("the other's grant", taken)).unlock();
  }
});

test("with every node down the lock is lost and the client ends naming each node", async (t) => {
  const cl = await Cluster.start(t, 3, ["--session-ttl", "2s"]);
  await cl.leader();
  const c = await client(t, cl.servers);
  const l = await c.lock("k");
  for (let i = 0; i < 3; i++) await cl.kill(i);
  await within("lost", aborted(l.lost));
  await within("the client ends", aborted(c.ended));
  await assert.rejects(c.ping(), (e: Error) => e.constructor.name === "ConnectionLostError");
  const reason = c.ended.reason as Error;
  const text = `${reason.message} ${(reason.cause as Error | undefined)?.message ?? ""}`;
  for (const a of cl.addrs) assert.ok(text.includes(a), `${text} names ${a}`);
});
