// The probe's silence report against the link's own hearing (rules.ts's
// goneSilent, as src/link.rs does): when a node leaves its probe's Ping
// unanswered for the silence limit, a session link that heard from the node
// within the limit stays on it, and one that heard nothing breaks off and
// resumes elsewhere; one that stayed breaks off once it too has heard
// nothing for the limit, unless the probe was answered since. Against fake
// nodes (fake_node.ts) that hold the probe's Ping unanswered, on a 6 s TTL
// or a 60 s one (a 1.5 s silence limit either way: long enough that a test
// process stalled a few hundred milliseconds at the probe's report does not
// make a link that hears every PACE ms look silent).

import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestType } from "../src/gen/dlock_pb.js";
import type { ClientEvent } from "../src/index.js";
import { FakeNode } from "./fake_node.js";
import { client, delay, waitFor, within } from "./helpers.js";

/** The fake nodes' session TTL, ms: the silence limit is a quarter of it. */
const TTL = 6_000;
/** How often the first test's link hears from its node, ms: well within the silence limit. */
const PACE = 50;

/** Nodes `a`, whose answers `answer` gives, and `b`, which answers everything: where a session that left a would go. */
async function nodes(
  t: { after(fn: () => unknown): void },
  answer: ConstructorParameters<typeof FakeNode>[0],
  ttl = TTL,
): Promise<[FakeNode, FakeNode]> {
  const a = new FakeNode(answer, ttl);
  const b = new FakeNode(() => undefined, ttl);
  await a.start();
  await b.start();
  t.after(() => {
    a.close();
    b.close();
  });
  return [a, b];
}

test("a link that hears from its node stays there when the node's probe goes unanswered", async (t) => {
  // The node answers its session's link but never the probe's Ping (on a connection without a session):
  // the probe's own connection is slow, not the node.
  const [a, b] = await nodes(t, (req, onSession) => (req.type === RequestType.Ping && !onSession ? null : undefined));
  const events: ClientEvent[] = [];
  const c = await client(t, [a.addr, b.addr], { onEvent: (e) => events.push(e) });
  assert.equal(c.addr, a.addr, "the session opens on the first node");
  // The link hears from the node every PACE ms until the probe has given its Ping up: it closes that
  // connection, and then tells the links, before this process reads anything more (the same turn of
  // the event loop), so once the node sees the close, the links have been told.
  let heard = 0;
  await within(
    "the probe gave its Ping up",
    (async () => {
      while (a.heldClosed === 0) {
        await c.ping();
        heard++;
        await delay(PACE);
      }
    })(),
    10_000,
  );
  assert.ok(heard > 0);
  assert.deepEqual(events, [], "the link neither broke off nor resumed");
  assert.equal(c.addr, a.addr);
  assert.equal(b.sessionOpened, 0, "no session on the other node");
  await c.ping();
});

test("a link that hears nothing from its node either breaks off and resumes when the probe goes unanswered", async (t) => {
  // The node holds every Ping, the probe's and the link's own: silent on both connections.
  const [a, b] = await nodes(t, (req) => (req.type === RequestType.Ping ? null : undefined));
  const events: ClientEvent[] = [];
  const c = await client(t, [a.addr, b.addr], { onEvent: (e) => events.push(e) });
  assert.equal(c.addr, a.addr, "the session opens on the first node");
  await waitFor("the session resumed on the other node", () => events.some((e) => e.kind === "resumed" && e.addr === b.addr), 10_000);
  assert.equal(b.sessionOpened, 1);
  // The probe's doing, not the link's own check of its Ping (unanswered for half the TTL).
  assert.match(events.find((e) => e.kind === "reconnecting")?.reason ?? "", /did not answer its probe/);
  assert.equal(c.addr, b.addr);
});

test("a link that stayed after a silence report breaks off once it too hears nothing for the limit", async (t) => {
  // A 1.5 s silence limit (three times the fake's 200 ms election timeout is below the 1.5 s floor, a
  // quarter of the TTL above it); the link's own Ping (every quarter TTL, 15 s) would tell only half a
  // TTL (30 s) after it went unanswered.
  let stalled = false;
  const [a, b] = await nodes(
    t,
    (req, onSession) => ((req.type === RequestType.Ping && !onSession) || (stalled && onSession) ? null : undefined),
    60_000,
  );
  const events: ClientEvent[] = [];
  const c = await client(t, [a.addr, b.addr], { onEvent: (e) => events.push(e) });
  assert.equal(c.addr, a.addr, "the session opens on the first node");
  // The link hears from the node until the probe's first report (the node sees the probe's connection
  // end, and the links were told in the same turn): the link outlives it.
  await within(
    "the probe's first report",
    (async () => {
      while (a.heldClosed === 0) {
        await c.ping();
        await delay(PACE / 2);
      }
    })(),
    10_000,
  );
  assert.equal(events.length, 0, "the link stayed at the first report");
  // Now the node answers the link no more, and closes every new connection: the probe reports nothing
  // more (a refusal is no silence), so only the link's own silence can tell.
  stalled = true;
  a.refuse = true;
  await waitFor("the session resumed on the other node", () => events.some((e) => e.kind === "resumed" && e.addr === b.addr), 10_000);
  assert.match(events.find((e) => e.kind === "reconnecting")?.reason ?? "", /did not answer its probe .*, nor this connection/);
  assert.equal(b.sessionOpened, 1);
  await c.ping();
});
