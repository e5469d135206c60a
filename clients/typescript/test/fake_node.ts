// A fake cluster node for the tests that need a node to say what no real
// one says on cue: a probe answered Unavailable while the session's own
// requests are served, ShuttingDown on a session, a probe's Ping held
// unanswered while the session link hears from the node, new connections
// closed at once while the old ones stay open. A real server
// resets the connections of a leader that steps aside before either
// answer is seen, and cannot be made silent on one connection only.

import * as net from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { RequestSchema, RequestType, ResponseSchema, ResponseStatus } from "../src/gen/dlock_pb.js";
import type { Request } from "../src/gen/dlock_pb.js";

type Answer = MessageInitShape<typeof ResponseSchema>;

/**
 * What a fake node says to a request beyond Ok: a status, or null for no
 * answer at all (the request is held, as a silent node holds it; nothing
 * after it on that connection is answered either, since answers come in
 * order).
 */
export type Say = { status: ResponseStatus; errorText: string } | null;

/**
 * A fake cluster node: answers Hello as a node with resumable sessions
 * (session TTL `ttl` ms, election timeout 200 ms), opens (or resumes)
 * session 7, and answers everything else as `answer` says (status Ok when
 * it says nothing). `onSession`: whether the request came on a connection
 * that opened a session (a link's, not a probe's).
 */
export class FakeNode {
  readonly server: net.Server;
  addr = "";
  sessionOpened = 0;
  /** Connections the client closed while this node held one of their requests unanswered. */
  heldClosed = 0;
  /**
   * Set, the node closes every new connection at once, as one that is
   * going away (the probe takes that for no silence); those open stay.
   */
  refuse = false;
  constructor(
    private readonly answer: (req: Request, onSession: boolean) => Say | undefined,
    private readonly ttl = 10_000,
  ) {
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
    if (this.refuse) {
      sock.resetAndDestroy();
      return;
    }
    let buf = Buffer.alloc(0);
    let onSession = false;
    let holding = false;
    const ttl = BigInt(this.ttl) * 1000n;
    sock.on("error", () => {});
    sock.on("close", () => {
      if (holding) this.heldClosed++;
    });
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const n = buf.readUInt32BE(0);
        const req = fromBinary(RequestSchema, buf.subarray(4, 4 + n));
        buf = buf.subarray(4 + n);
        if (holding) continue;
        const resp: Answer = { version: 2, requestId: req.id, status: ResponseStatus.Ok };
        if (req.type === RequestType.Hello) {
          resp.limits = {
            sessionTimeoutMicro: ttl,
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
          resp.sessionTtlMicro = ttl;
        } else {
          const say = this.answer(req, onSession);
          if (say === null) {
            holding = true;
            continue;
          } else if (say !== undefined) {
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
