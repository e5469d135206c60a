// A lease outlives its session: an Unlock that its session could not send,
// because the session ended while it moved to another node, is sent again
// by fence on a connection opened for it, and the caller is told that it
// went through.

import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestType, ResponseStatus } from "../src/index.js";
import type { ClientEvent } from "../src/index.js";
import { Cluster, Proxy, client, rawExchange, rawFrame, within } from "./helpers.js";

test("a lease's Unlock queued while its session moves is sent again by fence when the session ends instead", async (t) => {
  const cl = await Cluster.start(t, 1);
  const node = cl.addrs[0];
  const proxy = await Proxy.start(t, node);
  let reconnecting: () => void = () => {};
  const moving = new Promise<void>((resolve) => (reconnecting = resolve));
  const onEvent = (e: ClientEvent) => {
    if (e.kind === "reconnecting") reconnecting();
  };
  const c = await client(t, proxy.addr, { onEvent }); // the proxy's connection 0
  const other = await client(t, node);
  const key = "moving";
  const lock = await c.lock(key, { lease: 3_600_000 });
  // The path breaks and stays cut: the session moves, its resume held in the proxy.
  proxy.reset(0);
  proxy.freeze();
  await within("the session moves", moving);
  const unlocking = lock.unlock(); // queued: the session has no stream now
  unlocking.catch(() => {});
  // The session ends meanwhile (as when its TTL runs out while no node
  // keeps it): resumed on a connection of the test's, and closed there.
  const session = c.session;
  const [resumed, closed] = await rawExchange(
    node,
    [
      rawFrame({ version: 2, id: 1n, type: RequestType.OpenSession, session }),
      rawFrame({ version: 2, id: 2n, type: RequestType.CloseSession, session }),
    ],
    2,
  );
  for (const r of [resumed, closed]) assert.equal(r.status, ResponseStatus.Ok, r.errorText);
  proxy.thaw(); // the resume is answered UnknownSession
  await within("the unlock", unlocking);
  assert.deepEqual((await other.inspect(key))[0].holders, [], "the lease is released");
});
