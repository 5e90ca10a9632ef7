"""A SQLite file's write-ahead log copied back into the database by a thread of its own.

SQLite checkpoints a WAL database in the connection that commits, once the log holds 1 000 pages
(`wal_autocheckpoint`): the commit then copies the log's pages into the database file and syncs it
before it returns. A pipeline batch writes a few MB (its panes, tier rows, open sessions' buckets,
Bloom chunks), so nearly every commit paid one: ~35 ms of a demo batch's ~130 ms commit, measured
here (docs/benchmarks.md, session 72). The pipeline's store raises that threshold on its connection
to the log's size limit (a safety net: SAFETY_NET_PAGES) and runs the checkpoints here instead:

- right after each batch's commit (`committed()`), on another core while the next batch is read
  and computed (Python's sqlite3 lets go of the GIL while SQLite works). Right after, not later:
  SQLite starts the log over from its beginning only when a write transaction begins after all of
  it has been copied, so a checkpoint that falls inside the next batch's transaction lets the log
  grow on batch after batch (the review's probe: 0.5 -> 18 MB over 35 batches with a 1 s beat);
- once a `beat_s`, when anything was written to the file since the last complete checkpoint
  (`PRAGMA data_version`: other writes on the connection, a tier rebuild's, the side stores'), and
  again after one that could not copy everything (a reader in the way). A write transaction that
  starts the copied log over moves data_version before it commits: that beat copies nothing and
  the commit is copied on the next one.

Nothing depends on when a checkpoint runs: a commit is durable in the log (as SQLite's
`synchronous` says), a reader sees it either way, and a file opened after a crash replays its log.
A PASSIVE checkpoint waits for no one: it copies what no reader still needs and leaves the rest to
the next one. One that fails (a full disk) is logged and tried again on the next beat.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from store.connection import WAL_LIMIT_BYTES, open_connection

log = logging.getLogger("sketchboard.store")

BEAT_S = 1.0
# The writer's own checkpoints, kept as a safety net at the log's size limit (journal_size_limit):
# only a log the thread cannot keep up with (it died, or the disk is full) reaches it.
SAFETY_NET_PAGES = WAL_LIMIT_BYTES // 4_096


class BackgroundCheckpoints:
    """Checkpoints `path` after commits (`committed()`) and on a beat, from a thread with its own connection."""

    def __init__(self, path: Path, *, beat_s: float = BEAT_S, busy_timeout_s: float = 30.0):
        self.beat_s = beat_s
        self.checkpoints = 0  # run so far (tests, status)
        self._conn = open_connection(path, synchronous=None, busy_timeout_s=busy_timeout_s, existing=True)
        self._changed = threading.Condition()
        self._commits = 0  # commits told so far, and how many of them a checkpoint has run after
        self._covered = 0
        self._closing = False
        self._copied_version: int | None = None  # the file's data_version when a checkpoint last copied all
        self._thread = threading.Thread(target=self._run, name="store-checkpoints", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A batch's transaction committed: checkpoint now."""
        with self._changed:
            self._commits += 1
            self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until a checkpoint has run after every commit told so far (True), or `timeout_s` passed."""
        with self._changed:
            target = self._commits
            return self._changed.wait_for(lambda: self._covered >= target, timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._commits > self._covered or self._closing, self.beat_s)
                if self._closing:
                    return
                covering = self._commits
            try:
                # The file's data_version moves with every write another connection commits.
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                if covering > self._covered or version != self._copied_version:
                    self._checkpoint(version)
            except Exception as exc:  # a full disk, an I/O error: tried again on the next beat
                self._copied_version = None
                log.warning("checkpointing the store's write-ahead log failed (%s): tried again in %.0f s", exc,
                            self.beat_s)
            with self._changed:
                self._covered = covering
                self._changed.notify_all()

    def _checkpoint(self, version: int) -> None:
        busy, in_log, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        # All copied: nothing to do until the next write. Else (a reader in the way) again next beat.
        self._copied_version = version if not busy and in_log == copied else None
        self.checkpoints += 1

    def close(self) -> None:
        """Stop the thread (a checkpoint under way finishes first); the last connection to the file
        to close checkpoints what is left, as SQLite does. Closing twice is closing once."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
