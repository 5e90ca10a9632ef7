"""A SQLite file's write-ahead log copied back into the database by a thread of its own.

SQLite checkpoints a WAL database in the connection that commits, once the log holds 1 000 pages
(`wal_autocheckpoint`): the commit then copies the log's pages into the database file and syncs it
before it returns. A pipeline batch writes a few MB (its panes, tier rows, open sessions' buckets,
Bloom chunks), so nearly every commit paid one: ~35 ms of a demo batch's ~130 ms commit, measured
here (docs/benchmarks.md, session 72). The pipeline's store turns that off on its connection and
runs the checkpoints here instead, on another core while the next batch is read and computed
(Python's sqlite3 lets go of the GIL while SQLite works), at most one a `min_interval_s`: pages
that consecutive batches rewrite (the tier rows, the open sessions) are copied once, not per batch.

Nothing depends on when a checkpoint runs: a commit is durable in the log (as SQLite's
`synchronous` says), a reader sees it either way, and a file opened after a crash replays its log.
A PASSIVE checkpoint waits for no one: it copies what no reader still needs and leaves the rest to
the next one. A checkpoint that fails (a full disk) is logged and tried again after the next commit.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from store.connection import open_connection

log = logging.getLogger("sketchboard.store")

MIN_INTERVAL_S = 1.0
LOG_BYTES = 1_000 * 4_096  # SQLite's own threshold (wal_autocheckpoint's 1 000 pages of 4 KiB)


class BackgroundCheckpoints:
    """Checkpoints `path` after commits (`committed()`), from a thread with its own connection."""

    def __init__(self, path: Path, *, min_interval_s: float = MIN_INTERVAL_S, busy_timeout_s: float = 30.0):
        self.min_interval_s = min_interval_s
        self.checkpoints = 0  # run so far (tests, status)
        self._conn = open_connection(path, synchronous=None, busy_timeout_s=busy_timeout_s, existing=True)
        self._log = f"{path}-wal"
        self._changed = threading.Condition()
        self._commits = 0  # commits so far, and how many of them a checkpoint has run after
        self._covered = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-checkpoints", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A transaction committed: a checkpoint is due (now, or once the interval since the last has passed)."""
        with self._changed:
            self._commits += 1
            self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until a checkpoint has run after every commit so far (True), or `timeout_s` passed."""
        with self._changed:
            target = self._commits
            return self._changed.wait_for(lambda: self._covered >= target, timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                # Woken by a batch's commit; else once an interval, for what other writes on the
                # connection left in the log (a tier rebuild's transactions): as SQLite would, past ~1 000 pages.
                self._changed.wait_for(lambda: self._commits > self._covered or self._closing.is_set(),
                                       self.min_interval_s)
                if self._closing.is_set():
                    return
                covering = self._commits
                due = covering > self._covered
            if not due and self._log_bytes() < LOG_BYTES:
                continue
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.checkpoints += 1
            except sqlite3.Error as exc:  # a full disk, an I/O error: the next commit's try may do better
                log.warning("checkpointing the store's write-ahead log failed (%s): tried again after the next batch", exc)
            with self._changed:
                self._covered = covering
                self._changed.notify_all()
            if self._closing.wait(self.min_interval_s):
                return

    def _log_bytes(self) -> int:
        try:
            return os.path.getsize(self._log)
        except OSError:
            return 0

    def close(self) -> None:
        """Stop the thread (a checkpoint under way finishes first); the last connection to the file
        to close checkpoints what is left, as SQLite does."""
        self._closing.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join()
        self._conn.close()
