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
import { DlockError, connect, tlsFromEnv } from "../src/index.js";
import { Server } from "./helpers.js";

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
  await assert.rejects(connect(s.addr, { tls: { ca: fs.readFileSync(path.join(dir, "client.pem")) }, connectTimeout: 3000 }), /TLS handshake/);
  // The host dialled must be named: the certificate names 127.0.0.1, not "localhost".
  const port = s.addr.split(":")[1];
  await assert.rejects(connect(`localhost:${port}`, { tls, connectTimeout: 3000 }), /TLS handshake|ECONNREFUSED/);
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
