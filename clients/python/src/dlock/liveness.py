"""Noticing that a cluster node has gone silent, even while every request
on a connection waits rightly (a Lock in line holds back the answers behind
it, Pings included). Mirrors src/liveness.rs of the Rust library.

A node that stalls instead of dying (SIGSTOP, a VM freeze, an fsync stall)
or sits behind a path that drops packets without a reset keeps its sockets
open and says nothing. The rest of the cluster replaces it as leader within
3 to 4 election timeouts, and from then on nobody keeps the client's
session alive: it must resume on the new leader well within the session's
TTL. The connection's own answers cannot tell in time (they come in request
order), so one *probe* per client and node pings on a connection of its
own, with no session, which the node answers at once without a commit.
When a Ping (or the probe's Hello) goes unanswered for `silence_limit`,
every connection of the client on that node that has not heard from it
within the limit either is reset and resumes its session elsewhere
(connection.py; `rules.gone_silent`: one that has stays, since the probe's
own connection was slow, not the node, but goes as soon as it too has
heard nothing for the limit, unless the probe is answered again), and the node is tried last until
it answers again (`Dial.suspect`). A Ping answered `Unavailable` sends
every connection on the node away at once, whatever they heard: the node
counts itself leader with no majority behind it (cut off from its peers
while its clients still reach it, or stopping on SIGTERM) and can serve
none of the sessions on it (docs/PROTOCOL.md, "Noticing a node that
cannot serve"). A node that refuses the probe outright (down, full,
access denied, closed) or answers it with another error is not silent: that is left to the connections, which see it
themselves, and the probe tries again later, backing off up to
`MAX_RETRY`.

The probe of a node runs while at least one of the client's connections is
on it (`watch_node`) and stops with the last one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

from . import rules
from ._proto import dlock_pb2 as pb
from .dial import HELLO_ID, PROTOCOL_VERSION, Stream, connect_stream, reset
from .errors import DlockError, Status

if TYPE_CHECKING:
    from .dial import Dial

__all__ = [
    "DEFAULT_ELECTION_TIMEOUT",
    "MAX_RETRY",
    "MIN_SILENCE",
    "SILENCE_FLOOR",
    "Probe",
    "silence_limit",
    "watch_node",
]

log = logging.getLogger("dlock")

#: `rules.DEFAULT_ELECTION_TIMEOUT`, `rules.MIN_SILENCE` and
#: `rules.SILENCE_FLOOR`, in seconds.
DEFAULT_ELECTION_TIMEOUT = rules.to_seconds(rules.DEFAULT_ELECTION_TIMEOUT)
MIN_SILENCE = rules.to_seconds(rules.MIN_SILENCE)
SILENCE_FLOOR = rules.to_seconds(rules.SILENCE_FLOOR)
#: The longest pause between probe attempts on a node that refuses them.
MAX_RETRY = 5.0


def silence_limit(election_timeout: Optional[float], ttl: float) -> float:
    """How long a node may leave a probe unanswered before it is taken for
    gone: three election timeouts (by then the others have replaced it if
    it led; `election_timeout` None or 0: `DEFAULT_ELECTION_TIMEOUT`), at
    least `MIN_SILENCE`, and at most a quarter of the session's `ttl` (which
    wins: a short TTL must leave room to resume), so that finding a new
    leader and resuming there fit in what is left (docs/PROTOCOL.md,
    "Cluster", has the whole budget); but never below `SILENCE_FLOOR`, so
    that a node stating no TTL does not make the probe spin. In seconds;
    `rules.silence_limit` is the rule, in nanoseconds (as
    rules::silence_limit in src/rules.rs; the shared vectors,
    tests/test_rule_vectors.py, hold them together)."""
    election = rules.to_ns(election_timeout) if election_timeout else None
    return rules.to_seconds(rules.silence_limit(election, rules.to_ns(ttl)))


#: Told how long the node left the probe unanswered, in seconds (for a
#: node that answered `Unavailable`: how long that answer took), what the
#: probe found, for messages ("left the liveness probe unanswered for
#: 1.5 s", "answered the liveness probe Unavailable ..."), and whether the
#: node answered `Unavailable` (it cannot serve) rather than nothing.
OnSilent = Callable[[float, str, bool], None]


def watch_node(dial: "Dial", addr: str, limit: float, on_silent: OnSilent) -> Callable[[], None]:
    """Calls `on_silent` each time the probe of `addr` finds it silent (or
    answering `Unavailable`: it cannot serve), starting the probe if no
    connection of `dial`'s client has one running (with `limit`: the first
    watcher's). Returns the function that stops watching; the probe stops
    when its last watcher does. Call it on the event loop that runs the
    client."""
    probe = dial.probes.get(addr)
    if probe is None or probe.stopped:
        probe = Probe(dial, addr, limit)
        dial.probes[addr] = probe
    return probe.watch(on_silent)


class Probe:
    """The probe of one node for one client (`Dial`): a connection of its
    own, Hello, then a Ping every third of `limit`; see the module doc."""

    def __init__(self, dial: "Dial", addr: str, limit: float) -> None:
        self.dial = dial
        self.addr = addr
        self.limit = limit
        #: How many times the node was found silent.
        self.silences = 0
        #: How many of the probe's Hellos and Pings the node answered `Ok`:
        #: a connection that outlived a silence learns from it that the
        #: node answers again.
        self.answered = 0
        #: Set once the last watcher let go: the probe sends nothing more.
        self.stopped = False
        self._loop = asyncio.get_running_loop()
        # At most one per connection of the client on this node.
        self._watchers: Dict[int, OnSilent] = {}
        self._next = 0
        self._stream: Optional[Stream] = None
        self._task = self._loop.create_task(self._run())

    def watch(self, on_silent: OnSilent) -> Callable[[], None]:
        self._next += 1
        key = self._next
        self._watchers[key] = on_silent

        def unwatch() -> None:
            if self._watchers.pop(key, None) is not None and not self._watchers:
                self.stop()

        return unwatch

    def stop(self) -> None:
        """Stops probing and closes the probe's connection."""
        if self.stopped:
            return
        self.stopped = True
        if self.dial.probes.get(self.addr) is self:
            del self.dial.probes[self.addr]
        self._close()
        if self._task is not asyncio.current_task():
            self._task.cancel()
        # Otherwise the watcher that let go was told of a silence by this
        # very task, which sees `stopped` as soon as it has told them all.

    def _close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and stream.transport is not None:
            # No session on it: a reset only spares the kernel a
            # half-closed socket to a node that may never answer.
            reset(stream.transport)

    async def _run(self) -> None:
        retry = self.limit / 2
        try:
            while not self.stopped:
                silence = await self._until_silent()
                self._close()
                if self.stopped:
                    return
                if silence is not None:
                    waited, why, cannot_serve = silence
                    self.silences += 1
                    self.dial.suspect(self.addr, True)
                    log.info(
                        "dlock: %s %s (limit %.3g s): taken for gone, its connections that heard nothing within the limit resume elsewhere",
                        self.addr,
                        why,
                        self.limit,
                    )
                    for on_silent in list(self._watchers.values()):
                        try:
                            on_silent(waited, why, cannot_serve)
                        except Exception:  # one connection's bug must not blind the others
                            log.exception("dlock: a watcher of %s failed", self.addr)
                    retry = self.limit / 2
                else:
                    retry = min(retry * 2, MAX_RETRY)
                if self.stopped:
                    return
                await asyncio.sleep(retry)
        finally:
            self._close()

    async def _until_silent(self) -> Optional[Tuple[float, str, bool]]:
        """Pings the node, a third of the limit apart, until an answer is
        `limit` late or says `Unavailable`: returns how long it waited,
        what the probe found, and whether the node answered `Unavailable`.
        None when the node refuses or the connection breaks (not a
        silence)."""
        started = self._loop.time()
        try:
            await asyncio.wait_for(self._connect(), self.limit)
        except asyncio.TimeoutError:
            waited = self._loop.time() - started
            return waited, f"left the liveness probe unanswered for {waited:.3g} s", False
        except (OSError, ssl.SSLError, ValueError, DlockError) as e:
            log.debug("dlock: liveness probe of %s refused: %s", self.addr, e)
            return None
        # It answers (again): no longer tried last.
        self.answered += 1
        self.dial.suspect(self.addr, False)
        ping_id = 0
        while True:
            await asyncio.sleep(self.limit / 3)
            stream = self._stream
            if stream is None:
                return None
            ping_id += 1
            ping = pb.Request(version=PROTOCOL_VERSION, id=ping_id, access_token=self.dial.token, type=pb.Ping)
            sent = self._loop.time()
            try:
                resp = await asyncio.wait_for(stream.exchange(ping), self.limit)
            except asyncio.TimeoutError:
                waited = self._loop.time() - sent
                return waited, f"left the liveness probe unanswered for {waited:.3g} s", False
            except DlockError as e:
                log.debug("dlock: liveness probe of %s ended: %s", self.addr, e)
                return None
            if resp.status == Status.Unavailable:
                # It answers but cannot serve: it counts itself leader with
                # no majority behind it (cut off from its peers, or
                # stopping). As good as silent for the sessions on it, and
                # sooner. (A follower answers Ok: the connections learn from
                # its NotLeader where the leader is.)
                why = f"answered the liveness probe Unavailable ({resp.error_text or 'it cannot serve'})"
                return self._loop.time() - sent, why, True
            if resp.status == Status.Ok:
                self.answered += 1
            else:
                log.debug("dlock: liveness probe of %s refused: %s", self.addr, resp.error_text or resp.status)
                return None

    async def _connect(self) -> None:
        """Connects and says Hello; raises what refused it."""
        stream = await connect_stream(self.dial, self.addr)
        self._stream = stream
        hello = pb.Request(version=PROTOCOL_VERSION, id=HELLO_ID, access_token=self.dial.token, type=pb.Hello)
        resp = await stream.exchange(hello)
        # InvalidType: a server older than Hello, alive all the same.
        if resp.status not in (Status.Ok, Status.InvalidType):
            raise DlockError(f"Hello answered {resp.error_text or resp.status}")
