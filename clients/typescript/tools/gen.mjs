#!/usr/bin/env node
// Generates src/gen/dlock_pb.ts from ../../proto/dlock.proto with buf and
// protoc-gen-es from node_modules (npm run gen), or with --check fails if
// the committed file differs from what the generator makes now (npm run
// gen:check, run by ci.sh), as the Python and Go clients' checks do.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const bin = join(root, "node_modules", ".bin");
const committed = join(root, "src", "gen", "dlock_pb.ts");
const check = process.argv.includes("--check");
const out = check ? mkdtempSync(join(tmpdir(), "dlock-gen-")) : root;
try {
  execFileSync(join(bin, "buf"), ["generate", "--template", "buf.gen.yaml", "-o", out], {
    cwd: root,
    stdio: "inherit",
    // protoc-gen-es is found on PATH.
    env: { ...process.env, PATH: `${bin}:${process.env.PATH}` },
  });
  if (check) {
    const fresh = readFileSync(join(out, "src", "gen", "dlock_pb.ts"), "utf8");
    const old = existsSync(committed) ? readFileSync(committed, "utf8") : "";
    if (fresh !== old) {
      console.error("src/gen/dlock_pb.ts is not what proto/dlock.proto generates: run `npm run gen` and commit it");
      process.exit(1);
    }
    console.log("src/gen/dlock_pb.ts matches proto/dlock.proto");
  }
} finally {
  if (check) rmSync(out, { recursive: true, force: true });
}
