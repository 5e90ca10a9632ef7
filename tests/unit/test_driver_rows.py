"""The projections of a small batch collected once (aggregates/driver_rows.py), on a hand-made keyed
table: merged records drop dead letters and other streams, keep the order; the Arrow group-by's
input renames the grouping dims; miss counts skip dead letters and nulls.
(tests/spark/test_driver_batch.py checks each projection against Spark's own collect.)"""

from __future__ import annotations

import pyarrow as pa

from aggregates.driver_rows import DriverRows
from aggregates.partials import ARROW_INPUT_COLUMNS

DIMS = pa.list_(pa.string())
RECORD = pa.struct([("partition", pa.int32()), ("offset", pa.int64()), ("dims", DIMS)])


def keyed() -> pa.Table:
    dims = pa.array([["a", ""], ["b", ""], ["c", ""], ["d", ""]], DIMS)
    dead = pa.array([None, "beyond_retention", None, None], pa.string())
    return pa.table({
        "stream": pa.array(["http", "http", "orders", "http"]),
        "partition": pa.array([0, 1, 0, 1], pa.int32()),
        "offset": pa.array([10, 11, 12, 13], pa.int64()),
        "event_time": pa.array([1, 2, 3, 4], pa.int64()),
        "dims": dims, "vals": pa.array([[1.0], [2.0], [3.0], [4.0]]), "ids": pa.array([["u1"], ["u2"], ["u3"], ["u4"]]),
        "clock_correction": pa.array([None] * 4, pa.int64()),
        "dead_reason": dead,
        "pane_start": pa.array([0, None, 0, 0], pa.int64()),
        "g_dims": pa.array([["a", ""], None, ["c", ""], ["d", ""]], DIMS),
        "dead_record": pa.array([None, {"partition": 1, "offset": 11, "dims": ["b", ""]}, None, None], RECORD),
        "miss": pa.array([True, True, None, False]),
    })


def rows(table: pa.Table) -> DriverRows:
    made = DriverRows(None, None, 0)
    made.__dict__["table"] = table  # the collect's result, as keyed_on_driver gives it
    return made


def test_merged_records_are_the_streams_rows_that_are_not_dead_letters_in_order():
    got = rows(keyed()).merged(["http"], ["offset", "dims"])
    assert got.to_pydict() == {"offset": [10, 13], "dims": [["a", ""], ["d", ""]]}
    assert rows(keyed()).merged(["orders", "http"], ["offset"]).column("offset").to_pylist() == [10, 12, 13]
    assert rows(keyed()).merged([], ["offset"]).num_rows == 0


def test_the_arrow_inputs_dims_are_the_grouping_dims_and_misses_count_merged_rows_only():
    table = rows(keyed()).arrow_input()
    assert table.column_names == list(ARROW_INPUT_COLUMNS)
    assert table.column("dims").to_pylist() == [["a", ""], None, ["c", ""], ["d", ""]]
    assert rows(keyed()).true_counts(["miss"]) == {"miss": 1}  # the dead row's true and the null count none

