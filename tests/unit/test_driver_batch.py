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
