#!/usr/bin/env python3
"""Regenerate src/dlock/_proto/ from proto/dlock.proto, or check it is current.

    python tools/gen_proto.py          # rewrite the checked-in files
    python tools/gen_proto.py --check  # exit 1 if they differ from a fresh run

Needs grpcio-tools at the version pinned in requirements-dev.txt: the
generated code names the protoc version that wrote it, so another version
gives a diff even when the .proto did not change.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE.parents[2] / "proto"
OUT_DIR = HERE.parent / "src" / "dlock" / "_proto"
FILES = ("dlock_pb2.py", "dlock_pb2.pyi")


def generate(into: Path) -> None:
    from grpc_tools import protoc  # only needed here, not at run time

    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={into}",
        f"--pyi_out={into}",
        str(PROTO_DIR / "dlock.proto"),
    ]
    if protoc.main(args) != 0:
        sys.exit(f"gen_proto: protoc failed on {PROTO_DIR / 'dlock.proto'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        if args.check:
            stale = [
                name
                for name in FILES
                if not (OUT_DIR / name).exists()
                or not filecmp.cmp(Path(tmp) / name, OUT_DIR / name, shallow=False)
            ]
            if stale:
                print(
                    f"gen_proto: {', '.join(stale)} in {OUT_DIR} not generated from the current "
                    "proto/dlock.proto; run clients/python/tools/gen_proto.py and commit",
                    file=sys.stderr,
                )
                return 1
            print("gen_proto: generated code is current")
            return 0
        for name in FILES:
            shutil.copyfile(Path(tmp) / name, OUT_DIR / name)
    print(f"gen_proto: wrote {', '.join(FILES)} to {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
