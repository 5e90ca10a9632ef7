"""Whether a batch is small enough for the driver (aggregates/driver_batch.py) is judged from its
offsets before it is read: an upper bound of its records, or None when a start is unknown."""

from aggregates.driver_batch import rows_at_most


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
