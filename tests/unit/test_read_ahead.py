"""The embedded log's next batch read in a worker process (aggregates/read_ahead.py): the rows it
hands over are the ones the pipeline would read itself; a range not asked for, asked with
another catalog, or not read by the worker as soon as the pipeline reads it itself, is left to
the pipeline; no file outlives its take, its reader, or a pipeline process killed with SIGKILL,
and neither does the worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future, wait
from pathlib import Path

import pytest

from aggregates import read_ahead
from aggregates.read_ahead import ReadAhead
from catalog import load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.spark_source import read_batch
from sketchboard.settings import DEFAULT_STREAMS
from tests.spark.events import http_events

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(DEFAULT_STREAMS)


@pytest.fixture
def log(tmp_path, catalog):
    log = SqliteEventLog(tmp_path / "log.db")
    stream = catalog.stream("http_requests")
    log.ensure_topic(stream)
    events = http_events(3_000, seed=1)
    for i in range(0, len(events), 500):  # several segments a partition
        log.append(stream, [EventValidator(stream).validate(e) for e in events[i:i + 500]], int(time.time() * 1000))
    yield log
    log.close()


def files(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(read_ahead._PREFIX))


def test_the_rows_read_ahead_are_the_ones_read_here_and_only_a_range_asked_for_is_handed_over(log, catalog, tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setattr(read_ahead, "_folder", lambda: str(tmp_path))
    ends = {"http_requests": {p: o.end for p, o in log.offsets("http_requests").items()}}
    half = {"http_requests": {p: o // 2 for p, o in ends["http_requests"].items()}}
    zero = {"http_requests": {p: 0 for p in ends["http_requests"]}}
    ahead = ReadAhead(tmp_path / "log.db")
    try:
        ahead.ask(catalog, zero, half)
        ahead.ask(catalog, half, ends)
        assert ahead.started.wait(60)  # a started worker's reads are waited for,
        ahead.read_here(1, 60.0)  # as long as the pipeline would take to read them itself
        assert ahead.take(catalog, zero, ends) is None  # never asked for
        first = ahead.take(catalog, zero, half)
        assert first is not None and first.equals(read_batch(log, catalog, zero, half))
        assert first.num_rows == sum(half["http_requests"].values()) > 0
        # Read from several segments, handed over whole: the copy into one chunk is the worker's.
        assert {first.column(c).num_chunks for c in first.column_names} == {1}
        # Asked with another catalog (a pattern defined since): the pipeline reads it with its own.
        assert ahead.take(catalog.model_copy(), half, ends) is None
        assert files(tmp_path) == [] and ahead.taken == 1
        ahead.ask(catalog, half, ends)
    finally:
        ahead.close()
    assert files(tmp_path) == []  # an asked range never taken: removed with its reader


def test_a_batch_waits_for_the_worker_no_longer_than_reading_itself_would_take(log, catalog, tmp_path, monkeypatch):
    """Taken at once after the first ask, the worker is still starting (a spawned Python importing
    Arrow: hundreds of milliseconds at best): the pipeline reads that range itself, and the
    worker's copy is thrown away. So is a range asked while the worker is still busy with a read
    given up, and one begun that is not done within the time the pipeline's own last read took
    for as many records. Otherwise the worker's read is waited for and handed over."""
    monkeypatch.setattr(read_ahead, "_folder", lambda: str(tmp_path))
    ends = {"http_requests": {p: o.end for p, o in log.offsets("http_requests").items()}}
    half = {"http_requests": {p: o // 2 for p, o in ends["http_requests"].items()}}
    zero = {"http_requests": {p: 0 for p in ends["http_requests"]}}
    ahead = ReadAhead(tmp_path / "log.db")

    def worker_through() -> None:  # with every read given up
        wait(ahead.given_up, timeout=60)

    try:
        ahead.ask(catalog, zero, half)
        assert ahead.take(catalog, zero, half) is None and not ahead.started.is_set()  # starting
        assert ahead.given_up_count == 1 and ahead.taken == 0 and not ahead.failed and ahead.pending == {}
        assert ahead.started.wait(60)
        busy = Future()  # a read given up that the worker would still be making
        ahead.given_up.append(busy)
        ahead.ask(catalog, half, ends)
        assert ahead.take(catalog, half, ends) is None and ahead.given_up_count == 2  # busy
        busy.set_result(None)
        worker_through()
        ahead.read_here(1_000_000, 0.001)  # the pipeline reads a nanosecond a record: no worker keeps up
        ahead.ask(catalog, half, ends)
        assert ahead.take(catalog, half, ends) is None and ahead.given_up_count == 3  # begun, not done in time
        worker_through()
        ahead.read_here(100, 60.0)  # as slow as a reader can be
        ahead.ask(catalog, half, ends)
        second = ahead.take(catalog, half, ends)
        assert second is not None and second.equals(read_batch(log, catalog, half, ends))
        assert ahead.taken == 1 and ahead.given_up_count == 3
        assert files(tmp_path) == []  # the given-up ranges' files too, removed when their reads ended
    finally:
        ahead.close()
    assert files(tmp_path) == []


def test_a_worker_is_started_for_a_backlog_of_more_than_the_asked_range_and_as_many_again(log, catalog, tmp_path,
                                                                                          monkeypatch):
    """Starting a worker costs more than the one read it could make for a short backlog; once
    started, it reads every range asked, however short the backlog."""
    monkeypatch.setattr(read_ahead, "_folder", lambda: str(tmp_path))
    ends = {"http_requests": {p: o.end for p, o in log.offsets("http_requests").items()}}
    half = {"http_requests": {p: o // 2 for p, o in ends["http_requests"].items()}}
    zero = {"http_requests": {p: 0 for p in ends["http_requests"]}}
    records = sum(half["http_requests"].values())
    ahead = ReadAhead(tmp_path / "log.db")
    try:
        ahead.ask(catalog, zero, half, left=2 * records - 1)
        assert ahead.pool is None and ahead.pending == {} and ahead.take(catalog, zero, half) is None
        ahead.ask(catalog, zero, half, left=2 * records)
        assert ahead.pool is not None and len(ahead.pending) == 1
        ahead.ask(catalog, half, ends, left=1)  # started: a rest too
        assert len(ahead.pending) == 2 and not ahead.failed
    finally:
        ahead.close()
    assert files(tmp_path) == []


def test_files_of_a_killed_pipeline_process_are_removed_and_its_worker_dies_with_it(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from aggregates import read_ahead
        read_ahead._folder = lambda: {str(tmp_path)!r}
        from aggregates.read_ahead import ReadAhead
        from catalog import load_catalog
        from sketchboard.settings import DEFAULT_STREAMS
        catalog = load_catalog(DEFAULT_STREAMS)
        ahead = ReadAhead({str(tmp_path / "log.db")!r})
        ahead.ask(catalog, {{}}, {{}})
        ahead.pending[next(iter(ahead.pending))][1].result(timeout=60)  # read and written, not taken
        print(next(iter(ahead.pool._processes)), flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert len(files(tmp_path)) == 1
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while read_ahead._alive(worker) and time.monotonic() < deadline:
        try:  # reap it if it is ours to reap (it is the killed process's child: usually not)
            os.waitpid(worker, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    assert not _running(worker), "the read-ahead worker outlived its pipeline process"
    read_ahead._remove_orphans(str(tmp_path))  # what the next pipeline's first read-ahead does
    assert files(tmp_path) == []
    mine = tmp_path / f"{read_ahead._PREFIX}{os.getpid()}-x.arrow"
    mine.write_bytes(b"")
    read_ahead._remove_orphans(str(tmp_path))
    assert mine.exists()  # a live process's file stays


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited process not reaped yet by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
