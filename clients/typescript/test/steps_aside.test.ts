// A node that cannot serve is left (docs/PROTOCOL.md, "Noticing a node
// that cannot serve"): a probe answered Unavailable counts as silence (so a
// link that heard nothing from the node for the silence limit either
// leaves), and ShuttingDown on a session sends the session to another node
// at once. Against two fake cluster nodes (fake_node.ts), since a real
// server resets the connections of a leader that steps aside before either
// answer is seen.

import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestType, ResponseStatus } from "../src/gen/dlock_pb.js";
import type { ClientEvent } from "../src/index.js";
import { FakeNode } from "./fake_node.js";
import { client, waitFor } from "./helpers.js";

test("a probe answered Unavailable moves a session that hears nothing from its node to another node", async (t) => {
  // The first node answers the probe's session-less Ping Unavailable: it counts itself leader with no
  // majority behind it, so it commits nothing and leaves its session's own Pings unanswered. A 2 s TTL
  // makes the silence limit 500 ms: the link leaves at the first Unavailable after it has heard nothing
  // for that long.
  const a = new FakeNode(
    (req, onSession) =>
      req.type !== RequestType.Ping ? undefined : onSession ? null : { status: ResponseStatus.Unavailable, errorText: "this node cannot serve" },
    2_000,
  );
  const b = new FakeNode(() => undefined, 2_000);
  await a.start();
  await b.start();
  t.after(() => {
    a.close();
    b.close();
  });
  const events: ClientEvent[] = [];
  const c = await client(t, [a.addr, b.addr], { onEvent: (e) => events.push(e) });
  assert.equal(c.addr, a.addr, "the session opens on the first node");
  await waitFor("the session resumed on the other node", () => events.some((e) => e.kind === "resumed" && e.addr === b.addr), 10_000);
  assert.equal(b.sessionOpened, 1);
  // The probe's doing, not the link's own check of its Ping (unanswered for half the TTL).
  assert.match(events.find((e) => e.kind === "reconnecting")?.reason ?? "", /did not answer its probe/);
});

test("ShuttingDown on a session resumes it elsewhere and the Lock is answered there", async (t) => {
  const a = new FakeNode((req) =>
    req.type === RequestType.Lock ? { status: ResponseStatus.ShuttingDown, errorText: "server is shutting down" } : undefined,
  );
  const b = new FakeNode(() => undefined);
  await a.start();
  await b.start();
  t.after(() => {
    a.close();
    b.close();
  });
  const c = await client(t, [a.addr, b.addr]);
  assert.equal(c.addr, a.addr);
  const lock = await c.lock("k");
  assert.equal(lock.fence, 1n, "granted by the node the session moved to");
  assert.equal(c.addr, b.addr);
});
