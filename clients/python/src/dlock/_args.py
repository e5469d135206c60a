"""The arguments of requests, as the wire wants them: keys, values, durations, Lock options."""

from __future__ import annotations

from typing import Iterable, List, Optional, Union

from ._proto import dlock_pb2 as pb

Keys = Union[str, Iterable[str]]
#: A hold's value: bytes, or a str sent as UTF-8.
Value = Union[bytes, str, None]
#: Which keys a Lock takes shared: all (True), none (False), or those named.
Shared = Union[bool, str, Iterable[str]]


def keys_of(keys: Keys) -> List[str]:
    """One key or several: a bare string is one key, not its characters."""
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def share(body: "pb.RequestLock", keys: List[str], shared: Shared, limit: int) -> None:
    """Sets which of `keys` are taken shared, and the semaphore's limit.

    Left unset for an exclusive Lock, so its encoding is what every older
    client sends."""
    if limit < 0:
        raise ValueError(f"limit {limit} must not be negative")
    if shared is True:
        names = list(keys)
    elif shared is False:
        names = []
    else:
        names = keys_of(shared)
        stray = [k for k in names if k not in keys]
        if stray:
            raise ValueError(f"shared keys {stray!r} are not among the keys locked")
    if limit and not names:
        raise ValueError("limit needs shared keys (a semaphore is a shared lock)")
    body.shared_keys.extend(names)
    body.limit = limit


def value_bytes(value: Value) -> bytes:
    """A hold's value on the wire: bytes as given, a str as UTF-8."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def micros(seconds: float) -> int:
    # A positive duration below a microsecond still means "a little", not 0
    # (which means "no limit" for wait and "no lease" for release).
    return max(1, round(seconds * 1_000_000))


def lock_body(
    keys: List[str],
    wait: Optional[float],
    lease: Optional[float],
    shared: Shared,
    limit: int,
    value: Value,
) -> "pb.RequestLock":
    """The arguments of a Lock or Enqueue."""
    body = pb.RequestLock(keys=keys)
    share(body, keys, shared, limit)
    if wait is not None:
        if wait < 0:
            raise ValueError(f"wait {wait} must not be negative")
        if wait == 0:
            body.try_lock = True
        else:
            body.wait_micro = micros(wait)
    if lease is not None:
        if lease <= 0:
            raise ValueError(f"lease {lease} must be positive")
        body.release_micro = micros(lease)
    if value is not None:
        body.value = value_bytes(value)
    return body
