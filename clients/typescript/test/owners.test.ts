// The ownership rule (docs/CLIENTS.md, point 4): tasks sharing one client
// that lock the same key take turns, exactly as separate processes do,
// while another client in another process takes the key too. Checked on a
// single server and on a three-node cluster.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { PKG, Cluster, Server, client, delay, within } from "./helpers.js";

const TASKS = 4;
const ROUNDS = 25;

interface Hold {
  who: string;
  fence: bigint;
  enter: bigint;
  leave: bigint;
}

/** The other owner: a client of its own in another process, printing its holds on the system-wide monotonic clock. */
function otherProcess(servers: string, key: string): Promise<Hold[]> {
  const script = `
    const { connect } = require(${JSON.stringify(PKG + "/dist/src/index.js")});
    (async () => {
      const c = await connect(${JSON.stringify(servers)});
      for (let i = 0; i < ${ROUNDS}; i++) {
        const l = await c.lock(${JSON.stringify(key)});
        console.log("enter " + l.fence + " " + process.hrtime.bigint());
        await new Promise((r) => setTimeout(r, 2));
        console.log("leave " + l.fence + " " + process.hrtime.bigint());
        await l.unlock();
      }
      await c.close();
    })().catch((e) => { console.log("error " + e.message); process.exit(1); });`;
  const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  return new Promise((resolve, reject) => {
    child.on("exit", (code) => {
      if (code !== 0) return reject(new Error(`the other process exited ${code}: ${out}`));
      const holds: Hold[] = [];
      let open: { fence: bigint; enter: bigint } | null = null;
      for (const line of out.trim().split("\n")) {
        const [word, fence, at] = line.split(" ");
        if (word === "enter") open = { fence: BigInt(fence), enter: BigInt(at) };
        else if (word === "leave" && open !== null) {
          holds.push({ who: "other", fence: open.fence, enter: open.enter, leave: BigInt(at) });
          open = null;
        }
      }
      resolve(holds);
    });
  });
}

async function takeTurns(t: { after(fn: () => unknown): void }, servers: string): Promise<void> {
  const key = "owners/turns";
  const c = await client(t, servers);
  const other = otherProcess(servers, key);
  const holds: Hold[] = [];
  let busy: string | null = null;
  await within(
    "every task's rounds",
    Promise.all(
      Array.from({ length: TASKS }, async (_, w) => {
        for (let i = 0; i < ROUNDS; i++) {
          const l = await c.lock(key);
          const enter = process.hrtime.bigint();
          assert.equal(busy, null, `task ${w} entered under fence ${l.fence} while ${busy} held the key`);
          busy = `task ${w}`;
          await delay(2);
          busy = null;
          holds.push({ who: `task ${w}`, fence: l.fence, enter, leave: process.hrtime.bigint() });
          await l.unlock();
        }
      }),
    ),
    60_000,
  );
  holds.push(...(await within("the other process", other, 60_000)));
  assert.equal(holds.length, (TASKS + 1) * ROUNDS);
  holds.sort((a, b) => (a.enter < b.enter ? -1 : a.enter > b.enter ? 1 : 0));
  for (let i = 1; i < holds.length; i++) {
    const [a, b] = [holds[i - 1], holds[i]];
    assert.ok(b.enter >= a.leave, `${b.who} entered under fence ${b.fence} while ${a.who} held it under fence ${a.fence}`);
    assert.ok(b.fence > a.fence, `fence ${b.fence} of ${b.who} after ${a.fence} of ${a.who}: fences must rise in grant order`);
  }
}

test("tasks sharing one client take turns on a key with another process (single server)", async (t) => {
  const s = await Server.start(t);
  await takeTurns(t, s.addr);
});

test("tasks sharing one client take turns on a key with another process (cluster)", async (t) => {
  const cl = await Cluster.start(t, 3);
  await cl.leader();
  await takeTurns(t, cl.servers);
});

test("a try-lock on a key another lock of the same client holds is busy, and a shared lock there counts as a second holder", async (t) => {
  const s = await Server.start(t);
  const c = await client(t, s.addr);
  const l = await c.lock("mine");
  await assert.rejects(c.lock("mine", { wait: 0 }), (e: Error) => e.constructor.name === "BusyError");
  await l.unlock();
  const a = await c.lock("sem", { limit: 2 });
  const b = await c.lock("sem", { limit: 2 });
  assert.equal(b.own, true);
  const [info] = await c.inspect("sem");
  assert.equal(info.holders.length, 2);
  await assert.rejects(c.lock("sem", { limit: 2, wait: 0 }), (e: Error) => e.constructor.name === "BusyError");
  // Shared and exclusive from one client: the exclusive one waits (no ModeConflict).
  const ex = c.lock("sem", { wait: 5000 });
  await a.unlock();
  await b.unlock();
  await (await within("the exclusive lock", ex)).unlock();
});
