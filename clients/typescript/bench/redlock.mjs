#!/usr/bin/env node
// The comparison for BENCHMARKS.md: lock+unlock cycles per second with 32
// concurrent async tasks on one client, node-redlock on one redis-server
// (redis from Debian's packages), each task on a key of its own, as
// bench/lock_cycles.mjs measures the dlock client. Not part of the
// package's dependencies: install them beside it for the run:
//
//   apt-get install -y redis-server
//   redis-server --port 6390 --save '' --appendonly no --daemonize yes
//   (cd bench && npm install --no-save --no-package-lock ioredis redlock@5.0.0-beta.2)
//   node bench/redlock.mjs [--port 6390] [--tasks 32] [--seconds 5] [--rounds 3]
import { parseArgs } from "node:util";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const Redis = require("ioredis");
const RedlockModule = require("redlock");
const Redlock = RedlockModule.default ?? RedlockModule;

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "6390" },
    tasks: { type: "string", default: "32" },
    seconds: { type: "string", default: "5" },
    rounds: { type: "string", default: "3" },
  },
});
const tasks = Number(values.tasks);
const ms = Number(values.seconds) * 1000;
const redis = new Redis({ host: "127.0.0.1", port: Number(values.port) });
// No retries: every key is a task's own, so a lock is never busy.
const redlock = new Redlock([redis], { retryCount: 0 });

async function round() {
  let n = 0;
  const start = performance.now();
  const end = start + ms;
  await Promise.all(
    Array.from({ length: tasks }, async (_, i) => {
      const key = `bench/${process.pid}/${i}`;
      while (performance.now() < end) {
        const lock = await redlock.acquire([key], 10_000);
        await lock.release();
        n++;
      }
    }),
  );
  return n / ((performance.now() - start) / 1000);
}

const xs = [];
for (let r = 0; r < Number(values.rounds); r++) xs.push(await round());
const median = [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`redlock   ${Math.round(median)}/s  (rounds: ${xs.map((x) => Math.round(x)).join(", ")})`);
redis.disconnect();
