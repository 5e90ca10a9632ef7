"""The Arrow partials (aggregates/arrow_partials.py, `PipelineConfig.partials`) commit what Spark's
groupBy commits: the shipped demo configuration (device clocks, enrichment, tables and views, joins,
sessions, patterns, first-seen and membership) over the same log, with stragglers and dead letters,
drained batch by batch by three pipelines: Spark's partials, the Arrow ones on the executors (every
batch persisted, read in small tasks: a group's map-side partials merged across tasks), and the Arrow ones as configured (small batches grouped on the driver, no Spark
job). Their stores hold the same panes (counts, n/min/max, exact KLL quantiles, HLL estimates; sums
within rounding), dead letters, watermarks and per-stream progress."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from aggregates.pipeline import Pipeline
from catalog import load_catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.tables import TableRowValidator
from sketchboard.settings import DEFAULT_STREAMS
from sketches import HllSketch, KllSketch
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0
from tests.spark.test_driver_batch import QUANTILES, panes, stored

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]


def test_arrow_partials_commit_what_spark_partials_commit(tmp_path, spark, log_backend, store_backend):
    catalog = load_catalog(DEFAULT_STREAMS)
    test_log = log_backend.new(tmp_path)
    log = test_log.open(catalog)
    now = {"ms": T0 + 3_600_000}
    traffic = DemoTraffic(catalog, seed=7, clock=lambda: now["ms"] / 1000, users=400)  # a users table of 400 rows
    validators = {n: EventValidator(s) for n, s in catalog.streams.items() if s.kind != "table"}
    rng = random.Random(7)

    def append(requests: int) -> None:
        for name, rows in traffic.table_changes().items():
            table = catalog.streams[name]
            log.append(table, [TableRowValidator(table).validate(r, now["ms"]) for r in rows], now["ms"])
        for name, raws in traffic.generate(requests).items():
            for raw in rng.sample(raws, min(3, len(raws))):  # too old for the stream: dead letters
                raw["time"] = now["ms"] - 30 * 86_400_000
            for raw in rng.sample(raws, min(5, len(raws))):  # stragglers: panes an hour back revised
                raw["time"] = now["ms"] - rng.randrange(3_600_000)
            log.append(catalog.streams[name], [validators[name].validate(r) for r in raws], now["ms"])

    def pipeline(name: str, **config) -> Pipeline:
        return Pipeline(spark, catalog, store_backend.create(), replace(test_log.pipeline_config(name=name), **config),
                        clock=lambda: now["ms"] / 1000, log=test_log.open(catalog))

    runs = {"spark": pipeline("spark", partials="spark"),
            "arrow": pipeline("arrow", partials="arrow"),  # small batches grouped on the driver
            # Every batch on the executors, read in tasks of at most 100 records: each task's rows
            # grouped where they are, so a group's partials come from several tasks and are merged.
            "executors": pipeline("executors", partials="arrow", driver_batch_rows=0, max_records_per_task=100)}
    append(1_500)  # the tables' first rows and a large first batch (on the executors for all three)
    for i in range(3):
        for p in runs.values() if i % 2 else reversed(runs.values()):
            p.run_until_drained()
        now["ms"] += 5_000
        append(150)

    def dead(store):
        return sorted(((d.batch_id, d.letter) for d in store.dead_letters(limit=10_000)), key=repr)

    want = stored(runs["spark"].store, catalog, "spark")
    assert want["panes"] and want["streams"]["http_requests"][2] > 0  # panes and dead letters: covered
    for name in ("arrow", "executors"):
        got = stored(runs[name].store, catalog, name)
        assert got == want, name
        assert dead(runs[name].store) == dead(runs["spark"].store)
        assert panes(runs[name].store, catalog)[1] == pytest.approx(panes(runs["spark"].store, catalog)[1], rel=1e-9)
        # The tier rows too: the Arrow partials' tiers are made from their columns
        # (BatchCommit.partial_columns), Spark's from the partials' objects.
        want_tiers, want_sums = tier_rows(runs["spark"].store, catalog)
        got_tiers, got_sums = tier_rows(runs[name].store, catalog)
        assert want_tiers and got_tiers == want_tiers, name
        assert got_sums == pytest.approx(want_sums, rel=1e-9)


def tier_rows(store, catalog) -> tuple[dict, dict]:
    """Every tier row of every stream, comparable as panes() makes panes comparable; sums apart."""
    out, sums = {}, {}
    for stream in catalog.streams:
        layout = store.tier_layout(stream)
        for tier in layout.tiers() if layout is not None else ():
            for row in store.read_tier(stream, tier.granule_ms, tier.proj, 0, 2**62, with_sketches=True,
                                       pane_ms=layout.pane_ms):
                values = {}
                for field, v in row.data.values.items():
                    kll = KllSketch.from_bytes(v.kll) if v.kll else None
                    exact = kll is not None and kll.n <= kll.k
                    values[field] = (v.n, v.min, v.max,
                                     tuple(kll.quantile(q).value for q in QUANTILES) if exact else kll and kll.n)
                    sums[(stream, tier, row.key.start_ms, row.key.dims, field)] = v.sum
                distincts = {f: round(HllSketch.from_bytes(b).estimate().value, 6) for f, b in row.data.distincts.items()}
                out[(stream, tier.granule_ms, tier.proj, row.key.start_ms, row.key.dims)] = (
                    row.data.count, row.revision, values, distincts)
    return out, sums
