"""The Arrow rules of a small batch on the driver (aggregates/driver_rules.py) give what Spark's
expressions give for the same records (aggregates/partials.py, aggregates/device_clocks.py: the
path of large batches): the dead-letter reason, pane start, grouping dims and dead record of each
row, the device clock samples, and the corrected event times. Records are drawn at random around
every rule's edge: nulls, errors with and without a kind, event ids missing or past the end of
the ids array, times at the retention and future-skew limits, negative times, devices with and
without a correction."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates import driver_rules
from aggregates.device_clocks import DeviceClocks
from aggregates.partials import _dead_record, _keyed
from catalog import parse_catalog
from ingest.source_rows import SOURCE_SCHEMA, SPARK_SCHEMA

pytestmark = pytest.mark.spark

CATALOG = parse_catalog("""
streams:
  orders:
    key_field: user_id
    dimensions: [country]
    values: [amount]
    event_id_field: request_id
    dedup_window: 1h
    pane: 10s
    retention: 1d
    max_future_skew: 1m
  app:
    key_field: device_id
    dimensions: [screen, os]
    values: [duration_ms]
    sent_time_field: sent_at
    pane: 1m
    retention: 2h
    max_future_skew: 5m
""")
NOW = 1_800_000_000_000
DAY = 86_400_000

EDGES = [NOW - DAY, NOW - DAY - 1, NOW - 2 * 3_600_000, NOW - 2 * 3_600_000 - 1, -1, -10_001, -60_000, 0]
SKEW_EDGES = [60_000, 60_001, 300_000, 300_001]  # the streams' max_future_skew past the ingest time
strings = st.one_of(st.none(), st.sampled_from(["a", "b", ""]))


def event_times(ingest: int | None):
    return st.one_of(st.none(), st.sampled_from(EDGES), st.integers(-2 * DAY, 2 * DAY).map(lambda d: NOW + d),
                     st.sampled_from(SKEW_EDGES).map(lambda d: (ingest or NOW) + d))


@st.composite
def records(draw) -> pa.Table:
    rows = []
    for offset in range(draw(st.integers(0, 40))):
        stream = draw(st.sampled_from(["orders", "app"]))
        ingest = draw(st.one_of(st.integers(-3_600_000, 3_600_000).map(lambda d: NOW + d), st.none()))
        event = draw(event_times(ingest))
        error = draw(st.sampled_from([None, None, None, "bad record"]))
        rows.append({
            "stream": stream, "partition": draw(st.integers(0, 2)), "offset": offset,
            "event_time": event, "ingest_time": ingest,
            "dims": draw(st.one_of(st.none(), st.lists(strings, max_size=3))),
            "vals": draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.floats(-5, 5)), max_size=2))),
            "ids": draw(st.one_of(st.lists(st.sampled_from(["a", "b"]), min_size=2, max_size=2), st.none(),
                                  st.lists(strings, max_size=2))),
            "error": error, "error_kind": draw(st.sampled_from([None, "invalid"])) if error else None,
            "sent_time": draw(st.one_of(st.none(), st.integers(-600_000, 600_000).map(lambda d: (ingest or NOW) + d))),
            "device": draw(st.one_of(st.none(), st.sampled_from(["d1", "d2", "d3"]))),
        })
    table = pa.Table.from_pylist(rows, schema=SOURCE_SCHEMA)
    # In chunks, as a batch read segment by segment is (ingest/spark_source.py read_batch).
    cut = draw(st.integers(0, len(rows)))
    return pa.concat_tables([table.slice(0, cut), table.slice(cut)])


def _by_offset(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["offset"])


# 20 examples, as the other property test against Spark (test_validation_fast_path.py): each costs
# four Spark jobs (~2 s), and 40 were 81 s of `make test`'s in-process Spark run.
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(table=records(), corrections=st.dictionaries(st.tuples(st.sampled_from(["orders", "app"]),
                                                              st.sampled_from(["d1", "d2"])),
                                                    st.integers(-120_000, 120_000).filter(bool), max_size=3))
def test_the_arrow_rules_give_what_sparks_give(spark, table, corrections):
    batch = spark.createDataFrame(table.to_pylist(), SPARK_SCHEMA)

    # The keyed rows every step reads: reason, pane, grouping dims, dead record (and the clock columns).
    want = _keyed(batch, CATALOG, NOW).select("*", _dead_record())
    got = driver_rules.keyed(table, CATALOG, NOW)
    assert got.column_names == want.columns
    assert got.to_pylist() == [r.asDict(recursive=True) for r in want.collect()]

    # The device clock samples (Spark's groupBy on the large batches' path).
    clocks = DeviceClocks(spark, CATALOG, store=None)
    assert sorted(driver_rules.clock_samples(table, ["app"])) == sorted(clocks.samples(batch, streams=None))

    # The corrected batch (a broadcast join there: rows compared by offset, columns by name).
    from aggregates.device_clocks import ClockPlan

    applied = clocks.apply(batch, ClockPlan(corrections=corrections))
    corrected = driver_rules.corrected(table, corrections)
    assert sorted(corrected.column_names) == sorted(applied.columns)
    assert _by_offset(corrected.to_pylist()) == _by_offset([r.asDict(recursive=True) for r in applied.collect()])
    # And keyed after the correction: dead reasons and panes in corrected time.
    rekeyed = _keyed(applied, CATALOG, NOW).select("*", _dead_record())
    assert _by_offset(driver_rules.keyed(corrected, CATALOG, NOW).to_pylist()) == _by_offset(
        [r.asDict(recursive=True) for r in rekeyed.collect()])
