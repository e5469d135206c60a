"""Plain values the client returns: server limits, key information, server counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from ._proto import dlock_pb2 as pb


def _seconds(micro: int) -> float:
    return micro / 1_000_000


@dataclass(frozen=True)
class Limits:
    """What the server told in its answer to Hello (`ServerLimits`), in seconds and counts."""

    #: The server may end a connection from which no request arrived for this
    #: long, releasing its locks without a lease.
    session_timeout: float
    max_lease: float
    max_keys: int
    max_key_len: int
    max_frame: int
    max_pipeline: int
    #: A cluster node: sessions outlive a broken connection for their TTL
    #: and can be resumed through the leader; only answers from commands
    #: that kept the session alive prove it lives (see `dlock.connection`).
    resumable_sessions: bool = False
    #: A cluster node's election timeout: a silent leader is replaced within
    #: about 3 to 4 times this (`dlock.liveness`). None: not stated (a
    #: single server, or a node that predates the field).
    election_timeout: Optional[float] = None

    @classmethod
    def from_proto(cls, limits: "pb.ServerLimits") -> "Limits":
        return cls(
            session_timeout=_seconds(limits.session_timeout_micro),
            max_lease=_seconds(limits.max_lease_micro),
            max_keys=limits.max_keys,
            max_key_len=limits.max_key_len,
            max_frame=limits.max_frame,
            max_pipeline=limits.max_pipeline,
            resumable_sessions=limits.resumable_sessions,
            election_timeout=_seconds(limits.election_timeout_micro) or None,
        )


#: Assumed for a server older than Hello (it answers InvalidType): the
#: server's defaults, whose session timeout is the 60 s idle timeout.
DEFAULT_LIMITS = Limits(
    session_timeout=60.0,
    max_lease=30 * 86400.0,
    max_keys=256,
    max_key_len=1024,
    max_frame=16384,
    max_pipeline=1024,
)


@dataclass(frozen=True)
class KeyHolder:
    """One holder of a key."""

    fence: int
    #: Seconds left on this holder's lease; None when held without lease.
    lease_remaining: Optional[float]
    held_by_caller: bool
    #: `ip:port` of the holder's connection, when it is connected.
    holder_addr: Optional[str]
    #: The hold's value: what its Lock or a later Proclaim set (b"": none).
    value: bytes = b""
    #: Seconds since the grant, when the server says (it counts again on a
    #: re-grant to the same owner).
    held_for: Optional[float] = None

    @classmethod
    def from_proto(cls, h: "pb.KeyHolder") -> "KeyHolder":
        return cls(
            fence=h.fence,
            lease_remaining=_seconds(h.lease_remaining_micro) if h.lease_remaining_micro else None,
            held_by_caller=h.held_by_caller,
            holder_addr=h.holder_addr or None,
            value=h.value,
            held_for=_seconds(h.held_micro) if h.held_micro else None,
        )


@dataclass(frozen=True)
class KeyInfo:
    """One key as Inspect describes it."""

    key: str
    #: Fencing token of the holder (of a key held shared: the latest
    #: holder's); 0 when the key is free.
    fence: int
    #: Seconds left on the holder's lease; None when free or held without lease.
    lease_remaining: Optional[float]
    waiters: int
    held_by_caller: bool
    #: `ip:port` of the holder's connection, when it is connected.
    holder_addr: Optional[str]
    #: Held shared (by readers, or as a semaphore).
    shared: bool = False
    #: The limit the shared holders agreed on; 0 is no limit.
    limit: int = 0
    #: Every holder of a key held shared, by fence; empty otherwise. Of a key
    #: with thousands of them, the server may list only the oldest, the
    #: caller's own and the latest (see `holders_omitted`).
    holders: Tuple[KeyHolder, ...] = ()
    #: The value of the holder `fence` names (b"": free, or none set).
    value: bytes = b""
    #: Seconds since that holder's grant; None when free.
    held_for: Optional[float] = None
    #: Holders the server left out of `holders` (never the caller's), to
    #: keep its answer within 4 MiB; 0 when it lists every one.
    holders_omitted: int = 0

    @property
    def held(self) -> bool:
        return self.fence != 0

    def first(self) -> Optional[KeyHolder]:
        """The holder with the lowest fencing token, the one that has held the
        key longest (the only one of a key held exclusively: an election's
        leader); None when the key is free. What Watch compares."""
        if self.holders:
            return min(self.holders, key=lambda h: h.fence)
        if not self.fence:
            return None
        return KeyHolder(self.fence, self.lease_remaining, self.held_by_caller, self.holder_addr, self.value, self.held_for)

    @classmethod
    def from_proto(cls, info: "pb.KeyInfo") -> "KeyInfo":
        return cls(
            key=info.key,
            fence=info.fence,
            lease_remaining=_seconds(info.lease_remaining_micro) if info.lease_remaining_micro else None,
            waiters=info.waiters,
            held_by_caller=info.held_by_caller,
            holder_addr=info.holder_addr or None,
            shared=info.shared,
            limit=info.limit,
            holders=tuple(KeyHolder.from_proto(h) for h in info.holders),
            value=info.value,
            held_for=_seconds(info.held_micro) if info.held_micro else None,
            holders_omitted=info.holders_omitted,
        )


@dataclass(frozen=True)
class ServerStats:
    """Server-wide counts: the answer to an Inspect that names no keys."""

    connections: int
    held_keys: int
    waiting_requests: int


@dataclass(frozen=True)
class Reconnecting:
    """The connection to the node at `addr` failed (`reason`: broken, the node
    stopped leading, could not commit, is shutting down, went silent, or
    told the liveness probe it cannot serve); the client looks for the
    leader to resume `session` there. Its locks are still held."""

    addr: str
    reason: str
    session: int


@dataclass(frozen=True)
class Resumed:
    """`session` was resumed on the node at `addr`, `after` seconds after the
    connection failed; the requests not yet answered were sent again."""

    addr: str
    session: int
    after: float


#: What `on_event` is told about a client's connection.
Event = Union[Reconnecting, Resumed]
