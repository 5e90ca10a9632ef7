"""Whether a batch is small enough for the driver (aggregates/driver_batch.py) is judged from its
offsets before it is read: an upper bound of its records, or None when a start is unknown; and which streams have
records in it, whose steps run (the others are skipped)."""

from aggregates.driver_batch import among, rows_at_most, streams_with_rows


def test_the_bound_is_the_sum_of_end_minus_start_over_every_partition():
    start = {"a": {0: 10, 1: 5}, "b": {0: 0}}
    end = {"a": {0: 14, 1: 5}, "b": {0: 300}}
    assert rows_at_most(start, end) == 4 + 0 + 300


def test_an_unknown_start_or_no_end_gives_no_bound():
    assert rows_at_most({"a": {0: 10}}, {"a": {0: 12, 1: 3}}) is None  # a partition new in this batch
    assert rows_at_most({}, {"a": {0: 12}}) is None  # no previous batch in the offset log
    assert rows_at_most({"a": {0: 10}}, {}) is None  # this batch's offsets unreadable


def test_an_end_behind_its_start_counts_nothing():
    assert rows_at_most({"a": {0: 10}}, {"a": {0: 7}}) == 0


def test_the_streams_with_records_are_those_a_partition_of_which_moved():
    start = {"a": {0: 10, 1: 5}, "b": {0: 0}, "c": {0: 3}}
    end = {"a": {0: 10, 1: 6}, "b": {0: 0}, "c": {0: 2}}  # c: an end behind its start reads nothing
    assert streams_with_rows(start, end) == {"a"}
    assert streams_with_rows(start, {"b": {0: 4}}) == {"b"}  # a stream not in the end offsets was not read
    assert streams_with_rows({"a": {0: 10}}, {"a": {0: 12, 1: 3}}) is None  # a partition new in this batch
    assert streams_with_rows({"a": {0: 10}}, {}) is None


def test_a_step_skips_the_streams_without_records_unless_they_are_unknown():
    assert among(["x", "y", "z"], frozenset({"z", "x", "w"})) == ["x", "z"]  # in the step's own order
    assert among(["x", "y"], frozenset()) == []
    assert among(["x", "y"], None) == ["x", "y"]  # a batch not on the driver: nothing skipped


def test_batch_0s_start_is_the_earliest_the_embedded_source_chose_pinned_where_the_pipeline_reads_it(tmp_path):
    """Batch 0 is judged too: the source pins its earliest start in the checkpoint folder (Spark's
    offset log holds no start for it), and a restart before batch 0 ran starts there again even
    if retention has since dropped records (a later earliest)."""
    from pathlib import Path

    from catalog import load_catalog
    from ingest.events import EventValidator
    from ingest.log import SqliteEventLog
    from ingest.spark_source import SketchboardLogReader, initial_offsets, source_options
    from tests.support.events import validate_many

    catalog = load_catalog(Path(__file__).resolve().parents[2] / "config" / "streams.yaml")
    stream = catalog.stream("orders")
    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(stream)
    t0 = 1_700_000_000_000
    good, _ = validate_many(EventValidator(stream), [{"time": t0 + i, "customer_id": f"c{i}", "country": "DE",
                                                      "payment_method": "card", "amount": 1.0, "items": 1}
                                                     for i in range(40)])
    log.append(stream, good, t0)
    checkpoints = tmp_path / "checkpoints"
    assert initial_offsets(checkpoints) == {}  # nothing pinned before the query's first start

    def start() -> dict:
        reader = SketchboardLogReader(source_options(tmp_path / "log.db", catalog, 1_000, 1_000,
                                                     checkpoint_dir=str(checkpoints)))
        try:
            return reader.initialOffset()
        finally:
            reader.stop()

    first = start()
    pinned = initial_offsets(checkpoints)
    assert pinned == {name: {int(p): o for p, o in parts.items()} for name, parts in first.items()}
    assert pinned["orders"] == {p: o.start for p, o in log.offsets("orders").items()}
    end = {name: {p: o.end for p, o in log.offsets(name).items()} for name in pinned}
    assert rows_at_most(pinned, end) == 40
    log.apply_retention(t0 + 10**9, max_age_ms=1, max_bytes_per_partition=10**9)  # every segment too old
    assert {p: o.start for p, o in log.offsets("orders").items()} != pinned["orders"]
    assert start() == first  # pinned: Spark asks again at each start until its offset log has batch 0
    log.close()


def test_the_driver_holds_every_batch_on_a_local_master_and_small_ones_on_a_cluster_unless_set():
    from aggregates.pipeline import CLUSTER_DRIVER_BATCH_ROWS, driver_rows_limit

    for master in ("local", "local[2]", "local[*]"):
        assert driver_rows_limit(None, master, 1_000_000) == 1_000_000
    for master in ("spark://10.0.0.5:7077", "local-cluster[2,1,1024]", "yarn"):
        assert driver_rows_limit(None, master, 1_000_000) == CLUSTER_DRIVER_BATCH_ROWS == 50_000
    assert driver_rows_limit(0, "local[2]", 1_000_000) == 0  # set: every batch through Spark
    assert driver_rows_limit(5_000, "spark://h:7077", 1_000_000) == 5_000
