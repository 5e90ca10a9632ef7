"""Two writers of one side store (store/connection.py Db) at once, as two processes (pipelines,
API replicas) can be: the first is held between a write and its commit (a GC pause, a slow
link) until the second has finished, or for `hold_s` when the second waits for it, as it must:
the side stores check, then write, in one transaction that has to keep every other writer
of the store out until it commits (SQLite's BEGIN IMMEDIATE; PostgresDb.transaction's lock)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def race(first_db, write: str, first: Callable[[], object], second: Callable[[], object], *,
         hold_s: float = 0.5) -> tuple[object, object]:
    """Run `first` (a call on a store over `first_db`) in a thread; once it has executed a
    statement starting with `write`, run `second` (a call on a store over another Db of the same
    storage). Each outcome: what the call returned, or the exception it raised."""
    wrote, second_done = threading.Event(), threading.Event()
    execute = first_db.execute

    def held(sql, args=()):
        result = execute(sql, args)
        if sql.lstrip().startswith(write) and not wrote.is_set():
            wrote.set()
            second_done.wait(hold_s)  # not set in time: the second waits for this transaction
        return result

    first_db.execute = held
    outcomes: dict[str, object] = {}

    def run(name: str, call: Callable[[], object]) -> None:
        try:
            outcomes[name] = call()
        except Exception as error:  # the outcome the test asserts
            outcomes[name] = error

    thread = threading.Thread(target=run, args=("first", first))
    thread.start()
    try:
        assert wrote.wait(30), f"the first writer never ran {write!r}"
        run("second", second)
    finally:
        second_done.set()
        thread.join(30)
        del first_db.execute  # the class's again
    return outcomes["first"], outcomes["second"]
