"""Work counted, not timed: the SQLite virtual-machine steps a call takes on a connection. A loop's
work must grow with what changed, not with what is kept (docs/development.md): tests compare the
steps on a small and on a large store or log."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def counted_steps(conn: sqlite3.Connection, call: Callable[[], T]) -> tuple[T, int]:
    """(what `call` returned, SQLite's steps on `conn` meanwhile, in tens)."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # go on

    conn.set_progress_handler(count, 10)
    try:
        return call(), steps[0]
    finally:
        conn.set_progress_handler(None, 10)
