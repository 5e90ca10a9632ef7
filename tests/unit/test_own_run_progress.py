"""A catch-up's batches of the pipeline's own (no Spark query) in the query's health, as Spark's
progress events would put them (aggregates/progress.py `OwnRunProgress`): running while it runs,
each batch's progress, stopped cleanly at its end or on a stop, and with its error if one ended it."""

from __future__ import annotations

import time

import pytest

from aggregates.batch_gate import Stopping
from aggregates.progress import OwnRunProgress, ProgressRecorder
from store.health import HealthStore, query_health


@pytest.fixture
def recorder(tmp_path):
    health = HealthStore(tmp_path / "store.db", synchronous="OFF")
    yield ProgressRecorder(health, "main", "sketchboard-main")
    health.close()


def health_now(recorder) -> dict:
    return query_health(recorder.health, "main", recorder._now_ms())


def test_an_own_run_is_running_while_it_runs_with_each_batchs_progress_and_stopped_after(recorder):
    with OwnRunProgress(recorder, "q-1") as progress:
        assert health_now(recorder) is None  # nothing until a batch runs
        with progress.batch(0, 1_000):
            assert health_now(recorder)["running"] is True
            time.sleep(0.02)  # rates need a batch that took some time
        with progress.batch(1, 500):
            time.sleep(0.02)
        during = health_now(recorder)
    after = health_now(recorder)
    assert during["running"] and during["run_id"].startswith("own-") and during["query_id"] == "q-1"
    assert during["batch_id"] == 1 and during["num_input_rows"] == 500 and during["batch_duration_ms"] >= 0
    assert during["processed_rows_per_second"] is not None and during["input_rows_per_second"] is not None
    assert after["running"] is False and after["last_error"] is None and recorder.settle(0)


@pytest.mark.parametrize("error, reason", [(Stopping("the pipeline is stopping"), None),
                                           (RuntimeError("the store is full"), "RuntimeError: the store is full")])
def test_an_own_run_ended_by_an_error_says_it_and_a_stop_is_a_clean_end(recorder, error, reason):
    with pytest.raises(type(error)), OwnRunProgress(recorder, "q-1") as progress:
        with progress.batch(0, 10):
            pass
        with progress.batch(1, 10):
            raise error
    health = health_now(recorder)
    assert health["running"] is False and health["last_error"] == reason and health["batch_id"] == 0


def test_without_a_recorder_nothing_is_recorded():
    with OwnRunProgress(None, "q-1") as progress, progress.batch(0, 10):
        pass


def test_a_serving_run_is_running_from_its_start_and_its_idle_beats_keep_it_from_going_stale(recorder):
    now = [1_000_000.0]
    recorder.clock = lambda: now[0]
    with OwnRunProgress(recorder, "q-1") as progress:
        progress.begin()  # a serving loop: running before any batch
        started = health_now(recorder)
        assert started["running"] and started["run_id"].startswith("own-") and started["batch_id"] is None
        now[0] += 25
        progress.idle()
        now[0] += 25  # 50 s since the start, 25 s since the beat: not stale (store/health.py STALE_AFTER_MS)
        beat = health_now(recorder)
        assert beat["running"] and not beat["stale"] and beat["last_idle_ms"] == 1_000_025_000
        assert beat["run_id"] == started["run_id"]
    assert health_now(recorder)["running"] is False
