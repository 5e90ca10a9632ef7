"""A pipeline's SQLite store leaves its write-ahead log's checkpoints to a thread of their own
(store/wal_checkpoints.py): its batches' commits run none, and what they wrote still reaches the
database file, as does a write outside a batch; with batches back to back the log still starts
over instead of growing; closing (or dropping the store unclosed) stops the thread."""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from store import SqlitePaneStore
from store.connection import open_connection
from store.wal_checkpoints import SAFETY_NET_PAGES, BackgroundCheckpoints
from tests.unit.test_tiers import LAYOUT, T0, commit_all

EVENTS = [[(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, i * 0.5, f"u{i % 9}")
           for i in range(b * 40, b * 40 + 40)] for b in range(6)]


def in_file_alone(path: Path, tmp: Path, sql: str):
    """`sql`'s answer from a copy of the database file without its write-ahead log: what checkpoints
    copied into the file; None when the copy caught a checkpoint writing the file (a torn copy is
    "malformed" to SQLite: polled, it is asked again)."""
    copy = tmp / f"copy-{time.monotonic_ns()}.db"
    shutil.copyfile(path, copy)
    try:
        with sqlite3.connect(copy) as conn:
            return conn.execute(sql).fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    finally:
        copy.unlink()


def test_batches_commit_without_checkpoints_and_reach_the_file_through_the_thread(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db")
    try:
        store.configure_tiers({"s": LAYOUT}, now_ms=T0)
        store.checkpoint_apart()
        store.checkpoint_apart()  # once: one thread
        # None in a commit, but for a log at its size limit (the thread cannot keep up): a safety net.
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == SAFETY_NET_PAGES
        commit_all(store, EVENTS)
        assert store.checkpoints_apart.wait_idle(30)
        assert store.checkpoints_apart.checkpoints >= 1
        assert in_file_alone(store.path, tmp_path, "SELECT COUNT(*) FROM batches") == len(EVENTS)
        checkpoints = store.checkpoints_apart
    finally:
        store.close()
    assert not checkpoints._thread.is_alive() and store.checkpoints_apart is None
    reopened = SqlitePaneStore(tmp_path / "store.db")
    try:
        assert reopened.last_batch_id("main") == len(EVENTS) - 1
    finally:
        reopened.close()


@pytest.fixture
def beside(tmp_path):
    """A writer with SQLite's own checkpoints off, a `scratch (value)` table, and a checkpoint
    thread on a 50 ms beat."""
    path = tmp_path / "db.sqlite"
    writer = open_connection(path)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE scratch (value)")
    checkpoints = BackgroundCheckpoints(path, beat_s=0.05)
    yield path, writer, checkpoints
    checkpoints.close()
    writer.close()


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_write_outside_a_batch_is_checkpointed_on_the_beat_and_an_idle_file_is_left_alone(beside, tmp_path):
    path, writer, checkpoints = beside
    assert wait_for(lambda: checkpoints.checkpoints >= 1)  # the first beat: nothing copied yet
    before = checkpoints.checkpoints
    writer.execute("PRAGMA cache_size = 100")  # pages spill into the log before the commit
    writer.execute("BEGIN")  # no batch told it: another write on the file (a tier rebuild's chunk)
    writer.executemany("INSERT INTO scratch VALUES (?)", [(b"x" * 4_000,) for _ in range(500)])
    # Its first spilled pages restarted the fully copied log, which moves data_version before the commit:
    # a beat inside the transaction checkpoints nothing (what CI once met as a race). The commit
    # still reaches the file, on a later beat.
    assert wait_for(lambda: checkpoints.checkpoints > before)
    assert in_file_alone(path, tmp_path, "SELECT COUNT(*) FROM scratch") == 0
    writer.execute("COMMIT")
    assert wait_for(lambda: in_file_alone(path, tmp_path, "SELECT COUNT(*) FROM scratch") == 500)
    time.sleep(0.3)  # the checkpoint that copied the rows counts itself right after its copy
    done = checkpoints.checkpoints
    time.sleep(1.0)
    assert checkpoints.checkpoints == done  # twenty beats, nothing written: no checkpoint


def test_the_log_starts_over_with_batches_back_to_back(beside):
    """The log restarts from its beginning only when a write begins after all of it was copied: so
    each batch's commit is checkpointed right away, not on a beat that may fall inside the next
    batch's transaction (then the log grows by a batch a commit)."""
    path, writer, checkpoints = beside
    checkpoints.beat_s = 10.0  # the beat out of the way: commits alone
    blob = b"x" * 4_000
    sizes = []
    for _ in range(12):
        writer.execute("BEGIN IMMEDIATE")
        writer.executemany("INSERT INTO scratch VALUES (?)", [(blob,) for _ in range(125)])  # ~0.5 MB
        writer.execute("COMMIT")
        checkpoints.committed()
        assert checkpoints.wait_idle(5)  # the next batch's read and compute outlast the checkpoint
        sizes.append(os.path.getsize(f"{path}-wal"))
    assert max(sizes) < 2 * 125 * 4_200, sizes  # one batch's frames, never two


def test_a_store_dropped_unclosed_stops_its_thread(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db")
    store.checkpoint_apart()
    thread = store.checkpoints_apart._thread
    del store
    gc.collect()
    assert wait_for(lambda: not thread.is_alive(), 10)


def test_the_pipelines_store_checkpoints_apart(tmp_path):
    pipeline = build_pipeline(Settings(data_dir=tmp_path, log_backend="embedded", store_backend="sqlite"))
    try:
        assert pipeline.store.checkpoints_apart is not None
        assert pipeline.store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == SAFETY_NET_PAGES
    finally:
        pipeline.store.close()
        pipeline.log.close()
