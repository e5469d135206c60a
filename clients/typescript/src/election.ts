// Leader election on one key, as the Rust library's, the Python and the Go
// clients' (after etcd's concurrency.Election): campaigners queue for the
// key (FIFO, like any Lock), the holder leads, and its hold's value says
// who it is. Mirrors clients/go/election.go.

import { sleep } from "./dial.js";
import type { Client } from "./client.js";
import type { Lock } from "./lock.js";
import type { KeyInfo } from "./types.js";

/** Who leads an election. */
export interface Leader {
  /** The value it campaigned with, or proclaimed since. */
  value: Uint8Array;
  /** The fence of its leadership: higher for every later leader. */
  fence: bigint;
  /** How long it has led (ms), when the server says. */
  heldFor: number;
}

function leaderOf(k: KeyInfo): Leader | null {
  const f = k.holders[0];
  return f === undefined ? null : { value: f.value, fence: f.fence, heldFor: f.heldFor };
}

function sameLeader(a: Leader | null, b: Leader | null): boolean {
  if (a === null || b === null) return a === b;
  return a.fence === b.fence && Buffer.from(a.value).equals(Buffer.from(b.value));
}

/** A failed Watch is tried again after this pause (ms), doubling up to MAX_RETRY. */
const RETRY = 250;
const MAX_RETRY = 5000;

export class Election {
  constructor(
    private readonly client: Client,
    readonly key: string,
  ) {}

  /**
   * Waits until this campaigner leads, in line behind earlier ones,
   * announcing `value` (at most 1024 bytes), and returns the leadership: a
   * Lock bound to the client's connection (on a cluster, its session) unless
   * `lease` is given, so a leader whose process ends hands over at once.
   * Its `lost` signal aborts when leading can no longer be assumed: besides
   * a Lock's reasons, at once when the key is taken from the leader
   * (released by fence by someone else), which a Watch kept on it while it
   * leads reports. unlock() resigns; proclaim() announces a new value. An
   * aborted signal withdraws the campaign as it does a Lock.
   */
  async campaign(value: string | Uint8Array, opts: { signal?: AbortSignal; wait?: number; lease?: number } = {}): Promise<Lock> {
    const lock = await this.client.lock(this.key, { value, signal: opts.signal, wait: opts.wait, lease: opts.lease });
    void this.watchLeadership(lock, typeof value === "string" ? new TextEncoder().encode(value) : value);
    return lock;
  }

  /** Watches the key while `lock` leads: when its first holder is no longer `lock`, the leadership is lost. */
  private async watchLeadership(lock: Lock, value: Uint8Array): Promise<void> {
    const stop = AbortSignal.any([lock.lost, this.client.ended]);
    let known = value;
    let pause = RETRY;
    while (!stop.aborted && !lock.isReleased) {
      let info: KeyInfo;
      try {
        info = await this.client.watch(this.key, { fence: lock.fence, value: known }, { signal: stop });
      } catch {
        try {
          await sleep(pause, stop);
        } catch {
          return;
        }
        pause = Math.min(pause * 2, MAX_RETRY);
        continue;
      }
      pause = RETRY;
      if (lock.isReleased || stop.aborted) return;
      const f = info.holders[0];
      if (f !== undefined && f.fence === lock.fence) {
        known = f.value; // proclaimed anew: still leading
        continue;
      }
      const holder = f === undefined ? "nobody holds it" : `fence ${f.fence} holds it`;
      lock.setLost("not-held", `the key ${JSON.stringify(this.key)} was taken from the leader (${holder})`);
      return;
    }
  }

  /** Who leads now; null when nobody does. */
  async leader(opts: { signal?: AbortSignal } = {}): Promise<Leader | null> {
    const [info] = await this.client.inspect(this.key, opts);
    return leaderOf(info);
  }

  /**
   * The leader now (null: nobody), then every change (a new leader, or a
   * value proclaimed), pushed by the server through Watch, until the signal
   * aborts, the loop breaks, or the client ends. A change and its reversal
   * between two answers may be seen as none. A Watch that fails (a cluster
   * between leaders, a server at its limit of Watches) is tried again after
   * a pause of 250 ms doubling up to 5 s.
   *
   *     for await (const leader of election.observe({ signal })) { ... }
   */
  async *observe(opts: { signal?: AbortSignal } = {}): AsyncGenerator<Leader | null, void, undefined> {
    const stop = opts.signal === undefined ? this.client.ended : AbortSignal.any([opts.signal, this.client.ended]);
    let known: Leader | null;
    try {
      known = await this.leader({ signal: stop });
    } catch (e) {
      if (stop.aborted) return;
      throw e;
    }
    yield known;
    let pause = RETRY;
    while (!stop.aborted) {
      let info: KeyInfo;
      try {
        info = await this.client.watch(this.key, known === null ? null : { fence: known.fence, value: known.value }, { signal: stop });
      } catch {
        try {
          await sleep(pause, stop);
        } catch {
          return;
        }
        pause = Math.min(pause * 2, MAX_RETRY);
        continue;
      }
      pause = RETRY;
      const now = leaderOf(info);
      if (!sameLeader(now, known)) {
        known = now;
        yield now;
      }
    }
  }
}
