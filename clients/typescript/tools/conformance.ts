#!/usr/bin/env node
// The TypeScript client's program for the client conformance kit
// (clients/conformance/kit.py, docs/CLIENTS.md, "Conformance kit"):
//
//   DLOCK_SERVER=HOST:PORT[,...] node dist/tools/conformance.js KEY
//     takes KEY exclusively without a lease, waiting as long as it takes,
//     prints "held FENCE", keeps the lock until a line arrives on stdin (or
//     stdin ends), releases it, prints "released" and exits 0. A lock found
//     lost meanwhile prints "lost REASON" and exits 1; any other error exits 2.
//
//   DLOCK_SERVER=... node dist/tools/conformance.js --turns N KEY
//     two workers share ONE client; each, N times, locks KEY exclusively
//     without a lease, prints "enter W FENCE", holds it about 20 ms, prints
//     "leave W FENCE" and unlocks; exits 0 when both are done ("error TEXT"
//     and exit 1 on any error).
//
// Only stdout carries the protocol; DLOCK_TOKEN and DLOCK_TLS_* apply as to
// any client.

import { LockLostError, NotHeldError, connect } from "../src/index.js";
import type { Client } from "../src/index.js";

/** One whole line: stdout on a pipe is written synchronously on Linux, and the event loop runs one worker at a time, so lines never interleave. */
function say(line: string): void {
  process.stdout.write(line.replace(/\s+/g, " ").trim() + "\n");
}

function lineOrEnd(): Promise<void> {
  return new Promise((resolve) => {
    process.stdin.on("data", (d: Buffer) => {
      if (d.includes(10)) resolve();
    });
    process.stdin.on("end", () => resolve());
    process.stdin.on("error", () => resolve());
  });
}

async function hold(key: string): Promise<number> {
  let client: Client;
  try {
    client = await connect();
  } catch (e) {
    process.stderr.write(`conformance: cannot connect: ${(e as Error).message}\n`);
    return 2;
  }
  try {
    const lock = await client.lock(key);
    say(`held ${lock.fence}`);
    await Promise.race([lineOrEnd(), new Promise((resolve) => lock.lost.addEventListener("abort", resolve))]);
    try {
      // Reads the clock: a deadline whose timer is late counts too.
      lock.check();
      await lock.unlock();
    } catch (e) {
      if (e instanceof LockLostError) {
        say(`lost ${e.text}`);
        return 1;
      }
      if (e instanceof NotHeldError) {
        say(`lost not held any more when released (${e.message})`);
        return 1;
      }
      if (lock.error !== null) {
        say(`lost ${lock.error.text}`);
        return 1;
      }
      throw e;
    }
    say("released");
    return 0;
  } catch (e) {
    process.stderr.write(`conformance: ${(e as Error).message}\n`);
    return 2;
  } finally {
    await client.close();
  }
}

async function turns(n: number, key: string): Promise<number> {
  let client: Client | undefined;
  try {
    client = await connect();
    const c = client;
    const worker = async (w: number) => {
      for (let i = 0; i < n; i++) {
        const lock = await c.lock(key);
        say(`enter ${w} ${lock.fence}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
        lock.check();
        say(`leave ${w} ${lock.fence}`);
        await lock.unlock();
      }
    };
    await Promise.all([worker(1), worker(2)]);
    return 0;
  } catch (e) {
    say(`error ${(e as Error).message}`);
    return 1;
  } finally {
    await client?.close();
  }
}

async function main(argv: string[]): Promise<number> {
  if (argv.length === 3 && argv[0] === "--turns" && /^\d+$/.test(argv[1]) && argv[2] !== "") {
    return turns(Number(argv[1]), argv[2]);
  }
  if (argv.length === 1 && argv[0] !== "" && !argv[0].startsWith("--")) return hold(argv[0]);
  process.stderr.write("usage: conformance.js [--turns N] KEY   (DLOCK_SERVER names the nodes)\n");
  return 2;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`conformance: ${(e as Error).message}\n`);
    process.exit(2);
  },
);
