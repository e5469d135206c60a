"""Where to connect and with which token: arguments first, then DLOCK_SERVER and DLOCK_TOKEN."""

from __future__ import annotations

import os
from typing import Optional, Tuple

#: The server's default listen address, as in the Rust crate.
DEFAULT_SERVER = "127.0.0.1:7436"


def server_address(server: Optional[str]) -> Tuple[str, str, int]:
    """(text, host, port) of `server`, else of DLOCK_SERVER, else the default.

    One address only: the cluster work (a list of servers, following
    NotLeader) has not landed yet, so a list is refused instead of half-used.
    """
    text = server or os.environ.get("DLOCK_SERVER") or DEFAULT_SERVER
    text = text.strip()
    if "," in text:
        raise ValueError(f"dlock server {text!r}: a list of servers is not supported yet; give one HOST:PORT")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dlock server {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return text, host, int(port)


def access_token(token: Optional[str]) -> str:
    """`token`, else DLOCK_TOKEN, else none (the empty string, as on the wire)."""
    if token is not None:
        return token
    return os.environ.get("DLOCK_TOKEN", "")
