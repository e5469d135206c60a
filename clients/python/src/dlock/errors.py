"""Exceptions raised by the dlock client, mirroring the Rust client's `Error`.

Every error that comes from a server answer carries its `status`; the others
(connection, protocol) carry their cause as `__cause__` where there is one.
"""

from __future__ import annotations

import enum
from typing import List, Optional, Sequence, Tuple

from ._proto import dlock_pb2 as pb

# Built from the generated descriptor so a status added to the .proto needs
# no edit here.
Status = enum.IntEnum("Status", dict(pb.ResponseStatus.items()))  # type: ignore[misc]
Status.__doc__ = "A `ResponseStatus` of proto/dlock.proto."


class DlockError(Exception):
    """Base class of every error of this package."""

    #: The status the server answered with, for errors that come from one.
    status: Optional[Status] = None


class ConnectError(DlockError):
    """The connection could not be made: TCP, the TLS handshake, or the
    first answer (the `OSError`, `ssl.SSLError` or `ConnectionLost` is
    `__cause__`). Given several servers, none would do: `attempts` lists
    each address tried and why it failed, and the message names them all."""

    def __init__(self, addr: str, reason: str, attempts: Optional[Sequence[Tuple[str, str]]] = None) -> None:
        if attempts is not None and len(attempts) > 1:
            super().__init__(f"cannot connect to any of {len(attempts)} servers: {reason}")
        else:
            super().__init__(f"cannot connect to {addr}: {reason}")
        self.addr = addr
        self.reason = reason
        #: (address, why) of each server tried, in the order first tried.
        self.attempts: List[Tuple[str, str]] = list(attempts) if attempts is not None else [(addr, reason)]


class TLSProblem(enum.Enum):
    """What a `TLSError` found."""

    #: A client without TLS reached a server that speaks TLS (it answered
    #: with a TLS record).
    SERVER_SPEAKS_TLS = "the server speaks TLS"
    #: A TLS client's handshake found no TLS at the server (what came back
    #: is no TLS record).
    SERVER_SPEAKS_NO_TLS = "the server does not speak TLS"
    #: The server presented a CA certificate (basic constraints CA:TRUE) as
    #: its own, as when one self-signed certificate is both the server's and
    #: the clients' CA. Python's ssl accepts it when it is in the CA file;
    #: this client refuses it, as the other dlock clients' TLS does (unless
    #: `ssl_context` verifies nothing).
    CA_USED_AS_SERVER_CERTIFICATE = "a CA certificate used as the server's"
    #: The server's TLS refused the protocol name (ALPN) "dlock" this client
    #: offers, with the alert no_application_protocol: it is no dlock client
    #: port, most likely a cluster node's peer port (its --peer-listen),
    #: which names its own.
    NOT_A_CLIENT_PORT = "not a dlock client port"


class TLSError(ConnectError):
    """A connect whose TLS setup does not match the server's; the message
    says what to change. Raised as it is, without trying the other servers:
    a cluster's nodes share their TLS setup. `problem` is a `TLSProblem`,
    `detail` what the handshake found (None for `SERVER_SPEAKS_TLS`); its
    `ssl.SSLError`, if any, is `__cause__`."""

    def __init__(self, problem: TLSProblem, addr: str, detail: Optional[str] = None) -> None:
        if problem is TLSProblem.SERVER_SPEAKS_TLS:
            text = (
                f"the server at {addr} speaks TLS: give the CA certificate that signed its certificate "
                "with tls_ca= (DLOCK_TLS_CA)"
            )
        elif problem is TLSProblem.SERVER_SPEAKS_NO_TLS:
            text = (
                f"the server at {addr} does not speak TLS ({detail}): connect without tls_ca= (DLOCK_TLS_CA), "
                "or start dlock-server with --tls-cert and --tls-key"
            )
        elif problem is TLSProblem.NOT_A_CLIENT_PORT:
            # The words of the Rust client's Error::NotAClientPort.
            text = (
                f"the server at {addr} refuses dlock's TLS protocol name ({detail}): it is no dlock client port, "
                "most likely a cluster node's peer port (its --peer-listen): give a client port instead "
                "(a node's --listen)"
            )
        else:
            text = (
                f"the server at {addr} presents a CA certificate as its own ({detail}): make a CA and a server "
                "certificate signed by it (dlock-server cert create-ca, then create-node), give the server the "
                "node's and the clients the CA's"
            )
        DlockError.__init__(self, text)
        self.addr = addr
        self.reason = text
        self.attempts = [(addr, text)]
        self.problem = problem
        self.detail = detail


class NotOneCluster(DlockError):
    """Several servers were given, and the one that answered is a single
    server, not a node of a cluster (its Hello limits do not say
    `resumable_sessions`). A list must name one cluster's nodes: single
    servers share no locks, so a client that moved on to the next when the
    first was down would lock beside a holder of the same key on the first.
    Raised at once, without trying the other servers; `addr` is the single
    server's address. (The Rust client's `Error::NotOneCluster`.)"""

    def __init__(self, addr: str) -> None:
        super().__init__(
            f"{addr} is a single server, not a cluster node: several addresses must be the nodes of one cluster, "
            "since single servers share no locks (give this server's address alone)"
        )
        self.addr = addr


class ConnectionLost(DlockError):
    """The connection ended; locks held without a lease were released by the server."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection to the server lost: {reason}")
        self.reason = reason


class ProtocolError(DlockError):
    """The server sent something this client cannot understand; the connection is closed."""


class Timeout(DlockError):
    """The wait limit passed, or a try-lock found keys busy. `busy` lists them."""

    status = Status.AcquireTimeout

    def __init__(self, busy: Sequence[str]) -> None:
        super().__init__(f"lock not acquired: busy keys {list(busy)}")
        self.busy = list(busy)


class AccessDenied(DlockError):
    """The server wants an access token (DLOCK_TOKEN) that was missing or is not accepted."""

    status = Status.AccessDenied

    def __init__(self, text: str) -> None:
        super().__init__(f"access denied: {text}")
        self.text = text


class NotHeld(DlockError):
    """Unlock or Renew named keys not held (any more), e.g. after a lease ran out."""

    status = Status.NotHeld

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__(f"keys not held: {list(keys)}")
        self.keys = list(keys)


class ServerError(DlockError):
    """The server refused the request: bad input, a limit, shutting down.

    `sent` is False for a request the client refused itself, from the
    server's limits, without sending it (one over the server's max_frame,
    which the server would answer `FrameTooLarge` and close the connection
    for): the message is then `text` alone."""

    def __init__(self, status: Status, text: str, *, sent: bool = True) -> None:
        super().__init__(f"server answered {status.name}: {text}" if sent else text)
        self.status = status
        self.text = text
        self.sent = sent


class LockLost(DlockError):
    """A lock can no longer be assumed held; `reason` says why (see `Lock.lost`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"lock lost: {reason}")
        self.reason = reason


def from_response(resp: "pb.Response") -> DlockError:
    """The exception for a response whose status is not Ok."""
    try:
        status = Status(resp.status)
    except ValueError:
        return ProtocolError(f"unknown response status {resp.status}")
    if status == Status.AcquireTimeout:
        return Timeout(resp.keys)
    if status == Status.AccessDenied:
        return AccessDenied(resp.error_text)
    if status == Status.NotHeld:
        return NotHeld(resp.keys)
    return ServerError(status, resp.error_text)
