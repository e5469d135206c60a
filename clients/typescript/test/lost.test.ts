// The client-side safety rule on a frozen path: a proxy between client and
// server stops moving bytes without a reset, as a cut network path does.
// No answer then proves the owner alive, so the lock is reported lost a
// margin before its deadline, which is before the server could hand the
// key to anyone else.

import { test } from "node:test";
import assert from "node:assert/strict";
import { LockLostError } from "../src/index.js";
import { Proxy, Server, aborted, client, within } from "./helpers.js";

test("a lock without a lease on a frozen path is lost before the server gives the key to another", async (t) => {
  // A short idle timeout makes the session timeout 3 s.
  const s = await Server.start(t, ["--idle-timeout", "3s"]);
  const proxy = await Proxy.start(t, s.addr);
  const c = await client(t, proxy.addr);
  assert.equal(c.limits.sessionTimeout, 3000);
  const other = await client(t, s.addr);
  const lock = await c.lock("frozen");
  let lostAt = 0;
  lock.lost.addEventListener("abort", () => (lostAt = performance.now()));
  proxy.freeze();
  const frozeAt = performance.now();
  const taken = await within("the other client's grant", other.lock("frozen", { wait: 20_000 }));
  const takenAt = performance.now();
  await within("lost", aborted(lock.lost));
  assert.ok(lostAt > 0 && lostAt < takenAt, `lost at ${lostAt - frozeAt} ms, the key taken at ${takenAt - frozeAt} ms`);
  const err = lock.error as LockLostError;
  assert.ok(err instanceof LockLostError);
  assert.equal(err.kind, "deadline");
  assert.ok(taken.fence > lock.fence);
  await taken.unlock();
});

test("a lease on a frozen path is lost before it could run out", async (t) => {
  const s = await Server.start(t);
  const proxy = await Proxy.start(t, s.addr);
  const c = await client(t, proxy.addr);
  const other = await client(t, s.addr);
  const lock = await c.lock("frozen/lease", { lease: 2000 });
  let lostAt = 0;
  lock.lost.addEventListener("abort", () => (lostAt = performance.now()));
  proxy.freeze();
  const taken = await within("the other client's grant", other.lock("frozen/lease", { wait: 20_000 }));
  const takenAt = performance.now();
  await within("lost", aborted(lock.lost));
  assert.ok(lostAt > 0 && lostAt < takenAt);
  assert.equal((lock.error as LockLostError).kind, "deadline");
  // A renewal held up on the frozen path ends with the loss at the latest.
  await assert.rejects(lock.renew(), LockLostError);
  await taken.unlock();
});
