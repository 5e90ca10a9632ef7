"""Records a batch's range held but it never read (aggregates/log_gaps.py): on the embedded log,
what retention dropped before the pipeline got to them."""

from aggregates.log_gaps import unread_by_stream
from catalog import Catalog

STREAM = {"key_field": "k", "partitions": 2, "dimensions": ["d"], "tiers": []}
CATALOG = Catalog(streams={"a": STREAM, "b": STREAM,
                           "users": {"kind": "table", "key_field": "k", "partitions": 2, "tiers": []}})


def test_an_event_streams_span_less_what_was_read_is_what_retention_dropped():
    start = {"a": {0: 10, 1: 0}, "b": {0: 5, 1: 5}}
    end = {"a": {0: 30, 1: 10}, "b": {0: 7, 1: 5}}
    assert unread_by_stream(start, end, {"a": 25, "b": 2}, CATALOG) == {"a": 5}
    assert unread_by_stream(start, end, {"a": 30, "b": 2}, CATALOG) == {}  # all read (dead letters count as read)


def test_tables_unknown_starts_and_streams_not_configured_are_not_counted():
    assert unread_by_stream({"users": {0: 0, 1: 0}}, {"users": {0: 50, 1: 50}}, {"users": 3}, CATALOG) == {}  # compacted
    assert unread_by_stream({"a": {0: 0}}, {"a": {0: 9, 1: 4}}, {"a": 0}, CATALOG) == {}  # partition 1 new: span unknown
    assert unread_by_stream({"gone": {0: 0}}, {"gone": {0: 9}}, {}, CATALOG) == {}
    assert unread_by_stream({"a": {0: 9}}, {"a": {0: 4}}, {}, CATALOG) == {}  # an end behind its start spans nothing
