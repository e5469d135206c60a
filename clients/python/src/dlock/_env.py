"""Where to connect and with which token: arguments first, then DLOCK_SERVER and DLOCK_TOKEN."""

from __future__ import annotations

import os
import ssl
from typing import Iterable, List, Optional, Tuple, Union

from . import _tls

#: The server's default listen address, as in the Rust crate.
DEFAULT_SERVER = "127.0.0.1:7436"

#: Where to connect: one address, a comma-separated list, or a list.
Servers = Union[str, Iterable[str], None]


def server_addresses(server: Servers) -> List[str]:
    """The addresses of `server`, else of DLOCK_SERVER, else the default.

    One `HOST:PORT`, a comma-separated list of them (as `dlock -s` and the
    Rust library take it), or a list: a cluster's nodes, tried in order.
    Blanks around commas and empty entries are ignored. Raises `ValueError`
    for an entry that is not `HOST:PORT`, naming it.
    """
    if server is None or server == "":
        server = os.environ.get("DLOCK_SERVER") or DEFAULT_SERVER
    items = server.split(",") if isinstance(server, str) else list(server)
    addrs = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"dlock server {item!r} is not a HOST:PORT string")
        item = item.strip()
        if item:
            parse_address(item)
            addrs.append(item)
    if not addrs:
        raise ValueError(f"dlock server list {server!r} names no address")
    return addrs


def parse_address(text: str) -> Tuple[str, str, int]:
    """(text, host, port) of one `HOST:PORT` (`[::1]:7436` for IPv6)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dlock server {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return text, host, int(port)


def tls_context(
    ca: Optional[str],
    cert: Optional[str],
    key: Optional[str],
    context: Optional[ssl.SSLContext],
) -> Optional[ssl.SSLContext]:
    """The TLS settings to connect with, or None for plain TCP (the default).

    `context` as given wins; else `ca` (else DLOCK_TLS_CA) makes one that
    verifies the server's certificate against that CA and its name against
    the address's host, TLS 1.2 at least, with `cert` and `key` (else
    DLOCK_TLS_CERT, DLOCK_TLS_KEY) as the client's own certificate for a
    server that asks for one (mutual TLS), as the Rust client and `dlock` do;
    it offers the TLS protocol name "dlock", by which a cluster's TLS peer
    port, given by mistake, says what it is. A `context` given is used as it
    is, no protocol name added: an `ssl.SSLContext` in use cannot be changed
    safely (call `set_alpn_protocols(["dlock"])` on yours to be told).
    """
    if context is not None:
        return context
    ca = ca or os.environ.get("DLOCK_TLS_CA") or None
    cert = cert or os.environ.get("DLOCK_TLS_CERT") or None
    key = key or os.environ.get("DLOCK_TLS_KEY") or None
    if (cert is None) != (key is None):
        raise ValueError("tls_cert and tls_key go together (a client certificate needs its key)")
    if ca is None:
        if cert is not None:
            raise ValueError("tls_cert needs tls_ca: the server's certificate must be verified too")
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols([_tls.CLIENT_ALPN])
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def access_token(token: Optional[str]) -> str:
    """`token`, else DLOCK_TOKEN, else none (the empty string, as on the wire)."""
    if token is not None:
        return token
    return os.environ.get("DLOCK_TOKEN", "")
