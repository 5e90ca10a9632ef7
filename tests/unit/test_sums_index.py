"""The SQLite store's exact sums (and a sketch query's fingerprints) read the covering index
`tier_rows_sums`, not the tier rows with their kilobytes of sketches (store/sqlite_tiers.py):
checked on the statements a query really runs, in a new store and in one made before the index."""

from __future__ import annotations

import sqlite3

import pytest

from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore
from store.tiers import TierLayout
from tests.unit.test_dim_sets import to_text_dims

PANE, MINUTE, HOUR = 10_000, 60_000, 3_600_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR
LAYOUT = TierLayout(PANE, 7 * 86_400_000, ((MINUTE, 7 * 86_400_000), (HOUR, 7 * 86_400_000)), ("", "a"))


def plans(store: SqlitePaneStore, **kwargs) -> list[str]:
    """EXPLAIN QUERY PLAN of each statement aggregate_tier runs."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        store.aggregate_tier("s", MINUTE, "", T0, T0 + HOUR, origin_ms=T0, pane_ms=PANE, **kwargs)
    finally:
        store._conn.set_trace_callback(None)
    return [" ".join(row[-1] for row in store._conn.execute("EXPLAIN QUERY PLAN " + sql))
            for sql in statements if sql.lstrip().upper().startswith("SELECT")]


@pytest.mark.parametrize("kwargs", [
    {"bucket_ms": MINUTE},  # one row per bucket: no GROUP BY
    {"bucket_ms": 5 * MINUTE, "value_field": "v"},  # summed per bucket, with a value field's stats
    {"bucket_ms": MINUTE, "group_by": ("a",), "filters": {"a": "x"}},
])
def test_sums_read_the_covering_index(tmp_path, kwargs):
    store = SqlitePaneStore(tmp_path / "store.db")
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    found = plans(store, **kwargs)
    assert found and any("COVERING INDEX tier_rows_sums" in plan for plan in found), found
    store.close()


def test_a_store_of_before_gets_the_index_when_opened(tmp_path):
    SqlitePaneStore(tmp_path / "store.db").close()
    with sqlite3.connect(tmp_path / "store.db") as conn:
        conn.execute("DROP INDEX tier_rows_sums")
    store = SqlitePaneStore(tmp_path / "store.db")
    assert store._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'tier_rows_sums'").fetchone()
    store.close()


def test_the_index_outlives_the_migration_of_a_store_with_text_dimensions(tmp_path):
    """A store whose rows held their dimensions as text is rebuilt at open (store/dims_migration.py),
    tier_rows with it: the index is made after that, over the migrated rows."""
    store = SqlitePaneStore(tmp_path / "store.db")
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    partials = [PanePartial("s", T0 + i * PANE, T0 + (i + 1) * PANE, {"a": a}, PaneData(1 + i, {}, {}))
                for i in range(12) for a in ("x", "y")]
    store.commit_batch(BatchCommit("main", 0, partials, len(partials), {"s": T0}, {}), lateness_ms={"s": 0},
                       now_ms=T0)
    before = store.aggregate_tier("s", MINUTE, "", T0, T0 + HOUR, origin_ms=T0, bucket_ms=MINUTE, pane_ms=PANE)
    assert sum(b.count for b in before) == 2 * sum(range(1, 13))  # the minute rows hold every event
    to_text_dims(store, "sqlite")
    store.close()
    with sqlite3.connect(tmp_path / "store.db") as conn:
        assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'tier_rows_sums'").fetchone()
    store = SqlitePaneStore(tmp_path / "store.db")
    found = plans(store, bucket_ms=MINUTE)
    assert any("COVERING INDEX tier_rows_sums" in plan for plan in found), found
    assert store.aggregate_tier("s", MINUTE, "", T0, T0 + HOUR, origin_ms=T0, bucket_ms=MINUTE,
                                pane_ms=PANE) == before
    store.close()
