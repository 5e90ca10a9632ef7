"""Event time with real Spark and real files: out-of-order events and stragglers go in; after
the pipeline drains, panes are exact over every record that was not dead-lettered, sketches are
within their bounds, corrections exist for exactly the panes that got events after they became
final, dead letters are exactly the records that had to go there, and read = aggregated +
dead-lettered. Then the same after SIGKILL of a pipeline process in the middle of a batch and a
restart (the `sketchboard pipeline --once` code, run in this process on the session's Spark, so
the test pays for one pipeline JVM start-up, not two). Each
runs on both logs (the `log_backend` fixture): the embedded one, and a real Kafka broker's topics
read by Spark's Kafka source, where the records that bypassed the API are malformed JSON
produced straight to the topic (`invalid` dead letters instead of `unparseable`)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from store import SqlitePaneStore, dims_key
from tests.log_backends import TestLog
from tests.spark.events import rank_interval
from tests.spark.stragglers import STREAM, Oracle, oracle, write_straggler_log
from tests.tier_checks import assert_tiers_match_panes

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
HLL_BOUND = 3 * 0.0162
KLL_BOUND = 0.0133
BATCH = 2_500  # records per micro-batch: ~7 batches, so stragglers land in later batches
TASK = 20_000


def correction_set(store: SqlitePaneStore) -> dict[tuple, tuple]:
    """The stream's corrections by (batch, pane, dims): everything but ids and wall-clock times
    (the logins beside it have theirs)."""
    out = {}
    for c in store.corrections(stream=STREAM, limit=10**6):
        key = (c.batch_id, c.pane_start_ms, dims_key(c.dims))
        assert key not in out, f"correction recorded twice: {key}"
        out[key] = (c.revision_from, c.revision_to, c.events_added, c.old, c.new)
    return out


def check_everything(test_log: TestLog, catalog, expected: Oracle, now_ms: int) -> dict:
    root = test_log.root
    store = SqlitePaneStore(root / "store.db")
    try:
        # exact panes over all non-dead-lettered records
        stored = {}
        for p in store.read_panes(STREAM, 0, 2**62):
            v = p.data.values["latency_ms"]
            stored[(p.key.start_ms, p.key.dims)] = (p.data.count, v.sum, v.min, v.max)
        assert stored.keys() == expected.panes.keys()
        for key, (count, total, lo, hi) in expected.panes.items():
            got = stored[key]
            assert (got[0], got[2], got[3]) == (count, lo, hi), key
            assert got[1] == pytest.approx(total, rel=1e-9), key

        # corrections: exactly the (batch, pane) merges into panes final before their batch
        corrections = correction_set(store)
        assert {k: v[2] for k, v in corrections.items()} == expected.corrections
        assert len(expected.corrections) >= 20, "the data must produce corrections"
        revisions = {(p.key.start_ms, p.key.dims): p.revision for p in store.read_panes(STREAM, 0, 2**62)}
        chains: dict[tuple, list] = {}
        for (batch, start, dims), (r_from, r_to, added, old, new) in sorted(corrections.items()):
            assert r_to == r_from + 1 and new["count"] - old["count"] == added
            chains.setdefault((start, dims), []).append((r_from, r_to, old["count"], new["count"]))
        for key, chain in chains.items():
            assert [c[1] for c in chain] == list(range(chain[0][1], chain[0][1] + len(chain)))
            assert all(a[3] == b[2] for a, b in zip(chain, chain[1:], strict=False))  # old = previous new
            assert chain[-1][3] == expected.panes[key][0] and revisions[key] == chain[-1][1]
        assert {k for k, r in revisions.items() if r > 1} == set(chains)

        # the roll-up tiers: every row is the merge of the panes it covers, none missing, none extra
        assert assert_tiers_match_panes(store, STREAM) > len(expected.panes) // 10

        # dead letters: exactly the records that had to go there, with reasons
        letters = store.dead_letters(limit=10**6)
        assert {(d.letter.partition, d.letter.offset): d.letter.reason for d in letters} == expected.dead
        reasons = {r: sum(1 for x in expected.dead.values() if x == r) for r in set(expected.dead.values())}
        assert reasons == {test_log.bad_reason: 4, "beyond_retention": 25, "future_skew": 25}
        assert all(d.letter.error for d in letters if d.letter.reason == test_log.bad_reason)

        # the invariant, the counters and the watermark
        s = store.progress("main").streams[STREAM]
        assert s.events_read == expected.read == s.events_aggregated + s.events_dead_lettered
        assert s.events_dead_lettered == len(expected.dead) and s.dead_lettered_by_reason == reasons
        assert s.watermark_ms == expected.max_event_ms - catalog.stream(STREAM).allowed_lateness

        # through the API: sketches within bounds, points final and revised, the lists
        log = test_log.open(catalog)
        ctx = ApiContext(catalog=catalog, log=log, store=store, clock=lambda: now_ms / 1000)
        client = TestClient(create_app(ctx))
        status = client.get("/api/v1/pipeline").json()["streams"][STREAM]
        assert status["events_read"] == status["events_aggregated"] + status["events_dead_lettered"]
        assert status["events_read"] == status["events_in_log"] and status["lag_events"] == 0
        lo_ms, hi_ms = min(k[0] for k in expected.panes), max(k[0] for k in expected.panes) + 10_000
        # one point whose window covers every pane: from/to one step, window the whole span
        span = {"from": str(lo_ms), "to": str(lo_ms + 10_000), "step": "10s", "window": f"{(hi_ms - lo_ms) // 1000}s"}
        answer = client.get("/api/v1/query", params={"metric": "requests", "stat": "distinct", "group_by": "endpoint",
                                                     **span}).json()
        for series in answer["series"]:
            exact = len(expected.users_by_endpoint[series["group"]["endpoint"]])
            assert abs(series["points"][0]["value"] - exact) / exact <= HLL_BOUND
        latencies = np.sort(np.array(expected.good_latencies))
        for q in (0.5, 0.9, 0.99):
            point = client.get("/api/v1/query", params={"metric": "latency", "stat": f"p{q * 100:g}", **span}).json()
            point = point["series"][0]["points"][0]
            lo, hi = rank_interval(latencies, point["value"])
            assert lo - KLL_BOUND <= q <= hi + KLL_BOUND, (q, lo, hi)
            assert point["revision"] > 1  # the window holds corrected panes
        listed = client.get("/api/v1/corrections", params={"stream": STREAM, "limit": 10_000}).json()
        assert listed["count"] == len(corrections)
        dead = client.get("/api/v1/dead-letters", params={"reason": "future_skew"}).json()
        assert dead["count"] == 25 and dead["totals_by_reason"][STREAM] == reasons
        log.close()
        return corrections
    finally:
        store.close()


def run_in_process(spark, catalog, test_log: TestLog, clock) -> None:
    """The drain `sketchboard pipeline --once` runs (sketchboard/live.py), so the crashed
    process's batches are the reference's: on Kafka the demo enriches, and a backlog over a
    batch is caught up in batches cut at one append time first (`Pipeline.catch_up`)."""
    config = test_log.pipeline_config(max_records_per_batch=BATCH, max_records_per_task=TASK)
    store = SqlitePaneStore(test_log.root / "store.db")
    pipeline = Pipeline(spark, catalog, store, config, clock=clock)
    pipeline.catch_up()
    pipeline.run_until_drained()
    store.close()


@dataclass
class Reference:
    log: TestLog
    base_ms: int
    now_ms: int
    expected: Oracle
    corrections: dict
    matches: list


def stuffing_matches(root: Path) -> list[tuple]:
    """The demo's credential_stuffing matches as stored: key, when decided, the log records
    matched, whether late, whether a retraction."""
    store = SqlitePaneStore(root / "store.db")
    try:
        return sorted((m.key, m.decided_at_ms, tuple((e["stream"], e["partition"], e["offset"]) for e in m.events),
                       m.late, m.retracts is not None)
                      for m in store.pattern_matches("credential_stuffing", limit=10_000))
    finally:
        store.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_catalog, spark, log_backend) -> Reference:
    """The straggler log, drained once by an in-process pipeline (shared by both tests: a
    pipeline run is the slow part). Its clock is injected: the wall clock at the start, fixed,
    since the crash test's pipeline process can only use the real one; event times sit hours
    to days from every retention and skew boundary, so both classify alike."""
    test_log = log_backend.new(tmp_path_factory.mktemp("reference"))
    now_ms = int(time.time() * 1000)
    base_ms = (now_ms // 60_000) * 60_000 - 600_000
    written = write_straggler_log(test_log, demo_catalog, base_ms)
    run_in_process(spark, demo_catalog, test_log, clock=lambda: now_ms / 1000)
    expected = oracle(test_log, test_log.root / "checkpoints" / "main", demo_catalog, now_ms)
    assert expected.read == written.records and set(written.bypassed) <= set(expected.dead)
    matches = stuffing_matches(test_log.root)
    assert written.logins and len({m[0] for m in matches}) >= 10  # most of the 18 bursts with a success
    return Reference(test_log, base_ms, now_ms, expected, {}, matches)


def test_stragglers_corrections_and_dead_letters_are_exact(reference, demo_catalog):
    reference.corrections.update(check_everything(reference.log, demo_catalog, reference.expected, reference.now_ms))


def _pipeline_process(test_log: TestLog, log_file) -> subprocess.Popen:
    data_dir = test_log.root
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKETCHBOARD_")}
    env.update({
        **test_log.env(),
        "SKETCHBOARD_DATA_DIR": str(data_dir),
        "SKETCHBOARD_STREAMS_CONFIG": str(REPO / "config" / "streams.yaml"),
        "SKETCHBOARD_MAX_RECORDS_PER_BATCH": str(BATCH),
        "SKETCHBOARD_MAX_RECORDS_PER_TASK": str(TASK),
        "SKETCHBOARD_SPARK_DRIVER_MEMORY": "1g",
        "SPARK_LOCAL_DIRS": str(data_dir / "spark-local"),
    })
    return subprocess.Popen([sys.executable, "-m", "sketchboard.cli", "pipeline", "--once"], cwd=data_dir, env=env,
                            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _restart_in_process(spark, test_log: TestLog) -> int:
    """What a second `sketchboard pipeline --once` process over the same folder runs (settings as
    _pipeline_process gives them, sketchboard/live.py's run_pipeline), on the session's SparkSession:
    the recovery lives in the checkpoint and the store, so a second process would add only its
    Spark start-up (~20 s, more under load), which the crashed first process already exercised."""
    from sketchboard.live import run_pipeline
    from sketchboard.settings import Settings

    settings = Settings(**test_log.settings(), data_dir=test_log.root, streams_config=REPO / "config" / "streams.yaml",
                        max_records_per_batch=BATCH, max_records_per_task=TASK, spark_driver_memory="1g")
    return run_pipeline(settings, threading.Event(), once=True, spark=spark)


def _store_last_batch(store_path: Path) -> int | None:
    if not store_path.exists():
        return None
    try:
        with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT MAX(batch_id) FROM batches").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return None


def test_sigkill_mid_batch_then_restart_gives_the_same_result(tmp_path, demo_catalog, reference, spark):
    expected = reference.expected
    want = reference.corrections or check_everything(reference.log, demo_catalog, expected, reference.now_ms)
    crashed_log = reference.log.same_log_in(tmp_path / "crashed")  # the same records, a fresh pipeline
    crashed = crashed_log.root

    # Kill the whole pipeline process group (driver, JVM, Python workers) while batch N runs:
    # Spark has logged offsets/N, not commits/N, and the store has not recorded batch N.
    checkpoint = crashed / "checkpoints" / "main"
    with open(tmp_path / "pipeline-1.log", "wb") as out:
        proc = _pipeline_process(crashed_log, out)
        killed_in = None
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                for n in (2, 3, 4):
                    if ((checkpoint / "offsets" / str(n)).exists() and not (checkpoint / "commits" / str(n)).exists()
                            and (_store_last_batch(crashed / "store.db") or -1) < n):
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed_in = n
                        break
                if killed_in is not None:
                    break
                time.sleep(0.02)
        finally:
            if proc.poll() is None and killed_in is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert killed_in is not None, (tmp_path / "pipeline-1.log").read_text()[-3000:]
    assert proc.returncode == -signal.SIGKILL
    assert _store_last_batch(crashed / "store.db") == killed_in - 1, "killed mid-batch"
    assert not (checkpoint / "commits" / str(killed_in)).exists()

    assert _restart_in_process(spark, crashed_log) == 0

    after = oracle(crashed_log, checkpoint, demo_catalog, int(time.time() * 1000))
    assert after.corrections == expected.corrections and after.dead == expected.dead
    # The pattern's state crossed the kill too: the same matches, none lost, none twice.
    assert stuffing_matches(crashed) == reference.matches
    got = check_everything(crashed_log, demo_catalog, after, int(time.time() * 1000))
    # exactly the same correction records as the run without a crash (sums to float rounding,
    # distinct estimates to HLL merge-order noise)
    assert got.keys() == want.keys()
    for key, (r_from, r_to, added, old, new) in want.items():
        g = got[key]
        assert (g[0], g[1], g[2]) == (r_from, r_to, added), key
        for mine, theirs in ((g[3], old), (g[4], new)):
            assert mine["count"] == theirs["count"]
            for name, stats in theirs["values"].items():
                assert {k: mine["values"][name][k] for k in ("n", "min", "max")} == \
                       {k: stats[k] for k in ("n", "min", "max")}
                assert mine["values"][name]["sum"] == pytest.approx(stats["sum"], rel=1e-9)
            for name, estimate in theirs["distinct"].items():
                assert mine["distinct"][name] == pytest.approx(estimate, rel=0.01)
