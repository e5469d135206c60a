// Queued: an Enqueue waiting in line (the two-phase acquire of
// docs/PROTOCOL.md), whose wait() collects the grant. Mirrors
// clients/go/enqueue.go.

import { RequestType } from "./gen/dlock_pb.js";
import type { Client, LockOptions } from "./client.js";
import type { Link } from "./link.js";
import type { Lock } from "./lock.js";

export class Queued {
  /** The ticket a Wait names. */
  readonly ticket: bigint;
  /** How many requests were ahead of it, over its keys, when it was answered (it only goes down). */
  readonly place: number;
  readonly keys: string[];
  private waited = false;

  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly link: Link,
    keys: string[],
    private readonly opts: LockOptions,
    private readonly sent: number,
    ticket: bigint,
    place: number,
    private readonly unclaim: (() => void) | null,
  ) {
    this.keys = keys;
    this.ticket = ticket;
    this.place = place;
  }

  /**
   * Waits for the grant and returns its Lock; AcquireTimeoutError when the
   * Enqueue's wait limit passes. If the signal aborts first, a grant that
   * arrives later is released (and an Enqueue on a connection of its own is
   * withdrawn with it).
   */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<Lock> {
    if (this.waited) throw new Error("dlock: this Queued was waited for already");
    this.waited = true;
    const own = this.link !== this.client.link;
    let resp;
    try {
      resp = await this.link.call(RequestType.Wait, { ticket: this.ticket }, {
        signal: opts.signal,
        lockKeys: this.keys,
        settled: this.unclaim ?? undefined,
      });
    } catch (e) {
      if (own) {
        if (opts.signal?.aborted) {
          this.client.drainAside(this.link);
        } else {
          this.client.dropSide(this.link);
        }
      }
      throw e;
    }
    return this.client.granted(this.link, this.keys, resp.fence, this.opts, this.sent, this.unclaim);
  }
}
