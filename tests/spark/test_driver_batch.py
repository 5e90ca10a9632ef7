"""A small batch read on the driver (aggregates/driver_batch.py; from the embedded log, in Python,
with no Spark job) commits what the persisted path commits, with no Spark job at all: the shipped demo configuration (device clocks, enrichment
through a view, tables and views, joins, sessions, patterns, first-seen and membership) over the
same log, drained batch by batch by two pipelines, one with `driver_batch_rows=0` (always
persisted, the path large batches take) and one as configured; their stores must hold the same
panes of every stream (exact stats equal; KLL quantiles where the sketch is exact), tables' versions
and rows, device clocks, misses and dead letters."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import replace

import pytest
from py4j.java_gateway import GatewayClient
from py4j.protocol import MEMORY_COMMAND_NAME, MEMORY_DEL_SUBCOMMAND_NAME

from aggregates.driver_batch import arrow_on_driver
from aggregates.driver_rows import DriverRows
from aggregates.partials import arrow_input, dead_letter_reason_column, merged_records
from aggregates.pipeline import Pipeline, drain
from aggregates.progress import register
from catalog import load_catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.tables import TableRowValidator
from sketches import HllSketch, KllSketch
from sketchboard.settings import DEFAULT_STREAMS
from store import table_versions
from store.health import HealthStore
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

MEMORY_DELETE = MEMORY_COMMAND_NAME + MEMORY_DEL_SUBCOMMAND_NAME
QUANTILES = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)


def panes(store, catalog) -> tuple[dict, dict]:
    """Every stream's panes as comparable values: counts, n/min/max per value, quantiles of exact
    KLL sketches (one past k compacts at random, so only n then), HLL estimates; and apart, the
    sums (Spark's partial sums meet in another order: the last bits may differ)."""
    out, sums = {}, {}
    for stream in catalog.streams:
        for p in store.read_panes(stream, 0, 2**62):
            values = {}
            for name, v in p.data.values.items():
                kll = KllSketch.from_bytes(v.kll) if v.kll else None
                exact = kll is not None and kll.n <= kll.k
                values[name] = (v.n, v.min, v.max,
                                tuple(kll.quantile(q).value for q in QUANTILES) if exact else kll and kll.n)
                sums[(stream, p.key.start_ms, p.key.dims, name)] = v.sum
            distincts = {f: round(HllSketch.from_bytes(b).estimate().value, 6) for f, b in p.data.distincts.items()}
            out[(stream, p.key.start_ms, p.key.dims)] = (p.data.count, values, distincts)
    return out, sums


def stored(store, catalog, name: str) -> dict:
    progress = store.progress(name)
    tables = [n for n, s in catalog.streams.items() if s.kind == "table"]
    return {
        "panes": panes(store, catalog)[0],
        "versions": {t: sorted((k, v.valid_from_ms, v.partition, v.offset, str(v.row))
                               for k, v in store.table_versions(t)) for t in tables},
        "rows": {t: store.table_rows(t, limit=10_000) for t in tables},
        "clocks": {s: store.device_clocks(s) for s, d in catalog.streams.items() if d.sent_time_field},
        "streams": {s: (p.events_read, p.events_aggregated, p.events_dead_lettered, dict(p.dead_lettered_by_reason),
                        p.enrich_misses, p.watermark_ms) for s, p in progress.streams.items()},
        "sessions": store.session_sizes(),
    }


def test_a_small_batch_on_the_driver_commits_what_the_persisted_path_does_in_fewer_spark_jobs(
        tmp_path, spark, log_backend, store_backend, monkeypatch):
    catalog = load_catalog(DEFAULT_STREAMS)
    test_log = log_backend.new(tmp_path)
    log = test_log.open(catalog)
    now = {"ms": T0 + 3_600_000}
    traffic = DemoTraffic(catalog, seed=5, clock=lambda: now["ms"] / 1000, users=400)  # a users table of 400 rows
    validators = {n: EventValidator(s) for n, s in catalog.streams.items() if s.kind != "table"}
    rng = random.Random(5)

    def append(requests: int, only: str | None = None) -> None:
        """The demo's table changes and `requests`' worth of events; `only`: that stream's events alone."""
        for name, rows in traffic.table_changes().items() if only is None else ():
            table = catalog.streams[name]
            log.append(table, [TableRowValidator(table).validate(r, now["ms"]) for r in rows], now["ms"])
        for name, raws in traffic.generate(requests).items():
            if only is not None and name != only:
                continue
            # Some too old for the stream (dead letters), some unparseable: both paths must agree.
            for raw in rng.sample(raws, min(3, len(raws))):
                raw["time"] = now["ms"] - 30 * 86_400_000
            log.append(catalog.streams[name], [validators[name].validate(r) for r in raws], now["ms"])

    sc = spark.sparkContext
    jobs: dict[str, list[int]] = {"driver": [], "persisted": []}
    calls: dict[str, list[int]] = {"driver": [], "persisted": []}  # commands sent into the JVM per batch
    sent = [0]
    send_command = GatewayClient.send_command

    checking = [False]  # the checks of DriverRows below: not counted

    def counting(client, command, *args, **kwargs):
        # Not counted: the checks' own calls, and Py4J's deletes of Java objects that Python let go
        # (sent whenever the garbage collector runs, e.g. for the checks' DataFrames of an earlier batch).
        sent[0] += 0 if checking[0] or command.startswith(MEMORY_DELETE) else 1
        return send_command(client, command, *args, **kwargs)

    monkeypatch.setattr(GatewayClient, "send_command", counting)
    # Enrichment takes its single-version keys from the kept columns in every batch, not only in
    # batches of 2 000 users or more of a table at most 4 times that, so the pipeline's way there is the one compared here. (Which
    # keys the columns may answer for as the table changes: tests/unit/test_enrichment_kept.py and
    # test_enrichment_driver.py.)
    monkeypatch.setattr(table_versions, "SINGLES_FROM_KEYS", 0)
    monkeypatch.setattr(table_versions, "SINGLES_TABLE_PER_KEY", 10**9)

    # The batch collected once (aggregates/driver_rows.py): each projection a step reads is what that
    # step's own collect of the batch gave (same rows in the same order, same schema).
    projections = Counter()

    def checked(method, reference):
        def check(self, *args):
            got = method(self, *args)
            checking[0] = True
            try:
                want = reference(self, *args)
            finally:
                checking[0] = False
            same = got == want if isinstance(got, dict) else got.schema == want.schema and got.equals(want)
            assert same, (method.__name__, args, got, want)
            projections[method.__name__] += 1
            return got
        return check

    def frame(rows: DriverRows):
        """The batch's Arrow rows as a Spark DataFrame: what Spark's rules give is the reference."""
        return spark.createDataFrame(rows.batch)

    monkeypatch.setattr(DriverRows, "arrow_input", checked(DriverRows.arrow_input, lambda rows: arrow_on_driver(
        arrow_input(frame(rows), rows.catalog, batch_now_ms=rows.batch_now_ms))))
    monkeypatch.setattr(DriverRows, "merged", checked(DriverRows.merged, lambda rows, streams, columns: merged_records(
        frame(rows), rows.catalog, rows.batch_now_ms, streams, columns, present=None, on_driver=True)))
    monkeypatch.setattr(DriverRows, "true_counts", checked(
        DriverRows.true_counts, lambda rows, columns: (lambda flags: {c: sum(1 for r in flags if r[c]) for c in columns})(
            frame(rows).where(dead_letter_reason_column(rows.catalog, rows.batch_now_ms).isNull())
            .select(*columns).collect())))

    def pipeline(name: str, **config) -> Pipeline:
        p = Pipeline(spark, catalog, store_backend.create(), replace(test_log.pipeline_config(name=name), **config),
                     clock=lambda: now["ms"] / 1000, log=test_log.open(catalog))
        process = p.process_batch

        def counted(batch, batch_id):  # each batch in its own job group: its Spark jobs counted
            group = f"{name} {batch_id}"
            sc.setJobGroup(group, group)
            before = sent[0]
            try:
                return process(batch, batch_id)
            finally:
                calls[name].append(sent[0] - before)
                jobs[name].append(len(sc.statusTracker().getJobIdsForGroup(group)))
                sc.setJobGroup("", "")

        p.process_batch = counted
        return p

    def queried(p: Pipeline) -> None:
        # Spark's query plans each batch, as in the live loop (on the embedded log run_until_drained
        # would plan a backlog itself, with no query: tests/spark/test_driver_drain.py).
        drain(p.start(available_now=True), "pipeline")

    driver, persisted = pipeline("driver"), pipeline("persisted", driver_batch_rows=0)
    # Spark's progress as the service records it: Spark never runs a batch read on the driver, so
    # the input rows it reports are the pipeline's own count (aggregates/progress.py).
    health = HealthStore(store_backend.side_db(), retention_ms=3_600_000)
    recorder = register(spark, health, "driver", "sketchboard-driver", input_rows=driver.rows_read_on_driver.get)
    # The tables' first rows and events: batch 0. The source logs where it started, so batch 0's
    # size is known and the driver pipeline holds it too.
    append(200)
    first = 0  # the first batch held on the driver
    for p in (driver, persisted):
        queried(p)
    read_first = driver.store.progress("driver").events_read
    # The demo's ticks: a few plan changes and ~300 events a batch; then a batch of http_requests
    # alone (the freshness benchmark's traffic): the steps of the streams without records are skipped.
    for i, only in enumerate((None, None, "http_requests")):
        now["ms"] += 5_000
        append(200, only)
        for p in (driver, persisted) if i % 2 else (persisted, driver):
            queried(p)

    assert stored(driver.store, catalog, "driver") == stored(persisted.store, catalog, "persisted")
    # Every step read its projection of the one collect: patterns, joins, partials, misses (the keys
    # of the Bloom features and sessions read the keyed rows themselves, the merged ones by position:
    # their rows and what they commit are compared with Spark's below and in tests/spark/test_firstseen.py).
    assert projections["arrow_input"] == 4 - first and projections["merged"] >= 5 and projections["true_counts"] >= 2, projections
    assert panes(driver.store, catalog)[1] == pytest.approx(panes(persisted.store, catalog)[1], rel=1e-9)
    summary = stored(driver.store, catalog, "driver")
    assert summary["streams"]["http_requests"][4]  # enrichment misses happened (unsynced users): covered
    assert any(d for d in summary["clocks"].values())  # device clocks estimated: covered
    assert summary["streams"]["http_requests"][2] > 0  # dead letters: covered
    # The job counts (not times): a small batch of the embedded log is read from the log in Python
    # (ingest.spark_source.read_batch) into local rows, its steps collect local rows without Spark
    # jobs, the Bloom features' and sessions' keys and the partial aggregates
    # (aggregates/arrow_partials.py) are grouped on the driver: no Spark job is left.
    assert len(jobs["driver"]) == len(jobs["persisted"]) == 4
    assert jobs["driver"][first:] == [0] * (4 - first), jobs
    # Every record read once, by the pipeline itself, and reported as the batches' input rows.
    assert sorted(driver.rows_read_on_driver) == list(range(first, 4))
    assert sum(n for b, n in driver.rows_read_on_driver.items() if b > 0) == (
        driver.store.progress("driver").events_read - read_first)
    deadline = time.monotonic() + 60  # Spark's listener bus delivers asynchronously
    while (health.state("driver").last_progress or {}).get("batchId") != 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert recorder.settle(60)
    spark.streams.removeListener(recorder)
    last = health.state("driver").last_progress
    assert last["batchId"] == 3 and last["numInputRows"] == driver.rows_read_on_driver[3] > 0, last
    # And the calls into the JVM (a small batch's driver time): ~8 000 with PySpark's DataFrame
    # debugging on and every expression built anew each batch; ~2 200 with them built once per
    # catalog; 578, 487 and 192-310 with enrichment's lookups and the tables' newest rows in Python;
    # 352, 279 and 101 with the batch collected once for the steps after enrichment. Now the batch
    # is an Arrow table on the driver and every step's rule runs in Arrow (aggregates/driver_rules.py):
    # none at all.
    # (Batch 0, on the driver or not, pays the pipeline's one-time set-up calls.)
    assert calls["driver"][1:] == [0, 0, 0], calls
    assert all(p >= d + 10 for d, p in zip(jobs["driver"][1:], jobs["persisted"][1:], strict=True)), jobs
