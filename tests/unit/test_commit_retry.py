"""Retrying a failed store commit (aggregates/commit_retry.py), pure: the commit, the wait and
the report are injected. And the store-error row the pipeline reports into (store/health.py),
on every store backend, which must still take an update when a SQLite store is full."""

from __future__ import annotations

import sqlite3

import pytest

from aggregates.commit_retry import Backoff, commit_with_retry
from store.health import HealthStore
from store.switch import SwitchHeld


class FlakyCommit:
    def __init__(self, failures: int, error: BaseException = sqlite3.OperationalError("database or disk is full")):
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "committed"


def test_a_transient_failure_is_retried_with_backoff_and_reported():
    commit, waits, reports = FlakyCommit(3), [], []
    result = commit_with_retry(commit, wait=lambda s: waits.append(s) or False,
                               report=lambda error, attempt: reports.append((error is None, attempt)))
    assert result == "committed" and commit.calls == 4
    assert waits == [0.5, 1.0, 2.0]
    assert reports == [(False, 0), (False, 1), (False, 2), (True, 3)]  # three failures, then recovered


def test_a_commit_held_by_a_synchronized_switch_waits_like_a_busy_store():
    """store/switch.py SwitchHeld: the serving pipeline's batch waits for the switch to be done
    (then its retry is refused as DefinitionSwitched and the pipeline restarts), it does not fail."""
    commit, waits = FlakyCommit(2, SwitchHeld("pipeline 'main' is held")), []
    assert commit_with_retry(commit, wait=lambda s: waits.append(s) or False, report=lambda e, a: None) == "committed"
    assert waits == [0.5, 1.0]


def test_a_held_commit_waits_through_wait_held_other_failures_through_wait():
    """`wait_held` (aggregates/store_commit.py: returns once the switch released the hold) waits out
    a SwitchHeld only; a storage error still waits its back-off."""
    held, busy = SwitchHeld("pipeline 'main' is held"), sqlite3.OperationalError("database is locked")
    commit, waits = FlakyCommit(1, busy), []
    errors = iter([held, busy])

    def flaky():
        error = next(errors, None)
        if error is not None:
            raise error
        return commit()

    assert commit_with_retry(flaky, wait=lambda s: waits.append(("wait", s)) or False, report=lambda e, a: None,
                             wait_held=lambda s: waits.append(("held", s)) or False) == "committed"
    assert waits == [("held", 0.5), ("wait", 1.0), ("wait", 2.0)]


def test_the_backoff_is_capped():
    assert [Backoff().delay(a) for a in (0, 1, 5, 6, 1000)] == [0.5, 1.0, 16.0, 30.0, 30.0]


def test_a_stop_during_the_wait_raises_the_error_so_the_batch_is_not_recorded():
    commit = FlakyCommit(10)
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        commit_with_retry(commit, wait=lambda s: True, report=lambda e, a: None)
    assert commit.calls == 1


def test_a_success_at_once_reports_nothing_and_other_errors_are_not_retried():
    reports = []
    assert commit_with_retry(FlakyCommit(0), wait=lambda s: False, report=lambda e, a: reports.append(a)) == "committed"
    assert reports == []
    bug = FlakyCommit(1, KeyError("a bug, not the storage"))
    with pytest.raises(KeyError):
        commit_with_retry(bug, wait=lambda s: False, report=lambda e, a: reports.append(a))
    assert bug.calls == 1 and reports == []


def test_the_store_error_row_reports_a_run_of_failures_and_the_recovery(store_backend):
    health = HealthStore(store_backend.side_db())
    assert health.store_errors("main") is None
    health.reserve_store_errors("main")
    assert health.store_errors("main") == {"failing": False, "message": None, "since_ms": None, "last_ms": None,
                                           "retries": 0, "total": 0}
    health.store_failing("main", "OperationalError: database or disk is full", 1000)
    health.store_failing("main", "OperationalError: database or disk is full", 1500)
    state = health.store_errors("main")
    assert (state["failing"], state["since_ms"], state["last_ms"], state["retries"], state["total"]) == (
        True, 1000, 1500, 2, 2)
    health.store_recovered("main", 2000)
    state = health.store_errors("main")
    assert (state["failing"], state["retries"], state["total"], state["last_ms"]) == (False, 0, 2, 2000)
    assert state["message"] == "OperationalError: database or disk is full"  # the last error stays readable
    health.reserve_store_errors("main")  # a restart keeps the counts
    assert health.store_errors("main")["total"] == 2
    health.close()


def test_the_reserved_row_takes_the_error_when_the_sqlite_file_is_full(tmp_path):
    health = HealthStore(tmp_path / "store.db")
    health.reserve_store_errors("main")
    conn = health._conn.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        conn.execute("CREATE TABLE filler (x)")  # the file is full indeed
    health.store_failing("main", "OperationalError: database or disk is full " + "x" * 1000, 1000)
    assert health.store_errors("main")["failing"] is True
    health.close()


def test_other_transient_errors_can_be_named_a_broker_away_for_instance():
    from ingest.log import LogUnavailable

    unavailable = LogUnavailable("could not read the metadata of Kafka topic 'x'")
    with pytest.raises(LogUnavailable):  # not a storage error: not retried by default
        commit_with_retry(FlakyCommit(1, unavailable), wait=lambda s: False, report=lambda e, a: None)
    read = FlakyCommit(2, unavailable)
    assert commit_with_retry(read, wait=lambda s: False, report=lambda e, a: None,
                             transient=(LogUnavailable,)) == "committed" and read.calls == 3
