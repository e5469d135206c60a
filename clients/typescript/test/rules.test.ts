// The shared rule vectors (clients/conformance/rules.json, written by the
// Rust library's tests/rule_vectors.rs from src/rules.rs) against this
// client's rules (src/rules.ts): every case of every section, in integer
// nanoseconds, answers compared in the vectors' microseconds (truncated, as
// Rust's Duration::as_micros). No server needed.

import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { RequestType, ResponseStatus } from "../src/gen/dlock_pb.js";
import * as rules from "../src/rules.js";
import { silenceLimit } from "../src/liveness.js";
import { Lock } from "../src/lock.js";
import type { LockOwner } from "../src/lock.js";
import type { Link } from "../src/link.js";

/** Bounds what a test here waits for. */
const LIMIT_MS = 10_000;

/** The package's folder: the first above this file with the client's package.json (the tests run from dist/test). */
function packageDir(): string {
  for (let dir = __dirname; ; dir = path.dirname(dir)) {
    const manifest = path.join(dir, "package.json");
    if (fs.existsSync(manifest) && JSON.parse(fs.readFileSync(manifest, "utf8")).name === "dlock") return dir;
    if (path.dirname(dir) === dir) throw new Error(`no package.json of dlock above ${__dirname}`);
  }
}

const FILE = path.resolve(packageDir(), "..", "conformance", "rules.json");
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Case = Record<string, any>;
const vectors: Record<string, unknown> = JSON.parse(fs.readFileSync(FILE, "utf8"));

/** The cases of `section`, which must be a non-empty list. */
function section(name: string): Case[] {
  const cases = vectors[name];
  assert.ok(Array.isArray(cases) && cases.length > 0, `${FILE}: section ${name} is missing or empty`);
  return cases as Case[];
}

const us = (n: number): bigint => BigInt(n) * 1000n;
const toUs = (ns: bigint): number => Number(ns / 1000n);

function kind(name: string): RequestType {
  const k = (RequestType as unknown as Record<string, RequestType>)[name];
  assert.equal(typeof k, "number", `request kind ${name} is unknown to the generated code`);
  return k;
}

function status(name: string): ResponseStatus {
  const s = (ResponseStatus as unknown as Record<string, ResponseStatus>)[name];
  assert.equal(typeof s, "number", `status ${name} is unknown to the generated code`);
  return s;
}

/** Runs `check` on every case of `name`, a failure naming the section and the case. */
function each(name: string, check: (c: Case) => void): void {
  for (const [i, c] of section(name).entries()) {
    try {
      check(c);
    } catch (e) {
      const what = c.name !== undefined ? `"${c.name}"` : JSON.stringify(c);
      throw new Error(`${name} case ${i} ${what}: ${(e as Error).message}`, { cause: e });
    }
  }
}

test("the vectors' clock rate bound is the client's", () => {
  assert.equal(vectors.clock_rate_bound, rules.CLOCK_RATE_BOUND);
});

test("rule vectors: deadline", () => {
  each("deadline", (c) => {
    assert.equal(toUs(rules.deadline(us(c.sent_us), us(c.window_us))), c.deadline_us);
  });
});

test("rule vectors: margin", () => {
  each("margin", (c) => {
    assert.equal(toUs(rules.margin(us(c.configured_us), us(c.window_us))), c.margin_us);
  });
});

test("rule vectors: in_jeopardy", () => {
  each("in_jeopardy", (c) => {
    assert.equal(rules.inJeopardy(us(c.now_us), us(c.deadline_us), us(c.margin_us)), c.jeopardy);
  });
});

test("rule vectors: moves_deadline", () => {
  each("moves_deadline", (c) => {
    assert.equal(rules.movesDeadline(c.on_session, kind(c.kind), status(c.status)), c.moves_deadline);
  });
});

test("rule vectors: elsewhere", () => {
  each("elsewhere", (c) => {
    const away = rules.elsewhere(status(c.status), c.leader);
    assert.equal(away?.means ?? null, c.means);
    assert.equal(away?.means === "not_leader" ? away.leader : null, c.moves_to);
  });
});

test("rule vectors: kinds", () => {
  each("kinds", (c) => {
    const k = kind(c.kind);
    const use = rules.sessionUse(k);
    assert.equal(use.actsForSession, c.acts_for_session, "acts_for_session");
    assert.equal(use.numbered, c.numbered, "numbered");
    assert.equal(rules.mayWait(k), c.may_wait, "may_wait");
  });
});

test("rule vectors: unanswered_too_long", () => {
  each("unanswered_too_long", (c) => {
    assert.equal(rules.unansweredTooLong(kind(c.kind), us(c.waited_us), us(c.ttl_us)), c.too_long);
  });
});

test("rule vectors: session_lives_until", () => {
  each("session_lives_until", (c) => {
    assert.equal(toUs(rules.sessionLivesUntil(us(c.acked_us), us(c.broke_us), us(c.ttl_us))), c.until_us);
  });
});

test("rule vectors: holds", () => {
  each("holds", (c) => {
    const lease = c.granted.lease_us === null ? null : us(c.granted.lease_us);
    const hold = rules.Hold.granted(us(c.granted.sent_us), lease);
    for (const step of c.steps as Case[]) {
      if (step.renew_sent !== undefined) {
        hold.renewSent(us(step.renew_sent.sent_us), us(step.renew_sent.lease_us));
      } else if (step.renew_answered !== undefined) {
        hold.renewAnswered(us(step.renew_answered.sent_us), us(step.renew_answered.lease_us));
      } else {
        throw new Error(`unknown step ${JSON.stringify(step)}`);
      }
    }
    const owner = [us(c.owner_acked_us), us(c.owner_timeout_us)] as const;
    assert.equal(toUs(hold.deadline(...owner)), c.deadline_us, "deadline");
    assert.equal(hold.lease === null ? null : toUs(hold.lease[1]), c.lease_us, "lease");
    assert.equal(toUs(hold.window(owner[1])), c.window_us, "window");
    const renewal = hold.renewal();
    assert.deepEqual(
      renewal === null ? null : { at_ns: Number(renewal[0]), lease_us: toUs(renewal[1]) },
      c.renewal,
      "renewal",
    );
  });
});

test("rule vectors: silence_limits", () => {
  each("silence_limits", (c) => {
    const stated = c.election_timeout_us === null ? null : us(c.election_timeout_us);
    assert.equal(toUs(rules.silenceLimit(stated, us(c.ttl_us))), c.limit_us, "the rule, in ns");
    // liveness.ts's silenceLimit works in float milliseconds, and the node's word reaches
    // it as Limits.electionTimeout does: 0 when it states none (the
    // vectors' null). Float milliseconds are not whole microseconds: within
    // one of the Rust answer, which truncates.
    const election = c.election_timeout_us === null ? 0 : c.election_timeout_us / 1000;
    const got = silenceLimit(election, c.ttl_us / 1000);
    assert.ok(Math.abs(got * 1000 - c.limit_us) < 1, `${got} ms, want ${c.limit_us} µs`);
  });
});

test("rule vectors: gone_silent", () => {
  each("gone_silent", (c) => {
    assert.equal(rules.goneSilent(us(c.last_heard_us), us(c.now_us), us(c.limit_us)), c.gone);
  });
});

test("the client's milliseconds agree with the rules' nanoseconds", () => {
  // performance.now()'s milliseconds, with fractions, to the nanosecond.
  assert.equal(rules.nanos(1234.567891), 1_234_567_891n);
  assert.equal(rules.millis(1_234_567_891n), 1234.567891);
  // Durations whose 0.1 % is not a whole microsecond, or not even a whole
  // nanosecond: Duration::mul_f64 goes through f64 seconds and rounds to
  // the nearest nanosecond, so "half" a nanosecond may go either way. The
  // answers are Rust's (Duration::from_nanos(n).mul_f64(0.001)).
  assert.equal(rules.deadline(0n, 999_000n), 998_001n);
  assert.equal(rules.deadline(0n, 1_999n), 1_997n);
  assert.equal(rules.deadline(0n, 1n), 1n);
  const rust: [bigint, bigint][] = [
    [499n, 0n],
    [500n, 1n],
    [1_500n, 1n],
    [1_501n, 2n],
    [2_500n, 3n],
    [3_500n, 3n],
    [1_000_000_500n, 1_000_001n],
    [1_000_001_500n, 1_000_002n],
    [13_773_277_259_260_022n, 13_773_277_259_260n],
  ];
  for (const [n, shrink] of rust) assert.equal(rules.mulF64(n, rules.CLOCK_RATE_BOUND), shrink, `${n} ns`);
});

/** A Lock on a stand-in for its connection: Renews are answered by `answer` (or never), and the owner was proved alive at `fresh`. */
function lockOn(answer: (() => Promise<unknown>) | null, lease = 0): { lock: Lock; fresh: number } {
  const fresh = performance.now();
  const link = {
    limits: { sessionTimeout: 10_000 },
    fresh,
    call: () => (answer === null ? new Promise(() => {}) : answer()),
    detached: () => {},
  } as unknown as Link;
  const owner: LockOwner = {
    margin: 2000,
    forget: () => {},
    unclaim: () => {},
    dropSide: () => {},
    proclaim: async () => {},
    unlockAgain: async () => {},
  };
  return { lock: new Lock(owner, link, true, ["k"], 1n, lease, fresh, true), fresh };
}

test("a lock without a lease whose first Renew is not answered ends with that renewal", async () => {
  // The hole the vectors close ("the first Renew of a lock without a
  // lease, answer lost"): the server may have made it a 1 s lease.
  const keep = setTimeout(() => {}, LIMIT_MS); // the lock's timers are unref'd
  try {
    const { lock, fresh } = lockOn(null);
    assert.ok(lock.deadline >= fresh + 9_990 - 1, `deadline ${lock.deadline - fresh} ms after the last proof of life`);
    const sent = performance.now();
    void lock.renew(1000).catch(() => {});
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(lock.lease, 0, "not known to be a lease");
    assert.ok(lock.deadline <= performance.now() + 999, `deadline ${lock.deadline - sent} ms after the Renew was sent`);
    // Lost a margin (a quarter of the 1 s) before it: not 10 s later.
    await new Promise((resolve) => lock.lost.addEventListener("abort", resolve));
    const err = lock.error;
    assert.equal(err?.kind, "deadline");
    assert.match(err?.text ?? "", /renewal to a lease of 1000 ms was not answered/);
    assert.ok(performance.now() - sent < 999, `lost ${performance.now() - sent} ms after the Renew`);
  } finally {
    clearTimeout(keep);
  }
});

test("a lock without a lease whose Renew is answered is a lease from its send time", async () => {
  const { lock } = lockOn(async () => ({}));
  const sent = performance.now();
  await lock.renew(1500, {});
  const answered = performance.now();
  assert.equal(lock.lease, 1500);
  // 1.5 s less 0.1 %, from when the Renew was sent (between the two).
  assert.ok(lock.deadline >= sent + 1498.5 - 0.001 && lock.deadline <= answered + 1498.5, `deadline ${lock.deadline - sent} ms after the Renew`);
  assert.equal(lock.lost.aborted, false);
  await lock.release().catch(() => {});
});
