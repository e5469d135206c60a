#!/usr/bin/env node
// Lock+unlock cycles per second of the TypeScript client against a running
// dlock-server, beside clients/go/bench and clients/python/bench:
//
//   npm run build && node bench/lock_cycles.mjs [--server 127.0.0.1:7436] [--tasks 32] [--seconds 5] [--rounds 3]
//
// Workloads, each for --seconds, rounds alternating so that a drift of the
// shared machine hits all alike (the median round is reported):
//   - one-conn: --tasks async tasks on ONE client (one connection, requests
//     pipelined), each on a key of its own, in a loop of lock then unlock;
//   - n-conns: the same with a client per task;
//   - ping-1: one task's sequential pings on one connection (a round trip
//     each): the reference, measured in the same run.
import { parseArgs } from "node:util";
import { connect } from "../dist/src/index.js";

const { values } = parseArgs({
  options: {
    server: { type: "string", default: "" },
    tasks: { type: "string", default: "32" },
    seconds: { type: "string", default: "5" },
    rounds: { type: "string", default: "3" },
  },
});
const tasks = Number(values.tasks);
const ms = Number(values.seconds) * 1000;
const rounds = Number(values.rounds);
const server = values.server || undefined;

async function cycles(clients) {
  let n = 0;
  const end = performance.now() + ms;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: tasks }, async (_, i) => {
      const c = clients[i % clients.length];
      const key = `bench/${process.pid}/${i}`;
      while (performance.now() < end) {
        const l = await c.lock(key);
        await l.unlock();
        n++;
      }
    }),
  );
  return n / ((performance.now() - start) / 1000);
}

async function pings(c) {
  let n = 0;
  const start = performance.now();
  const end = start + ms;
  while (performance.now() < end) {
    await c.ping();
    n++;
  }
  return n / ((performance.now() - start) / 1000);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const one = await connect(server);
const many = await Promise.all(Array.from({ length: tasks }, () => connect(server)));
const results = { "one-conn": [], "n-conns": [], "ping-1": [] };
for (let r = 0; r < rounds; r++) {
  results["one-conn"].push(await cycles([one]));
  results["n-conns"].push(await cycles(many));
  results["ping-1"].push(await pings(one));
}
for (const [name, xs] of Object.entries(results)) {
  console.log(`${name.padEnd(9)} ${Math.round(median(xs))}/s  (rounds: ${xs.map((x) => Math.round(x)).join(", ")})`);
}
await one.close();
await Promise.all(many.map((c) => c.close()));
