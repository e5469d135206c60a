"""The protected resource: one SQLite row that accepts a write only with a fence
at least as high as the last one it accepted.

The check and the write are one UPDATE, so no writer can slip in between.
With fencing off, the same UPDATE without the fence condition: the store
then trusts whoever believes they hold the lock.
"""

from __future__ import annotations

import sqlite3
from typing import List, Tuple


def create(path: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE register (id INTEGER PRIMARY KEY, history TEXT NOT NULL, fence INTEGER NOT NULL)")
        db.execute("INSERT INTO register VALUES (1, '', 0)")


def read(path: str) -> Tuple[List[str], int]:
    """The names of the workers that wrote, in order, and the last fence accepted."""
    with sqlite3.connect(path) as db:
        history, fence = db.execute("SELECT history, fence FROM register WHERE id = 1").fetchone()
    return [name for name in history.split(",") if name], fence


def write(path: str, history: List[str], fence: int, fencing: bool = True) -> bool:
    """Stores `history` if `fence` is not older than the last accepted one; True if it did."""
    # Fences are unsigned 64-bit; the server's start from the clock in
    # nanoseconds (about 1.8e18), within SQLite's signed 64-bit INTEGER
    # until the year 2262. A store with a wider range would compare as text.
    with sqlite3.connect(path) as db:
        if fencing:
            cur = db.execute(
                "UPDATE register SET history = ?, fence = ? WHERE id = 1 AND fence <= ?",
                (",".join(history), fence, fence),
            )
        else:
            cur = db.execute("UPDATE register SET history = ?, fence = ? WHERE id = 1", (",".join(history), fence))
        return cur.rowcount == 1
