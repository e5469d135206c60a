// Enqueue/Wait, Watch and elections (campaign, leader, observe as an async
// iterator) against a real server.

import { test } from "node:test";
import assert from "node:assert/strict";
import { LockLostError, Queued } from "../src/index.js";
import type { Leader } from "../src/index.js";
import { Cluster, Server, aborted, client, waitFor, within } from "./helpers.js";

const text = (v: Uint8Array | undefined) => Buffer.from(v ?? new Uint8Array()).toString();

test("enqueue is granted at once on free keys, or queued with a ticket whose wait collects the grant", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  const first = await a.enqueue("q");
  assert.ok(!(first instanceof Queued));
  const q = await b.enqueue("q", { value: "b" });
  assert.ok(q instanceof Queued);
  assert.equal(q.place, 0);
  const q2 = await a.enqueue("q"); // a holds q: goes on a connection of its own, behind b
  assert.ok(q2 instanceof Queued);
  assert.equal(q2.place, 1);
  await first.unlock();
  const got = await within("b's grant", q.wait());
  assert.ok(got.fence > first.fence);
  assert.equal(text((await a.inspect("q"))[0].holders[0].value), "b");
  await got.unlock();
  const got2 = await within("a's second grant", q2.wait());
  assert.ok(got2.fence > got.fence);
  await got2.unlock();
});

test("an aborted wait of a queued request releases a grant that comes later", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  const held = await a.lock("qa");
  const q = await b.enqueue("qa");
  assert.ok(q instanceof Queued);
  const ctl = new AbortController();
  const w = q.wait({ signal: ctl.signal });
  ctl.abort();
  await assert.rejects(w, (e: Error) => e.name === "AbortError");
  await held.unlock();
  await waitFor("the late grant released", async () => (await a.inspect("qa"))[0].holders.length === 0);
  // b's connection serves on.
  await (await b.lock("qa", { wait: 5000 })).unlock();
});

test("watch answers when the first holder changes, and at its limit with the key as it is", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  const watching = a.watch("w", null, { limit: 20_000 });
  await waitFor("the watch parked", async () => {
    const st = await b.stats();
    return st.connections >= 3n;
  });
  const l = await b.lock("w", { value: "v1" });
  const info = await within("the watch", watching);
  assert.equal(info.holders[0].fence, l.fence);
  assert.equal(text(info.holders[0].value), "v1");
  const same = await a.watch("w", { fence: l.fence, value: "v1" }, { limit: 100 });
  assert.equal(same.holders[0].fence, l.fence);
  await l.unlock();
});

test("an election: campaign, leader, observe, proclaim, resign and deposition", async (t) => {
  const s = await Server.start(t);
  const a = await client(t, s.addr);
  const b = await client(t, s.addr);
  const watcher = await client(t, s.addr);
  const ea = a.election("leader");
  const eb = b.election("leader");
  assert.equal(await ea.leader(), null);
  const stop = new AbortController();
  const seen: (Leader | null)[] = [];
  const observing = (async () => {
    for await (const l of watcher.election("leader").observe({ signal: stop.signal })) seen.push(l);
  })();
  await waitFor("nobody leads, observed", () => seen.length === 1 && seen[0] === null);
  const lead = await ea.campaign("a");
  await waitFor("a leads, observed", () => text(seen.at(-1)?.value) === "a");
  assert.equal((await eb.leader())?.fence, lead.fence);
  const bCampaign = eb.campaign("b");
  await lead.proclaim("a2");
  await waitFor("a's new value, observed", () => text(seen.at(-1)?.value) === "a2");
  await lead.unlock(); // resign
  const bLead = await within("b leads", bCampaign);
  await waitFor("b leads, observed", () => seen.at(-1)?.fence === bLead.fence);
  // Deposed: someone else releases b's leadership by fence.
  await watcher.unlock("leader", bLead.fence);
  await within("b learns it was deposed", aborted(bLead.lost));
  assert.equal((bLead.error as LockLostError).kind, "not-held");
  stop.abort();
  await within("observe ends", observing);
});

test("a queued Enqueue keeps its place through a leader kill", async (t) => {
  const cl = await Cluster.start(t, 3, ["--session-ttl", "6s"]);
  const old = await cl.leader();
  const a = await client(t, cl.servers);
  const b = await client(t, cl.servers);
  const held = await a.lock("eq");
  const q = await b.enqueue("eq");
  assert.ok(q instanceof Queued);
  const w = q.wait();
  await cl.kill(old);
  await waitFor("back in line on the new leader", async () => (await a.inspect("eq"))[0].waiters === 1);
  await held.unlock();
  const got = await within("the grant", w);
  assert.ok(got.fence > held.fence);
  await got.unlock();
});
