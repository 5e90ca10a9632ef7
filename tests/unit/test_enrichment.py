"""Enrichment (stream-table join) without Spark: the catalog's `enrich` (dimensions, load errors
naming the line, the definition version), the as-of lookup (Hypothesis against a brute force),
and the table versions and misses the store keeps (the `store_backend` fixture: SQLite and a
real PostgreSQL)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Catalog, ConfigError, parse_catalog
from catalog.versions import definition_version, pinned_catalog, stream_document
from sketchboard.reprocess import stream_catalog
from store.base import BatchCommit
from store.table_versions import EnrichmentCommit, TableVersion, as_of, by_key, lookup_time, prunable

T0 = 1_700_000_000_000
CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, country]
    values: [credit]
  http_requests:
    key_field: user_id
    dimensions: [method]
    values: [latency_ms]
    enrich:
      - {table: users, by: user_id, columns: [plan, country]}
metrics:
  requests: {stream: http_requests}
"""


# -- catalog -------------------------------------------------------------------------------------


def test_enriched_columns_are_dimensions_and_survive_a_round_trip():
    catalog = parse_catalog(CONFIG)
    requests = catalog.streams["http_requests"]
    assert requests.dimensions == ("method", "plan", "country")
    assert requests.enriched_dimensions == ("plan", "country")
    assert "user_id" in requests.source_ids
    # A dump leaves the enriched columns out of `dimensions` (they come back from `enrich`).
    assert stream_document(requests)["dimensions"] == ["method"]
    again = Catalog.model_validate_json(catalog.model_dump_json())
    assert again.streams["http_requests"] == requests
    assert pinned_catalog(catalog, {"http_requests": stream_document(requests)}).streams["http_requests"] == requests
    # A reprocessing run of the stream reads the table it is enriched from too.
    run = stream_catalog(catalog, "http_requests")
    assert set(run.streams) == {"http_requests", "users"} and run.streams["http_requests"] == requests


def test_enrichment_counts_in_the_definition_version_and_others_keep_theirs():
    plain = parse_catalog(CONFIG.replace("      - {table: users, by: user_id, columns: [plan, country]}\n", "")
                          .replace("    enrich:\n", ""))
    enriched = parse_catalog(CONFIG)
    one_column = parse_catalog(CONFIG.replace("columns: [plan, country]", "columns: [plan]"))
    versions = {definition_version(c.streams["http_requests"]) for c in (plain, enriched, one_column)}
    assert len(versions) == 3
    assert definition_version(plain.streams["users"]) == definition_version(enriched.streams["users"])
    assert "enrich" not in __import__("catalog.versions").versions.shaping_definition(plain.streams["http_requests"])


@pytest.mark.parametrize(("old", "new", "message"), [
    ("table: users,", "table: nobody,", "line 13: streams.http_requests.enrich.0.table: unknown table 'nobody'"),
    ("table: users,", "table: other,", "stream 'other' is not a table"),
    ("columns: [plan, country]", "columns: [plan, credit]", "line 13: streams.http_requests.enrich.0.columns.1:"
                                                              " 'credit' is not a dimension of table 'users'"),
    ("columns: [plan, country]", "columns: [plan, op]", "'op' is not a dimension of table 'users'"),
    ("columns: [plan, country]", "columns: [plan, method]", "column 'method' clashes with a declared field"),
    ("columns: [plan, country]", "columns: [plan, plan]", "column 'plan' is added twice"),
    ("columns: [plan, country]", "columns: []", "at least 1 item"),
    ("by: user_id", "by: nowhere", "by 'nowhere' must be the key_field, a dimension or a distinct field"),
    ("by: user_id", "by: latency_ms", "by 'latency_ms' must be the key_field"),
    ("columns: [plan, country]}", "columns: [plan], colour: x}", "colour"),
])
def test_bad_enrichments_are_refused_naming_the_line(old, new, message):
    text = CONFIG.replace(old, new) + "  other: {key_field: k, dimensions: [x]}\n"
    with pytest.raises(ConfigError) as err:
        parse_catalog(text.replace("metrics:\n  requests: {stream: http_requests}\n", "")
                      + "metrics:\n  requests: {stream: http_requests}\n")
    assert message in str(err.value)
    assert "line " in str(err.value)


def test_a_table_cannot_be_enriched_a_stream_with_sessions_can():
    with pytest.raises(ConfigError, match="a table .* cannot be enriched"):
        parse_catalog(CONFIG.replace("  http_requests:\n", "  http_requests:\n    kind: table\n")
                      .replace("dimensions: [method]", "dimensions: [method]\n    distinct: [user_id]"))
    # Session streams carry no dimensions of their parent: enrichment does not touch them.
    catalog = parse_catalog(CONFIG.replace("    values: [latency_ms]\n", "    values: [latency_ms]\n"
                                           "    sessions: {key: user_id, gap: 5m}\n"))
    assert catalog.streams["http_requests_sessions"].dimensions == ()


# -- the as-of lookup ----------------------------------------------------------------------------


def test_an_event_sees_the_row_appended_at_or_before_its_time():
    versions = by_key([("u1", TableVersion(T0 + 10, 0, 7, {"plan": "pro"})),
                       ("u1", TableVersion(T0, 0, 3, {"plan": "free"})),
                       ("u1", TableVersion(T0 + 20, 0, 9, None)),
                       ("u1", TableVersion(T0, 0, 3, {"plan": "free"}))])["u1"]  # a replayed copy once
    assert len(versions) == 3
    assert as_of(versions, T0 - 1) is None  # not yet in the table
    assert as_of(versions, T0) == {"plan": "free"}
    assert as_of(versions, T0 + 15) == {"plan": "pro"}
    assert as_of(versions, T0 + 20) is None  # deleted
    # An event stamped ahead of its arrival is looked up at its arrival.
    assert lookup_time(T0 + 60_000, T0 + 5) == T0 + 5 and lookup_time(T0, T0 + 5) == T0


changes = st.lists(st.tuples(st.integers(0, 50), st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))),
                   max_size=30)


@settings(max_examples=200, deadline=None)
@given(changes, st.integers(-5, 60), st.integers(-5, 60))
def test_as_of_is_the_newest_change_at_or_before_the_time_and_pruning_keeps_later_answers(log, at, keep_from):
    # The log order is the offset; append times may repeat (same millisecond) but never go back.
    times = sorted(t for t, _ in log)
    versions = [TableVersion(t, 0, offset, None if v is None else {"plan": v})
                for offset, (t, (_, v)) in enumerate(zip(times, log, strict=True))]
    ordered = by_key(("k", v) for v in reversed(versions)).get("k", [])
    brute = [v for v in versions if v.valid_from_ms <= at]
    expected = brute[-1].row if brute else None
    assert as_of(ordered, at) == expected
    # Versions pruned for `keep_from` change no answer at or after it.
    dropped = {(v.partition, v.offset) for v in prunable(ordered, keep_from)}
    kept = [v for v in ordered if (v.partition, v.offset) not in dropped]
    if at >= keep_from:
        assert as_of(kept, at) == expected


# -- the store -----------------------------------------------------------------------------------


def enrichment(batch_id, versions=(), keep_from=None, misses=None) -> BatchCommit:
    return BatchCommit("main", batch_id, [], 0, enrichment=EnrichmentCommit(
        {"users": list(versions)}, {} if keep_from is None else {"users": keep_from}, misses or {}))


def test_versions_and_misses_are_kept_with_their_batch_exactly_once_and_pruned(store_backend):
    store = store_backend.create()
    v1, v2, v3 = (TableVersion(T0, 1, 5, {"plan": "free"}), TableVersion(T0 + 10, 1, 6, {"plan": "pro"}),
                  TableVersion(T0 + 20, 1, 7, None))
    store.commit_batch(enrichment(0, [("u1", v1), ("u2", TableVersion(T0, 0, 1, {"plan": "x"}))],
                                  misses={("http_requests", "users"): 3}), lateness_ms={}, now_ms=T0)
    store.commit_batch(enrichment(1, [("u1", v2), ("u1", v3), ("u1", v1)],
                                  misses={("http_requests", "users"): 2}), lateness_ms={}, now_ms=T0)
    # A replayed batch id changes nothing.
    assert not store.commit_batch(enrichment(1, [("u9", v1)], misses={("http_requests", "users"): 5}),
                                  lateness_ms={}, now_ms=T0).committed
    assert store.table_versions("users") == [("u1", v1), ("u1", v2), ("u1", v3),
                                             ("u2", TableVersion(T0, 0, 1, {"plan": "x"}))]
    store.commit_batch(enrichment(2, keep_from=T0 + 15), lateness_ms={}, now_ms=T0)
    # u1's first version can answer nothing at or after T0+15; u2's only one still can.
    assert [k for k, _ in store_backend.reopen(store).table_versions("users")] == ["u1", "u1", "u2"]
    assert store.table_versions("other") == []


def test_versions_seeded_from_another_store_are_kept_once_beside_the_batches_own(store_backend):
    """A reprocessing run's output starts with the serving store's versions (sketchboard/reprocess.py
    seed_table_versions: the compacted table log alone lacks the older ones); the run's own batches
    then add the same versions again from the log: each is kept once, as stored."""
    store = store_backend.create()
    v1, v2 = TableVersion(T0, 1, 5, {"plan": "free"}), TableVersion(T0 + 10, 1, 6, {"plan": "pro"})
    store.seed_table_versions({"users": [("u1", v1), ("u1", v2)], "plans": [("p1", TableVersion(T0, 0, 0, None))]})
    store.commit_batch(enrichment(0, [("u1", TableVersion(T0 + 10, 1, 6, {"plan": "changed?"})),
                                      ("u2", TableVersion(T0 + 30, 0, 9, {"plan": "team"}))]),
                       lateness_ms={}, now_ms=T0)
    assert store_backend.reopen(store).table_versions("users") == [
        ("u1", v1), ("u1", v2), ("u2", TableVersion(T0 + 30, 0, 9, {"plan": "team"}))]
    assert store.table_versions("plans") == [("p1", TableVersion(T0, 0, 0, None))]


SKEW_CONFIG = """
streams:
  users: {kind: table, key_field: user_id, dimensions: [plan]}
  http_requests:
    key_field: user_id
    dimensions: [method]
    retention: 1h
    enrich:
      - {table: users, by: user_id, columns: [plan]}
metrics:
  requests: {stream: http_requests}
"""


def committed_on_driver(enrichment, store, batch_id: int, rows: list[dict], now_ms: int):
    """`rows` (source rows) enriched as a batch held on the driver, committed, and the kept
    versions told: what the pipeline does with each batch."""
    import pyarrow as pa

    from ingest.source_rows import SOURCE_SCHEMA

    out = enrichment.process(pa.Table.from_pylist(rows, schema=SOURCE_SCHEMA), now_ms,
                             store.last_batch_id("main"), on_driver=True, streams={r["stream"] for r in rows})
    commit = BatchCommit("main", batch_id, [], len(rows), batch_now_ms=now_ms, enrichment=out.commit)
    assert store.commit_batch(commit, lateness_ms={}, now_ms=now_ms).committed
    enrichment.committed(batch_id, out)
    return out


def test_pruning_keeps_the_versions_a_future_stamped_event_within_retention_looks_up(tmp_path):
    """An event stamped up to max_future_skew (5 m) ahead of its append is accepted while its event
    time is within retention, and is looked up at its append time. Pruning kept only what lookups
    at now - retention need, so a reprocess (seeded with the store's versions: the table's log is
    compacted) enriched it with nothing where the live run had found the older row."""
    from aggregates.enrichment import Enrichment
    from store import SqlitePaneStore

    t0, minute = 1_700_000_000_000, 60_000
    catalog = parse_catalog(SKEW_CONFIG)
    store = SqlitePaneStore(tmp_path / "store.db")
    enrichment = Enrichment(None, catalog, store)

    def rec(stream, offset, event_time, ingest_time, dims, ids):
        return dict(stream=stream, partition=0, offset=offset, event_time=event_time, ingest_time=ingest_time,
                    dims=dims, vals=[], ids=ids, error=None, error_kind=None, sent_time=None, device=None)

    def batch(batch_id, rows, now_ms):
        return committed_on_driver(enrichment, store, batch_id, rows, now_ms)

    free = rec("users", 0, t0, t0, ["upsert", "free"], ["u1"])
    late_stamped = rec("http_requests", 0, t0 + 4 * minute, t0 + minute, ["GET", "x"], ["u1"])  # 3 m ahead
    assert batch(0, [free, late_stamped], t0 + minute + 10).batch.column("dims").to_pylist()[1] == ["GET", "free"]
    batch(1, [rec("users", 1, t0 + 2 * minute, t0 + 2 * minute, ["upsert", "pro"], ["u1"])], t0 + 2 * minute + 10)
    # An hour on (t0 + 63 m): the event's time (t0 + 4 m) is still within retention, its lookup
    # time (t0 + 1 m) is before now - retention (t0 + 3 m), and its version is the free one.
    batch(2, [rec("users", 2, t0 + 63 * minute, t0 + 63 * minute, ["upsert", "gold"], ["u2"])], t0 + 63 * minute)
    kept = [(version.valid_from_ms - t0, version.row["plan"]) for key, version in store.table_versions("users")
            if key == "u1"]
    assert (0, "free") in kept


def test_a_key_the_batch_changes_is_looked_up_with_its_new_version_not_the_kept_columns(tmp_path, monkeypatch):
    """The kept single-version columns hold u1's first row; a later batch changes u1 and has an event
    after the change: it gets the batch's new row (the batch's changed keys are not taken from the
    columns, aggregates/enrichment.py), and the next batch's event too (u1 went stale there)."""
    from aggregates.enrichment import Enrichment
    from store import SqlitePaneStore, table_versions

    monkeypatch.setattr(table_versions, "SINGLES_FROM_KEYS", 0)  # the columns for batches of any size
    monkeypatch.setattr(table_versions, "SINGLES_TABLE_PER_KEY", 10**9)
    t0, minute = 1_700_000_000_000, 60_000
    catalog = parse_catalog(SKEW_CONFIG)
    store = SqlitePaneStore(tmp_path / "store.db")
    enrichment = Enrichment(None, catalog, store)

    def rec(stream, offset, at, dims, ids):
        return dict(stream=stream, partition=0, offset=offset, event_time=at, ingest_time=at,
                    dims=dims, vals=[], ids=ids, error=None, error_kind=None, sent_time=None, device=None)

    def plans(batch_id, rows, now_ms):
        out = committed_on_driver(enrichment, store, batch_id, rows, now_ms)
        return [dims[1] for stream, dims in zip(out.batch.column("stream").to_pylist(),
                                                 out.batch.column("dims").to_pylist()) if stream == "http_requests"]

    assert plans(0, [rec("users", 0, t0, ["upsert", "free"], ["u1"])], t0 + 10) == []
    assert plans(1, [rec("http_requests", 0, t0 + minute, ["GET", ""], ["u1"])], t0 + minute + 10) == ["free"]
    held, _ = enrichment.kept.singles("users", asked=1)
    assert held.keys.to_pylist() == ["u1"]  # the columns were made, holding u1's free row
    assert plans(2, [rec("users", 1, t0 + 2 * minute, ["upsert", "pro"], ["u1"]),
                     rec("http_requests", 1, t0 + 3 * minute, ["GET", ""], ["u1"])], t0 + 3 * minute + 10) == ["pro"]
    assert plans(3, [rec("http_requests", 2, t0 + 4 * minute, ["GET", ""], ["u1"])], t0 + 4 * minute + 10) == ["pro"]
