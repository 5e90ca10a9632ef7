"""Pure pieces: pane boundaries, key partitioning, the Spark source's batch planning and row layout.

No Spark session is started: only the pure functions of ingest.spark_source are used.
"""

from __future__ import annotations

import copy
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import StreamDef, load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.partitioner import partition_for
from ingest.spark_source import SOURCE_SCHEMA, LogSlice, pack_slices, plan_end_offsets, to_source_batch
from store.panes import dims_key, pane_start

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
T0 = 1_700_000_000_000
PANES = st.sampled_from([1_000, 10_000, 60_000])
TIMES = st.integers(min_value=-(10**15), max_value=10**15)


# -- panes ------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(TIMES, PANES)
def test_pane_start_contains_the_time(t: int, p: int) -> None:
    start = pane_start(t, p)
    assert start <= t < start + p
    assert start % p == 0


@settings(max_examples=300, deadline=None)
@given(TIMES, PANES)
def test_every_event_in_exactly_one_pane(t: int, p: int) -> None:
    start = pane_start(t, p)
    candidates = [start + k * p for k in range(-2, 3)]
    assert [c for c in candidates if c <= t < c + p] == [start]
    # every time of that pane maps back to the same start
    assert pane_start(start, p) == start
    assert pane_start(start + p - 1, p) == start
    assert pane_start(start + p, p) == start + p


@pytest.mark.parametrize(
    ("t", "p", "start"),
    [(0, 10_000, 0), (9_999, 10_000, 0), (10_000, 10_000, 10_000), (-1, 10_000, -10_000), (-10_000, 10_000, -10_000),
     (T0 + 12_345, 10_000, T0 + 10_000), (T0 + 59_999, 60_000, T0 - 20_000 + 60_000)],
)
def test_pane_start_examples(t: int, p: int, start: int) -> None:
    assert pane_start(t, p) == start


def test_dims_key_is_canonical() -> None:
    assert dims_key({"b": "2", "a": "1"}) == dims_key({"a": "1", "b": "2"}) == '{"a":"1","b":"2"}'
    assert dims_key({}) == "{}"
    assert dims_key({"city": "Zürich"}) == '{"city":"Zürich"}'
    assert dims_key({"a": ""}) != dims_key({})


# -- partitions -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=50), st.integers(min_value=1, max_value=256))
def test_partition_for_is_stable_and_in_range(key: str, n: int) -> None:
    p = partition_for(key, n)
    assert 0 <= p < n
    assert partition_for(key, n) == p
    assert p == zlib.crc32(key.encode("utf-8")) % n


def test_partition_for_known_values() -> None:
    # pinned: the same in every process and release (unlike hash())
    assert zlib.crc32(b"hello") == 907060870
    assert partition_for("hello", 4) == 907060870 % 4 == 2
    assert partition_for("hello", 7) == 907060870 % 7


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=256))
def test_keyless_partition_uses_the_fallback(fallback: int, n: int) -> None:
    assert partition_for(None, n, fallback) == fallback % n


# -- planning a batch's end offsets -----------------------------------------------------

STREAMS = st.sampled_from(["a", "b"])
PARTS = st.sampled_from(["0", "1", "2", "3"])
OFFSET_MAPS = st.dictionaries(STREAMS, st.dictionaries(PARTS, st.integers(min_value=0, max_value=60)))


def _lo(start: dict, s: str, p: str) -> int:
    return start.get(s, {}).get(p, 0)


def _backlogs(start: dict, available: dict) -> dict[tuple[str, str], int]:
    return {
        (s, p): hi - _lo(start, s, p) for s, parts in available.items() for p, hi in parts.items() if hi > _lo(start, s, p)
    }


@settings(max_examples=400, deadline=None)
@given(OFFSET_MAPS, OFFSET_MAPS, st.one_of(st.none(), st.integers(min_value=0, max_value=200)))
def test_plan_end_offsets_properties(start: dict, available: dict, max_rows: int | None) -> None:
    start_copy, available_copy = copy.deepcopy(start), copy.deepcopy(available)
    end = plan_end_offsets(start, available, max_rows)
    assert start == start_copy and available == available_copy  # inputs untouched
    backlog = _backlogs(start, available)
    granted = {}
    for s, parts in available.items():
        for p, hi in parts.items():
            lo = _lo(start, s, p)
            e = end[s][p]
            assert e >= lo  # never below start
            assert e <= max(hi, lo)  # never beyond what is available
            granted[(s, p)] = e - lo
    for s, parts in start.items():  # partitions no longer available keep their start
        for p, lo in parts.items():
            if p not in available.get(s, {}):
                assert end[s][p] == lo
    total = sum(granted.values())
    if max_rows is None:
        assert granted == {k: backlog.get(k, 0) for k in granted}
    else:
        assert total <= max_rows
        assert total == min(max_rows, sum(backlog.values()))  # nothing held back while there is budget
        if max_rows >= len(backlog):
            assert all(granted[k] >= 1 for k in backlog)  # no partition with a backlog starves
        if backlog:
            fair = max_rows // len(backlog)
            assert all(granted[k] >= min(backlog[k], fair) for k in backlog)


def test_plan_end_offsets_water_filling_example() -> None:
    start = {"s": {"0": 0, "1": 0, "2": 5}}
    available = {"s": {"0": 100, "1": 10, "2": 5}, "t": {"0": 30}}
    assert plan_end_offsets(start, available, 50) == {"s": {"0": 20, "1": 10, "2": 5}, "t": {"0": 20}}
    assert plan_end_offsets(start, available, None) == {"s": {"0": 100, "1": 10, "2": 5}, "t": {"0": 30}}
    assert plan_end_offsets(start, available, 0) == {"s": {"0": 0, "1": 0, "2": 5}, "t": {"0": 0}}
    assert plan_end_offsets(start, available, 3) == {"s": {"0": 1, "1": 1, "2": 5}, "t": {"0": 1}}


def test_plan_end_offsets_fewer_rows_than_partitions() -> None:
    start: dict = {}
    available = {"s": {str(p): 10 for p in range(4)}}
    end = plan_end_offsets(start, available, 2)
    assert sum(end["s"].values()) == 2
    assert all(0 <= v <= 1 for v in end["s"].values())


# -- the source's row layout ------------------------------------------------------------


@pytest.fixture(scope="module")
def http_batch(tmp_path_factory) -> tuple[StreamDef, int, list[dict], pa.RecordBatch]:
    stream = load_catalog(CONFIG).stream("http_requests")
    validator = EventValidator(stream)
    raws = [
        {"time": T0 + i, "user_id": "same-user", "endpoint": f"/e{i}", "method": "GET" if i % 2 else "POST",
         "status": 200 + i, "region": f"r{i}", "latency_ms": i * 1.5, "response_bytes": 1000 + i}
        for i in range(12)
    ]
    raws[3].pop("region")  # a missing dimension: ""
    raws[4].pop("latency_ms")  # a missing value: null
    raws[5]["status"] = None
    log = SqliteEventLog(tmp_path_factory.mktemp("source") / "log.db")
    log.ensure_topic(stream)
    log.append(stream, [validator.validate(r) for r in raws[:6]], T0 + 100)
    log.append(stream, [validator.validate(r) for r in raws[6:]], T0 + 200)
    partition = partition_for("same-user", stream.partitions)
    # offsets 2..9: starts inside the first segment and ends inside the second (sliced arrays)
    batches = [to_source_batch(stream, partition, b) for b in log.read(stream, partition, 2, 10)]
    log.close()
    table = pa.Table.from_batches(batches, schema=SOURCE_SCHEMA)
    return stream, partition, raws, table


def test_source_batch_schema(http_batch) -> None:
    _, _, _, table = http_batch
    assert table.schema.equals(SOURCE_SCHEMA)
    assert table.schema.field("dims").type.value_field.name == "element"
    assert table.num_rows == 8


def test_source_batch_rows_by_hand(http_batch) -> None:
    stream, partition, raws, table = http_batch
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == list(range(2, 10))
    assert {r["stream"] for r in rows} == {"http_requests"}
    assert {r["partition"] for r in rows} == {partition}
    assert [r["event_time"] for r in rows] == [T0 + i for i in range(2, 10)]
    assert [r["ingest_time"] for r in rows] == [T0 + 100] * 4 + [T0 + 200] * 4
    # dims in declared order: endpoint, method, status, region, then plan, country and tier,
    # enriched through the view user_plans by the pipeline (empty in the source rows)
    assert stream.dimensions == ("endpoint", "method", "status", "region", "plan", "country", "tier")
    assert rows[0]["dims"] == ["/e2", "POST", "202", "r2", "", "", ""]
    assert rows[1]["dims"] == ["/e3", "GET", "203", "", "", "", ""]  # missing region
    assert rows[3]["dims"] == ["/e5", "GET", "", "r5", "", "", ""]  # null status
    assert rows[7]["dims"] == ["/e9", "GET", "209", "r9", "", "", ""]
    # vals in declared order: latency_ms, response_bytes
    assert rows[0]["vals"] == [3.0, 1002.0]
    assert rows[2]["vals"] == [None, 1004.0]  # missing latency stays null
    assert rows[7]["vals"] == [13.5, 1009.0]
    # ids: the distinct fields
    assert all(r["ids"] == ["same-user"] for r in rows)
    for r in rows:
        assert len(r["dims"]) == 7 and len(r["vals"]) == 2


def test_source_batch_of_a_stream_without_values_or_distincts(tmp_path: Path) -> None:
    stream = StreamDef(name="pings", dimensions=("host", "dc"), partitions=1)
    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(stream)
    v = EventValidator(stream)
    log.append(stream, [v.validate({"time": T0, "host": "h1", "dc": "x"}), v.validate({"time": T0, "dc": "y"})], T0)
    batch = to_source_batch(stream, 0, next(log.read(stream, 0, 0, 10)))
    log.close()
    assert batch.schema.equals(SOURCE_SCHEMA)
    rows = batch.to_pylist()
    assert [r["dims"] for r in rows] == [["h1", "x"], ["", "y"]]
    assert [r["vals"] for r in rows] == [[], []]
    assert [r["ids"] for r in rows] == [[], []]


def test_source_batch_distinct_fields_in_declared_order(tmp_path: Path) -> None:
    stream = StreamDef(name="s", key_field="k", dimensions=("d",), values=("b", "a"), distinct=("z", "k"), partitions=1)
    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(stream)
    v = EventValidator(stream)
    log.append(stream, [v.validate({"time": T0, "k": "key1", "z": "zz", "d": "dd", "a": 1, "b": 2}),
                        v.validate({"time": T0, "k": "key2", "a": 3})], T0)
    batch = to_source_batch(stream, 0, next(log.read(stream, 0, 0, 10)))
    log.close()
    rows = batch.to_pylist()
    assert rows[0]["ids"] == ["zz", "key1"]
    assert rows[0]["vals"] == [2.0, 1.0]
    assert rows[1]["ids"] == [None, "key2"]  # a missing distinct field stays null (not counted)
    assert rows[1]["vals"] == [None, 3.0]
    assert rows[1]["dims"] == [""]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=100), max_size=30), st.integers(min_value=100, max_value=400))
def test_pack_slices_keeps_every_slice_once_in_order(sizes: list[int], bound: int) -> None:
    slices, pos = [], 0
    for i, n in enumerate(sizes):
        slices.append(LogSlice("s", i % 3, pos, pos + n))
        pos += n
    tasks = pack_slices(slices, bound)
    assert [s for t in tasks for s in t.slices] == slices
    assert len(tasks) == (min(1, len(slices)) if pos <= bound else len(slices))


def test_a_small_batch_over_many_partitions_is_one_task() -> None:
    slices = [LogSlice("http_requests", p, 100, 150) for p in range(4)] + [LogSlice("orders", p, 0, 10) for p in range(2)]
    assert len(pack_slices(slices, 250_000)) == 1
