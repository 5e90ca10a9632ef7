"""Definition versions (catalog/versions.py): what changes a stream's version and what does not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import Catalog
from catalog.model import StreamDef
from catalog.versions import (
    catalog_versions,
    definition_version,
    shaping_definition,
    short_version,
    stream_document,
    versioned_streams,
)

BASE = {"name": "http", "key_field": "user", "dimensions": ["endpoint", "region", "status"],
        "values": ["latency_ms", "bytes"], "distinct": ["user", "session"]}


def version(**changes) -> str:
    return definition_version(StreamDef(**{**BASE, **changes}))


def test_the_version_is_a_stable_sha256():
    v = version()
    assert len(v) == 64 and int(v, 16) >= 0
    assert v == version()  # same input, same hash, in any process (no Python hash())
    assert short_version(v) == v[:8]


@given(st.permutations(BASE["dimensions"]), st.permutations(BASE["values"]), st.permutations(BASE["distinct"]))
def test_order_of_dimensions_values_and_distinct_does_not_matter(dims, values, distinct):
    assert version(dimensions=dims, values=values, distinct=distinct) == version()


@pytest.mark.parametrize("changes", [
    {"dimensions": ["endpoint", "region", "status", "country"]},
    {"dimensions": ["endpoint", "region"]},
    {"values": ["latency_ms"]},
    {"distinct": ["user"]},
    {"distinct": None},  # the key alone
    {"time_field": "ts"},
    {"pane": "1m"},
    {"allowed_lateness": "1m"},
    {"retention": "1d"},
    {"max_future_skew": "1m"},
    {"first_seen": {"field": "user"}},
    {"membership": {"field": "user"}},
    {"sessions": {"key": "user"}},
    {"event_id_field": "request_id"},
    {"sent_time_field": "sent_at"},
])
def test_a_shaping_field_changes_the_version(changes):
    assert version(**changes) != version()


def test_feature_parameters_and_clock_settings_count():
    assert version(first_seen={"field": "user", "fpp": 0.02}) != version(first_seen={"field": "user"})
    assert version(sessions={"key": "user", "gap": "10m"}) != version(sessions={"key": "user"})
    assert (version(event_id_field="request_id", dedup_window="2h")
            != version(event_id_field="request_id"))
    clock = {"sent_time_field": "sent_at"}
    assert version(**clock, clock_tolerance="5s") != version(**clock)
    assert version(**clock, clock_window="1h") != version(**clock)
    assert version(**clock, device_field="session") != version(**clock)  # whose clock: the key by default


@pytest.mark.parametrize("changes", [
    {"description": "requests served"},
    {"partitions": 8},
    {"partition_idle_timeout": "1m"},
    {"tiers": [{"every": "1m"}]},  # rebuilt from the panes when they change
    {"tiers": []},
    {"rollup_group_bys": [["endpoint"]]},
])
def test_fields_that_do_not_shape_panes_leave_the_version(changes):
    assert version(**changes) == version()


def test_defaults_written_out_are_the_same_definition():
    assert version(pane="10s", allowed_lateness="30s", time_field="time") == version()
    # distinct left out means the key: written out, the same panes
    assert (definition_version(StreamDef(name="s", key_field="user"))
            == definition_version(StreamDef(name="s", key_field="user", distinct=["user"])))
    assert (version(event_id_field="request_id", dedup_window="1h")
            == version(event_id_field="request_id"))


def test_the_shaping_definition_is_plain_json():
    import json

    doc = shaping_definition(StreamDef(**BASE, first_seen={"field": "user"}))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["dimensions"] == ["endpoint", "region", "status"] and doc["pane_ms"] == 10_000


def test_derived_streams_have_no_version_of_their_own_and_metrics_do_not_count():
    base = {"streams": {"http": {**BASE, "sessions": {"key": "user"}}},
            "metrics": {"latency": {"stream": "http", "value": "latency_ms"}}}
    catalog = Catalog(**base)
    assert "http_sessions" in catalog.streams and list(versioned_streams(catalog)) == ["http"]
    more_metrics = Catalog(**{**base, "metrics": {**base["metrics"], "bytes": {"stream": "http", "value": "bytes"}}})
    assert catalog_versions(catalog) == catalog_versions(more_metrics)


def test_the_stored_document_rebuilds_the_same_definition():
    stream = StreamDef(**BASE, pane="1m", first_seen={"field": "user"}, sent_time_field="sent_at",
                       tiers=[{"every": "1h"}])
    again = StreamDef(**stream_document(stream))
    assert again == stream and definition_version(again) == definition_version(stream)
