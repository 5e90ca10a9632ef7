"""A pipeline's SQLite store leaves its write-ahead log's checkpoints to a thread of their own
(store/wal_checkpoints.py): its batches' commits run none, and what they wrote still reaches the
database file, as does a large write outside a batch; closing stops the thread with nothing lost."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from store import SqlitePaneStore
from store.connection import open_connection
from store.wal_checkpoints import LOG_BYTES, BackgroundCheckpoints
from tests.unit.test_tiers import LAYOUT, T0, commit_all

EVENTS = [[(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, i * 0.5, f"u{i % 9}")
           for i in range(b * 40, b * 40 + 40)] for b in range(6)]


def in_file_alone(path: Path, tmp: Path, sql: str):
    """`sql`'s answer from a copy of the database file without its write-ahead log: what checkpoints
    copied into the file."""
    copy = tmp / f"copy-{time.monotonic_ns()}.db"
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        return conn.execute(sql).fetchone()[0]


def test_batches_commit_without_checkpoints_and_reach_the_file_through_the_thread(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db")
    try:
        store.configure_tiers({"s": LAYOUT}, now_ms=T0)
        store.checkpoint_apart()
        store.checkpoint_apart()  # once: one thread
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # none in a commit
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
    checkpoints = BackgroundCheckpoints(path, min_interval_s=0.05)
    yield path, writer, checkpoints
    checkpoints.close()
    writer.close()


def test_a_large_write_outside_a_batch_is_checkpointed_on_the_threads_own_beat(beside, tmp_path):
    path, writer, checkpoints = beside
    writer.execute("BEGIN")  # one transaction of twice SQLite's threshold (a tier rebuild's chunk)
    writer.executemany("INSERT INTO scratch VALUES (?)", [(b"x" * 4_000,) for _ in range(2 * LOG_BYTES // 4_000)])
    writer.execute("COMMIT")
    deadline = time.monotonic() + 30
    while checkpoints.checkpoints == 0 and time.monotonic() < deadline:  # no commit told it: its beat
        time.sleep(0.05)
    assert in_file_alone(path, tmp_path, "SELECT COUNT(*) FROM scratch") == 2 * LOG_BYTES // 4_000


def test_small_writes_outside_a_batch_are_left_to_the_next_batch(beside, tmp_path):
    path, writer, checkpoints = beside
    writer.execute("INSERT INTO scratch VALUES (1)")
    time.sleep(0.3)  # several beats: fewer pages than SQLite would checkpoint at
    assert checkpoints.checkpoints == 0
    checkpoints.committed()
    assert checkpoints.wait_idle(30) and checkpoints.checkpoints == 1
    assert in_file_alone(path, tmp_path, "SELECT COUNT(*) FROM scratch") == 1


def test_the_pipelines_store_checkpoints_apart(tmp_path):
    pipeline = build_pipeline(Settings(data_dir=tmp_path, log_backend="embedded", store_backend="sqlite"))
    try:
        assert pipeline.store.checkpoints_apart is not None
        assert pipeline.store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    finally:
        pipeline.store.close()
        pipeline.log.close()
