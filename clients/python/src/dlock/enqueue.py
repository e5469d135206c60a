"""Two-phase acquire: `Client.enqueue` answers at once, granted or queued;
a queued request's `Queued.wait` collects the grant later.

A Lock that waits tells its caller nothing until it is granted (answers on a
connection come in request order). An Enqueue is answered as soon as the
request is in line, with its place, so the caller can act on knowing that
it waits; the request keeps its FIFO place until `wait` collects the
outcome. On a cluster the request is numbered like a Lock, and the
connection keeps `seq_done` below it until its Wait is answered, so a Wait
sent again to a new leader finds the outcome (connection.py).

An Enqueue follows the client's ownership rule (`dlock.aio`): on a key that
another lock of the client holds or asks for, it goes to a connection of its
own, and its `Queued`, its Wait and its `Lock` belong to that connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

if TYPE_CHECKING:
    from .aio import Client
    from .lock import Lock


class Queued:
    """A request waiting in line, from `Client.enqueue`."""

    def __init__(
        self,
        client: "Client",
        keys: Tuple[str, ...],
        ticket: int,
        place: int,
        lease: Optional[float],
        renew: bool,
        sent: float,
        *,
        claimed: bool = False,
    ) -> None:
        self._client = client
        #: The keys asked for.
        self.keys = keys
        #: The server's ticket for the request (what a Wait names).
        self.ticket = ticket
        #: Requests ahead of this one when it was queued: over its keys, the
        #: most requests waiting for one key that came before it (0: next,
        #: once the holders release).
        self.place = place
        self._lease = lease
        self._renew = renew
        # When the Enqueue was sent: the earliest the grant (and its lease)
        # can have come.
        self._sent = sent
        # Its keys are claimed on the client's shared connection until the
        # Wait is answered (see `dlock.aio.Client._claims`).
        self._claimed = claimed

    def __repr__(self) -> str:
        return f"<dlock.Queued {list(self.keys)} ticket={self.ticket} place={self.place}>"

    async def wait(self) -> "Lock":
        """Waits for the grant and returns the `Lock` (at once if it was
        granted before the call); the wait limit is the one given to
        `enqueue`, counted from the Enqueue.

        Raises `Timeout` with the busy keys when the wait limit passes,
        `ServerError` (`UnknownTicket`) for a ticket already collected or
        no longer known, `ConnectionLost`. Cancel-safe: a grant that arrives
        after the call was cancelled is released at once.
        """
        return await self._client._collect(self)
