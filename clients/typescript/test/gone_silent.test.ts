// The probe's silence report against the link's own hearing (rules.ts's
// goneSilent, as src/link.rs does): when a node leaves its probe's Ping
// unanswered for the silence limit, a session link that heard from the node
// within the limit stays on it, and one that heard nothing breaks off and
// resumes elsewhere. Against fake nodes (fake_node.ts) that hold the
// probe's Ping unanswered, on a 2 s TTL (a 500 ms silence limit).

import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestType } from "../src/gen/dlock_pb.js";
import type { ClientEvent } from "../src/index.js";
import { FakeNode } from "./fake_node.js";
import { client, delay, waitFor, within } from "./helpers.js";

/** The fake nodes' session TTL, ms: the silence limit is a quarter of it. */
const TTL = 2_000;
/** How often the first test's link hears from its node, ms: a tenth of the silence limit. */
const PACE = 50;

/** Nodes `a`, whose answers `answer` gives, and `b`, which answers everything: where a session that left a would go. */
async function nodes(t: { after(fn: () => unknown): void }, answer: ConstructorParameters<typeof FakeNode>[0]): Promise<[FakeNode, FakeNode]> {
  const a = new FakeNode(answer, TTL);
  const b = new FakeNode(() => undefined, TTL);
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
