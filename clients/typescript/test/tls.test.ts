// TLS through node:tls against a server started with --tls-cert: the
// server's certificate checked against DLOCK_TLS_CA and the host dialled,
// and a client certificate (DLOCK_TLS_CERT, DLOCK_TLS_KEY) for a server
// that requires one. The certificates are made here with the openssl
// command; without it the tests are skipped, saying so.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as net from "node:net";
import { ConnectError, DlockError, TlsError, connect, tlsFiles, tlsFromEnv } from "../src/index.js";
import { Cluster, SERVER_BIN, Server } from "./helpers.js";

const haveOpenssl = spawnSync("openssl", ["version"]).status === 0;
const skip = haveOpenssl ? false : "the openssl command is not installed: no certificates to test TLS with";

/** A CA, a server certificate for IP 127.0.0.1 and a client certificate, in a temporary folder. */
function makeCerts(t: { after(fn: () => unknown): void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "dlock-ts-tls-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const ssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  ssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=dlock test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  for (const [name, cn, ext] of [
    ["server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"],
    ["client", "ts-client", "subjectAltName=DNS:ts-client\nextendedKeyUsage=clientAuth\n"],
  ]) {
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
    ssl("req", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${cn}`);
    ssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
      "-out", `${name}.pem`, "-days", "2", "-extfile", `${name}.ext`);
  }
  return dir;
}

function withEnv<T>(env: Record<string, string | undefined>, fn: () => T): T {
  const old: Record<string, string | undefined> = {};
  for (const k of Object.keys(env)) {
    old[k] = process.env[k];
    if (env[k] === undefined) delete process.env[k];
    else process.env[k] = env[k];
  }
  try {
    return fn();
  } finally {
    for (const k of Object.keys(old)) {
      if (old[k] === undefined) delete process.env[k];
      else process.env[k] = old[k];
    }
  }
}

test("TLS: the server's certificate is checked against DLOCK_TLS_CA and the host dialled", { skip }, async (t) => {
  const dir = makeCerts(t);
  const s = await Server.start(t, ["--tls-cert", path.join(dir, "server.pem"), "--tls-key", path.join(dir, "server.key")]);
  const tls = withEnv({ DLOCK_TLS_CA: path.join(dir, "ca.pem"), DLOCK_TLS_CERT: undefined, DLOCK_TLS_KEY: undefined }, () => tlsFromEnv());
  assert.ok(tls !== null);
  const c = await connect(s.addr, { tls });
  t.after(() => c.close());
  const l = await c.lock("tls");
  assert.equal((await c.inspect("tls"))[0].holders[0].fence, l.fence);
  await l.unlock();
  // Plain TCP to a TLS server: the error says what to set.
  await assert.rejects(connect(s.addr, { tls: null, connectTimeout: 3000 }), (e: Error) => e instanceof DlockError && /DLOCK_TLS_CA/.test(e.message));
  // A CA that did not sign the server's certificate.
  await assert.rejects(connect(s.addr, { tls: { ca: fs.readFileSync(path.join(dir, "client.pem")) }, connectTimeout: 3000 }), /TLS handshake.*give tls\.ca \(DLOCK_TLS_CA\) the CA file that signed it/);
  // The host dialled must be named: the certificate names 127.0.0.1, not "localhost".
  const port = s.addr.split(":")[1];
  await assert.rejects(connect(`localhost:${port}`, { tls, connectTimeout: 3000 }), /does not name localhost|ECONNREFUSED/);
});

test("TLS: a server that requires a client certificate accepts DLOCK_TLS_CERT and DLOCK_TLS_KEY", { skip }, async (t) => {
  const dir = makeCerts(t);
  const s = await Server.start(t, [
    "--tls-cert", path.join(dir, "server.pem"),
    "--tls-key", path.join(dir, "server.key"),
    "--tls-client-ca", path.join(dir, "ca.pem"),
  ]);
  const ca = path.join(dir, "ca.pem");
  const without = withEnv({ DLOCK_TLS_CA: ca, DLOCK_TLS_CERT: undefined, DLOCK_TLS_KEY: undefined }, () => tlsFromEnv());
  await assert.rejects(connect(s.addr, { tls: without, connectTimeout: 3000 }));
  const mutual = withEnv(
    { DLOCK_TLS_CA: ca, DLOCK_TLS_CERT: path.join(dir, "client.pem"), DLOCK_TLS_KEY: path.join(dir, "client.key") },
    () => tlsFromEnv(),
  );
  const c = await connect(s.addr, { tls: mutual });
  t.after(() => c.close());
  await (await c.lock("mtls")).unlock();
  assert.throws(() => withEnv({ DLOCK_TLS_CA: ca, DLOCK_TLS_CERT: path.join(dir, "client.pem"), DLOCK_TLS_KEY: undefined }, () => tlsFromEnv()), DlockError);
});

// A TLS client given a cluster node's TLS peer port (--peer-listen) by
// mistake: the port names its own TLS protocol and refuses "dlock", which
// this client offers, before it asks for a client certificate. The error
// says so in the Rust client's words, and no other node is tried; the
// client port (--listen), with the same files, takes the same client. One
// node: the peer port's TLS answers before any election. Certificates by
// `dlock-server cert`.
test("TLS: a client at a TLS peer port is told to give a client port", async (t) => {
  const certs = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "dlock-ts-peer-tls-")), "certs");
  t.after(() => fs.rmSync(path.dirname(certs), { recursive: true, force: true }));
  for (const args of [["create-ca"], ["create-node", "n1", "--addr", "127.0.0.1"]]) {
    execFileSync(SERVER_BIN, ["cert", ...args, "--dir", certs], { stdio: ["ignore", "ignore", "pipe"] });
  }
  const [ca, cert, key] = ["ca.pem", "n1.pem", "n1.key"].map((f) => path.join(certs, f));
  const c = await Cluster.start(t, 1, ["--tls-cert", cert, "--tls-key", key, "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca]);
  const peer = c.peerAddr(0);
  // An address nothing listens on (a port just given up).
  const closed = await new Promise<string>((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(`127.0.0.1:${port}`));
    });
  });
  await assert.rejects(connect([peer, closed], { tls: tlsFiles(ca), connectTimeout: 5000 }), (e: unknown) => {
    assert.ok(e instanceof TlsError, `want a TlsError, got ${String(e)}`);
    assert.ok(e instanceof ConnectError);
    assert.equal(e.problem, "not-a-client-port");
    assert.equal(e.addr, peer);
    assert.equal(e.attempts.length, 1, "another node was tried");
    assert.match(e.message, /^dlock: the server at \S+ refuses dlock's TLS protocol name \(.+\): it is no dlock client port, most likely a cluster node's peer port \(its --peer-listen\): give a client port instead \(a node's --listen\)$/);
    assert.ok(e.message.includes(peer));
    assert.doesNotMatch(e.message, /certificate/);
    return true;
  });
  const client = await connect(c.addrs[0], { tls: tlsFiles(ca), connectTimeout: 5000 });
  t.after(() => client.close());
  assert.ok((await client.ping()) >= 0);
});
