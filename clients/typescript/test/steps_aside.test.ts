// A node that cannot serve is left at once (docs/PROTOCOL.md, "Noticing a
// node that cannot serve"): a probe answered Unavailable sends every link on
// the node away, whatever they heard, and ShuttingDown on a session sends
// the session to another node. Against two fake cluster nodes (fake_node.ts), since a real
// server resets the connections of a leader that steps aside before either
// answer is seen.

import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestType, ResponseStatus } from "../src/gen/dlock_pb.js";
import type { ClientEvent } from "../src/index.js";
import { FakeNode } from "./fake_node.js";
import { client, waitFor } from "./helpers.js";

test("a probe answered Unavailable moves the session to another node at once", async (t) => {
  // The first node serves its session's requests (the link hears from it) but answers the probe's
  // session-less Ping Unavailable: it counts itself leader with no majority behind it.
  const a = new FakeNode((req, onSession) =>
    req.type === RequestType.Ping && !onSession ? { status: ResponseStatus.Unavailable, errorText: "this node cannot serve" } : undefined,
  );
  const b = new FakeNode(() => undefined);
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
  assert.match(events.find((e) => e.kind === "reconnecting")?.reason ?? "", /answered its probe Unavailable/);
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
