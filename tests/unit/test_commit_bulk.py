"""The cheaper commit (issue 27): the faster encodings write the same text as before, tier
deltas derived with each dimension combination projected once equal a direct roll-up of the
panes, a bulk-written batch reports the change numbers it wrote, and SQLite's panes keep
their key once (WITHOUT ROWID) while files made with the old layout still work."""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore, ValueStats
from store.panes import dims_key
from store.row_codec import array_stats, stats_text
from store.tiers import ALL_DIMS, TierLayout, project, tier_deltas

PANE = 10_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
LAYOUT = TierLayout(PANE, 86_400_000, ((60_000, 86_400_000), (600_000, 86_400_000)), ("", "a", "a,b", "c"))

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
floats = st.floats(allow_nan=True, allow_infinity=True)


@given(st.dictionaries(texts, texts, max_size=5))
def test_dims_key_writes_what_json_dumps_wrote(dims):
    assert dims_key(dims) == json.dumps(dict(sorted(dims.items())), separators=(",", ":"), ensure_ascii=False)


@given(st.dictionaries(texts, st.tuples(st.integers(0, 10**9), floats, st.none() | floats, st.none() | floats),
                       max_size=4))
@example({"n": (0, 0.0, None, None)})  # a field named like the old layout's first key (found by Hypothesis)
def test_stats_text_writes_what_json_dumps_wrote(values):
    data = PaneData(1, {name: ValueStats(n, total, lo, hi) for name, (n, total, lo, hi) in values.items()})
    arrays = {name: [v.n, _stored(v.sum), _stored(v.min), _stored(v.max)] for name, v in sorted(data.values.items())}
    assert stats_text(data) == json.dumps(arrays, separators=(",", ":"))
    # A store of before held {field: {n, sum, min, max}}: its migration writes the same text (the
    # numbers as they were: an infinite one was unreadable there already, as it was before).
    old = json.dumps({name: v.to_json() for name, v in sorted(data.values.items())}, separators=(",", ":"))
    if all(x is None or math.isfinite(x) for v in data.values.values() for x in (v.sum, v.min, v.max)):
        assert array_stats(old) == stats_text(data)


def _stored(x: float | None) -> float | None:
    """What a row's stats hold for a number: JSON has no infinities nor NaN, and neither store's JSON
    functions read them (store/row_codec.py `_number`): the largest double of the sign, or null."""
    if x is None or math.isfinite(x):
        return x
    return None if math.isnan(x) else math.copysign(1.7976931348623157e308, x)


def _pane(dims: dict, values: list[float], users: list[str]) -> PaneData:
    kll, hll = KllSketch(), HllSketch()
    for v in values:
        kll.update(v)
    for u in users:
        hll.update(u)
    stats = {"v": ValueStats(len(values), math.fsum(values), min(values), max(values), kll.to_bytes())} if values else {}
    return PaneData(len(values) or 1, stats, {"u": hll.to_bytes()})


pane_rows = st.lists(st.tuples(
    st.integers(0, 200).map(lambda i: T0 + i * PANE),
    st.fixed_dictionaries({}, optional={"a": st.sampled_from("xy"), "b": st.sampled_from("pq"), "c": st.just("z")}),
    st.lists(st.integers(0, 1000).map(float), max_size=4),
    st.lists(st.sampled_from(["u1", "u2", "u3", "u4"]), max_size=3),
    st.integers(1, 3),
), max_size=40, unique_by=lambda r: (r[0], tuple(sorted(r[1].items()))))


@settings(max_examples=60, deadline=None)
@given(pane_rows)
def test_tier_deltas_equal_a_direct_rollup_of_the_panes(rows):
    panes = [(start, dims, _pane(dims, values, users), revision) for start, dims, values, users, revision in rows]
    deltas = tier_deltas(panes, LAYOUT)
    expected: dict[tuple, list] = defaultdict(list)
    for tier in LAYOUT.tiers():
        for start, dims, data, revision in panes:
            projected = project(dims, tier.proj)
            expected[(tier.granule_ms, tier.proj, start - start % tier.granule_ms, dims_key(projected))].append(
                (projected, data, revision))
    assert {(k.granule_ms, k.proj, k.start_ms, k.dims) for k in deltas} == set(expected)
    for key, delta in deltas.items():
        parts = expected[(key.granule_ms, key.proj, key.start_ms, key.dims)]
        assert dict(delta.dims) == parts[0][0]
        assert delta.data.count == sum(p.count for _, p, _ in parts)
        assert delta.revision == max(r for _, _, r in parts)
        stats = [p.values["v"] for _, p, _ in parts if "v" in p.values]
        if stats:
            got = delta.data.values["v"]
            assert (got.n, got.min, got.max) == (sum(s.n for s in stats), min(s.min for s in stats),
                                                 max(s.max for s in stats))
            assert got.sum == pytest.approx(math.fsum(s.sum for s in stats), rel=1e-12)
            assert KllSketch.from_bytes(got.kll).n == sum(s.n for s in stats)
        else:
            assert "v" not in delta.data.values
        want_users = HllSketch.merge_all([p.distincts["u"] for _, p, _ in parts]).estimate().estimate
        assert HllSketch.from_bytes(delta.data.distincts["u"]).estimate().estimate == want_users
    assert ALL_DIMS in {k.proj for k in deltas} or not panes


def _partials(batch: int, n: int) -> list[PanePartial]:
    out = []
    for i in range(n):
        dims = {"a": "xyz"[i % 3], "b": str(i % 5)}
        start = T0 + (batch * n + i) // 4 * PANE
        out.append(PanePartial("s", start, start + PANE, dims, _pane(dims, [float(i), 2.0 * i], [f"u{i % 7}"])))
    return out


def test_a_bulk_written_batch_reports_the_change_numbers_it_wrote(store_backend):
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    seen = 0
    for batch_id in range(3):
        partials = _partials(batch_id, 30)
        commit = BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                             {"s": max(p.start_ms for p in partials)}, {})
        result = store.commit_batch(commit, lateness_ms={"s": 0}, now_ms=T0)
        changes = [c for c in store.changes_since(seen, limit=10_000) if c.batch_id == batch_id]
        assert len(changes) == len({(p.start_ms, dims_key(p.dims)) for p in partials})
        assert (result.first_change_seq, result.last_change_seq) == (changes[0].seq, changes[-1].seq)
        assert [c.seq for c in changes] == list(range(changes[0].seq, changes[-1].seq + 1))
        seen = changes[-1].seq
    # A batch without partials writes no change.
    empty = store.commit_batch(BatchCommit("main", 3, [], 0, {}, {}), lateness_ms={"s": 0}, now_ms=T0)
    assert (empty.first_change_seq, empty.last_change_seq) == (None, None)


def test_a_commit_loads_and_saves_every_streams_tier_rows_at_once(store_backend, monkeypatch):
    """One load and one save of tier rows a commit, whatever its streams (the demo has six): a
    round of statements per stream was ~20 ms of a PostgreSQL commit. Each stream's rows still
    match its panes, batch after batch."""
    import dataclasses

    from tests.tier_checks import assert_tiers_match_panes

    if store_backend.kind == "postgres":
        import store.postgres.rows as module
        name = "load"
    else:
        import store.sqlite_tiers as module
        name = "load_many"
    loads = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda conn, table, *rest: loads.append(table) or real(conn, table, *rest))
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT, "t": LAYOUT}, now_ms=T0)
    for batch_id in range(3):
        partials = _partials(batch_id, 12)
        partials += [dataclasses.replace(p, stream="t") for p in partials[::2]]
        loads.clear()
        store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                       {"s": T0, "t": T0}, {}), lateness_ms={"s": 0, "t": 0}, now_ms=T0)
        assert loads.count("tier_rows") == 1
    assert assert_tiers_match_panes(store, "s") > 0 and assert_tiers_match_panes(store, "t") > 0


def test_sqlite_stages_only_the_keys_of_streams_and_tiers_with_rows_in_their_span(tmp_path):
    # A backfill into new time (or a fresh store) has none of its keys stored: one probe per
    # stream and tier says so, and the keys are not staged and joined at all.
    from store.sqlite_tiers import PANE_KEY, TIER_KEY, load_many
    from store.stored_spans import in_stored_spans

    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    partials = _partials(0, 30)
    store.commit_batch(BatchCommit("main", 0, partials, sum(p.data.count for p in partials), {"s": T0}, {}),
                       lateness_ms={"s": 0}, now_ms=T0)
    conn = store._conn
    stored = [("s", p.start_ms, dims_key(p.dims)) for p in partials]
    later = [("s", p.start_ms + 86_400_000, dims_key(p.dims)) for p in partials]  # a day on: no rows there
    other = [("t", p.start_ms, dims_key(p.dims)) for p in partials]  # a stream without rows
    assert in_stored_spans(conn.cursor(), "?", "panes", PANE_KEY, later + other) == []
    assert in_stored_spans(conn.cursor(), "?", "panes", PANE_KEY, stored + later + other) == stored
    assert set(load_many(conn, "panes", PANE_KEY, later + stored + other)) == set(stored)
    # A backfill's next batch: its span begins at the last stored pane; only the keys between the
    # first and last stored rows within it (that pane's) can be stored.
    last = max(p.start_ms for p in partials)
    shared = [key for key in stored if key[1] == last]
    nxt = [("s", last + i * 10_000, dims_key(p.dims)) for i, p in enumerate(partials)]
    assert in_stored_spans(conn.cursor(), "?", "panes", PANE_KEY, nxt + shared) == [nxt[0], *shared]
    minute = ("s", 60_000, "a", T0, '{"a":"x"}')
    assert in_stored_spans(conn.cursor(), "?", "tier_rows", TIER_KEY, [minute, ("s", 600_000, "a", T0 + 86_400_000, "{}")]) == [minute]
    store.close()


def _without_rowid(path, table: str) -> bool:
    with sqlite3.connect(path) as conn:
        return bool(conn.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (table,)).fetchone()[0])


def test_sqlite_panes_keep_their_key_once_and_tier_rows_their_sketches_inline(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    store.close()
    assert _without_rowid(tmp_path / "store.db", "panes")
    # Coarse tier rows' sketches are kilobytes: a WITHOUT ROWID b-tree spilled them to overflow pages.
    assert not _without_rowid(tmp_path / "store.db", "tier_rows")
    with sqlite3.connect(tmp_path / "store.db") as conn:
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name IN ('pane_sketches', 'tier_sketches')").fetchall()


OLD_SKETCH_TABLES = """
CREATE TABLE pane_sketches (stream TEXT NOT NULL, start_ms INTEGER NOT NULL, dims TEXT NOT NULL, field TEXT NOT NULL,
    kind TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (stream, start_ms, dims, field, kind));
CREATE TABLE tier_sketches (stream TEXT NOT NULL, granule_ms INTEGER NOT NULL, proj TEXT NOT NULL,
    start_ms INTEGER NOT NULL, dims TEXT NOT NULL, field TEXT NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (stream, granule_ms, proj, start_ms, dims, field, kind));
"""


def test_a_file_with_the_old_rowid_sketch_tables_still_commits_and_reads(tmp_path):
    from tests.unit.test_sketch_rows import OLD_DDL

    path = tmp_path / "store.db"
    with sqlite3.connect(path) as conn:  # the panes and tier rows of then, and the rowid sketch tables of before
        conn.executescript(OLD_DDL["panes"].split(";")[0] + ";" + OLD_DDL["tier_rows"].split(";")[0] + ";"
                           + OLD_SKETCH_TABLES)
    store = SqlitePaneStore(path, synchronous="OFF")
    with sqlite3.connect(path) as conn:  # folded into the rows' sketches column at open
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name = 'pane_sketches'").fetchall()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(2):  # the second batch merges into stored panes and tier rows
        partials = _partials(0, 12)
        store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                       {"s": T0}, {}), lateness_ms={"s": 0}, now_ms=T0)
    panes = store.read_panes("s", T0, T0 + 3_600_000, value_field="v", distinct_field="u", with_sketches=True)
    assert sum(p.data.count for p in panes) == 2 * 12 * 2  # two batches of 12 partials of two values each
    assert sum(KllSketch.from_bytes(p.data.values["v"].kll).n for p in panes) == 2 * 12 * 2
    from tests.tier_checks import assert_tiers_match_panes

    assert assert_tiers_match_panes(store, "s") > 0
    store.close()


@pytest.fixture
def spans_table(store_backend):
    """A table t keyed like the panes on the backend's database, and how to call in_stored_spans
    there (PostgreSQL's probes go in one statement, with the key columns' types: store/postgres/rows.py)."""
    store = store_backend.create()
    if store_backend.kind == "postgres":
        import psycopg

        from store.postgres.rows import _TYPES

        conn = psycopg.connect(store.dsn, autocommit=True)
        placeholder, types = "%s", _TYPES
    else:
        conn, placeholder, types = sqlite3.connect(":memory:"), "?", None
    conn.execute("CREATE TABLE t (stream TEXT, start_ms BIGINT, dims_id BIGINT,"
                 " PRIMARY KEY (stream, start_ms, dims_id))")
    yield conn, placeholder, types
    # The store's schema is handed out again once it is closed (tests/postgres_server.py fresh_dsn
    # empties the store's tables, not this one): a table left here was in the next test's schema.
    conn.execute("DROP TABLE t")
    conn.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from("st"), st.integers(0, 40)), max_size=25, unique=True),
       st.lists(st.tuples(st.sampled_from("stu"), st.integers(0, 40)), max_size=25))
def test_the_keys_that_may_be_stored_hold_every_stored_one_in_order(spans_table, stored, asked):
    # Whatever is stored and asked: every asked key that is stored is kept, in the keys' order,
    # and none outside the stored rows' first and last start within the asked span per stream.
    from store.stored_spans import in_stored_spans

    conn, p, types = spans_table
    conn.execute("DELETE FROM t")
    conn.cursor().executemany(f"INSERT INTO t VALUES ({p}, {p}, 0)", stored)
    keys = [(s, start, 0) for s, start in asked]
    kept = in_stored_spans(conn.cursor(), p, "t", ("stream", "start_ms", "dims_id"), keys, types)
    assert [k for k in keys if k in kept] == kept  # a subsequence, in order
    assert {k for k in keys if k[:2] in set(stored)} <= set(kept)
    for s in "stu":
        mine = [start for stream, start in asked if stream == s]
        inside = [start for stream, start in stored if stream == s and mine and min(mine) <= start <= max(mine)]
        assert all(inside and min(inside) <= k[1] <= max(inside) for k in kept if k[0] == s)
