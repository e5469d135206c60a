// A node that cannot serve is left at once (docs/PROTOCOL.md, "Noticing a
// node that cannot serve"): a probe answered Unavailable counts as silence,
// and ShuttingDown on a session sends the session to another node. Against
// two fake cluster nodes written here, since a real server resets the
// connections of a leader that steps aside before either answer is seen.

import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { RequestSchema, RequestType, ResponseSchema, ResponseStatus } from "../src/gen/dlock_pb.js";
import type { Request } from "../src/gen/dlock_pb.js";
import type { ClientEvent } from "../src/index.js";
import { client, waitFor } from "./helpers.js";

type Answer = MessageInitShape<typeof ResponseSchema>;
/** What a fake node says to a request beyond Ok. */
type Say = { status: ResponseStatus; errorText: string };

/** A fake cluster node: answers Hello as a node with resumable sessions, opens (or resumes) session 7, and
 * answers everything else as `answer` says (status Ok when it says nothing). */
class FakeNode {
  readonly server: net.Server;
  addr = "";
  sessionOpened = 0;
  constructor(private readonly answer: (req: Request, onSession: boolean) => Say | undefined) {
    this.server = net.createServer((sock) => this.serve(sock));
  }
  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    const a = this.server.address() as net.AddressInfo;
    this.addr = `127.0.0.1:${a.port}`;
  }
  close(): void {
    this.server.close();
  }
  private serve(sock: net.Socket): void {
    let buf = Buffer.alloc(0);
    let onSession = false;
    sock.on("error", () => {});
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const n = buf.readUInt32BE(0);
        const req = fromBinary(RequestSchema, buf.subarray(4, 4 + n));
        buf = buf.subarray(4 + n);
        const resp: Answer = { version: 2, requestId: req.id, status: ResponseStatus.Ok };
        if (req.type === RequestType.Hello) {
          resp.limits = {
            sessionTimeoutMicro: 10_000_000n,
            maxLeaseMicro: 3_600_000_000n,
            maxKeys: 64,
            maxKeyLen: 1024,
            maxFrame: 1 << 20,
            maxPipeline: 1024,
            resumableSessions: true,
            electionTimeoutMicro: 200_000n,
          };
        } else if (req.type === RequestType.OpenSession) {
          onSession = true;
          this.sessionOpened++;
          resp.session = 7n;
          resp.sessionTtlMicro = 10_000_000n;
        } else {
          const say = this.answer(req, onSession);
          if (say !== undefined) {
            resp.status = say.status;
            resp.errorText = say.errorText;
          } else if (req.type === RequestType.Lock) {
            resp.fence = 1n;
          }
        }
        const body = toBinary(ResponseSchema, create(ResponseSchema, resp));
        const f = Buffer.alloc(4 + body.length);
        f.writeUInt32BE(body.length, 0);
        f.set(body, 4);
        sock.write(f);
      }
    });
  }
}

test("a probe answered Unavailable moves the session to another node at once", async (t) => {
  // The first node serves its session's requests but answers the probe's session-less Ping Unavailable:
  // it counts itself leader with no majority behind it.
  const a = new FakeNode((req, onSession) =>
    req.type === RequestType.Ping && !onSession ? { status: ResponseStatus.Unavailable, errorText: "this node cannot serve" } : undefined,
  );
  const b = new FakeNode(() => undefined);
  await a.start();
  await b.start();
  t.after(() => {
    a.close();
    b.close();
  });
  const events: ClientEvent[] = [];
  const c = await client(t, [a.addr, b.addr], { onEvent: (e) => events.push(e) });
  assert.equal(c.addr, a.addr, "the session opens on the first node");
  await waitFor("the session resumed on the other node", () => events.some((e) => e.kind === "resumed" && e.addr === b.addr), 10_000);
  assert.equal(b.sessionOpened, 1);
});

test("ShuttingDown on a session resumes it elsewhere and the Lock is answered there", async (t) => {
  const a = new FakeNode((req) =>
    req.type === RequestType.Lock ? { status: ResponseStatus.ShuttingDown, errorText: "server is shutting down" } : undefined,
  );
  const b = new FakeNode(() => undefined);
  await a.start();
  await b.start();
  t.after(() => {
    a.close();
    b.close();
  });
  const c = await client(t, [a.addr, b.addr]);
  assert.equal(c.addr, a.addr);
  const lock = await c.lock("k");
  assert.equal(lock.fence, 1n, "granted by the node the session moved to");
  assert.equal(c.addr, b.addr);
});
