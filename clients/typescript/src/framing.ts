// Frames on a socket: every message is a 4-byte big-endian length, then
// that many bytes of protobuf (docs/CLIENTS.md, "Framing"). A frame may
// arrive split over any number of reads and many in one read. Requests
// written in one turn of the event loop leave in one write (the socket is
// corked until the next tick), so many tasks' pipelined requests share a
// system call under load.

import type * as net from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { RequestSchema, ResponseSchema } from "./gen/dlock_pb.js";
import type { Response } from "./gen/dlock_pb.js";
import { ProtocolError } from "./errors.js";

/** The version every request carries. */
export const PROTOCOL_VERSION = 2;

/** The largest answer frame accepted: a longer length is refused instead of allocated (the server keeps every answer within 4 MiB). */
export const MAX_ANSWER = 4 << 20;

export type RequestInit = MessageInitShape<typeof RequestSchema>;

/** `req`, length-prefixed. */
export function encodeFrame(req: RequestInit): Buffer {
  const body = toBinary(RequestSchema, create(RequestSchema, req));
  const frame = Buffer.allocUnsafe(4 + body.length);
  frame.writeUInt32BE(body.length, 0);
  frame.set(body, 4);
  return frame;
}

/**
 * A socket that reads answer frames and writes request frames. It fails
 * once (the socket closed, errored or sent something undecodable); `onFail`
 * is told, and `next` waiters are rejected.
 */
export class FrameConn {
  /** The TCP socket under a TLS one (the one to reset). */
  readonly raw: net.Socket;
  readonly socket: net.Socket;
  /** Set to receive frames; while unset, frames are queued for `next`. */
  onFrame: ((resp: Response) => void) | null = null;
  onFail: ((err: Error) => void) | null = null;
  failure: Error | null = null;
  private buf: Buffer = Buffer.alloc(0);
  private early: Response[] = [];
  private waiter: { resolve: (r: Response) => void; reject: (e: Error) => void } | null = null;
  private corked = false;
  private closedPromise: Promise<void>;

  constructor(socket: net.Socket, raw: net.Socket) {
    this.socket = socket;
    this.raw = raw;
    this.closedPromise = new Promise((resolve) => socket.once("close", () => resolve()));
    socket.on("data", (data: Buffer) => this.onData(data));
    socket.on("error", (err) => this.fail(err));
    socket.on("end", () => this.fail(new Error("the server closed the connection")));
    socket.on("close", () => this.fail(new Error("the connection closed")));
  }

  private onData(data: Buffer): void {
    this.buf = this.buf.length === 0 ? data : Buffer.concat([this.buf, data]);
    while (this.failure === null && this.buf.length >= 4) {
      const n = this.buf.readUInt32BE(0);
      if (n > MAX_ANSWER) {
        // A TLS record (an alert or a handshake) where a frame was due.
        const tls = (this.buf[0] === 0x15 || this.buf[0] === 0x16) && this.buf[1] === 3;
        this.fail(
          new ProtocolError(
            tls
              ? "the server speaks TLS (set DLOCK_TLS_CA to the CA that signed its certificate)"
              : `answer of ${n} bytes is over the client's limit of ${MAX_ANSWER}`,
          ),
        );
        this.destroy();
        return;
      }
      if (this.buf.length < 4 + n) break;
      let resp: Response;
      try {
        resp = fromBinary(ResponseSchema, this.buf.subarray(4, 4 + n));
      } catch (e) {
        this.fail(new ProtocolError(`undecodable answer: ${(e as Error).message}`));
        this.destroy();
        return;
      }
      this.buf = this.buf.subarray(4 + n);
      this.deliver(resp);
    }
  }

  private deliver(resp: Response): void {
    if (this.onFrame !== null) {
      this.onFrame(resp);
    } else if (this.waiter !== null) {
      const w = this.waiter;
      this.waiter = null;
      w.resolve(resp);
    } else {
      this.early.push(resp);
    }
  }

  private fail(err: Error): void {
    if (this.failure !== null) return;
    this.failure = err;
    if (this.waiter !== null) {
      const w = this.waiter;
      this.waiter = null;
      w.reject(err);
    }
    this.onFail?.(err);
  }

  /** The next frame (for a handshake, before onFrame is set). */
  next(): Promise<Response> {
    const early = this.early.shift();
    if (early !== undefined) return Promise.resolve(early);
    if (this.failure !== null) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /** Takes the frames that came before onFrame was set. */
  takeEarly(): Response[] {
    const e = this.early;
    this.early = [];
    return e;
  }

  write(frame: Uint8Array): void {
    if (this.failure !== null || this.socket.destroyed) return;
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(frame);
  }

  /**
   * Closes with an RST, not a FIN: a cluster node ends a session at once
   * when its connection is closed cleanly, and the session is to be
   * resumed elsewhere (docs/CLIENTS.md, "Clusters").
   */
  reset(): void {
    this.fail(new Error("reset by the client"));
    if (!this.raw.destroyed) {
      try {
        this.raw.resetAndDestroy();
      } catch {
        this.raw.destroy();
      }
    }
    if (!this.socket.destroyed) this.socket.destroy();
  }

  /** Ends the writing side cleanly once what is written has gone (reading goes on until the server closes). */
  end(): void {
    if (!this.socket.destroyed) this.socket.end();
  }

  /** Closes cleanly: a FIN after what is written, and the socket destroyed after `bound` ms if the server does not close its side. */
  close(bound = 1000): Promise<void> {
    this.end();
    const t = setTimeout(() => this.destroy(), bound);
    t.unref();
    return this.closedPromise.then(() => clearTimeout(t));
  }

  destroy(): void {
    if (!this.socket.destroyed) this.socket.destroy();
    if (!this.raw.destroyed) this.raw.destroy();
  }

  /** Resolves when the socket has closed. */
  closed(): Promise<void> {
    return this.closedPromise;
  }
}
