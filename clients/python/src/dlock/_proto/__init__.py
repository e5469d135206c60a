"""Code generated from proto/dlock.proto by tools/gen_proto.py; do not edit."""
