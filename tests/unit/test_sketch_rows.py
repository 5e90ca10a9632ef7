"""One stored row per pane and per tier row, with all its sketches (issue 27: disk and commit):
the sketches blob round-trips, and a store written in the old layout (one pane_sketches or
tier_sketches row per (field, kind), made here by the old DDL) is migrated when it is opened,
on SQLite and PostgreSQL, reading what it read before and taking new batches."""

from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import BatchCommit, PaneData, ValueStats
from store.row_codec import HLL, KLL, NO_SKETCHES, encode_sketches, load_data, sketches_blob, stats_text, unpack_sketches
from store.tables import TEXT_DIMS_TABLES, table_ddl
from tests.tier_checks import assert_tiers_match_panes
from tests.unit.test_commit_bulk import LAYOUT, T0, _partials

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
blobs = st.binary(max_size=300)


@given(st.dictionaries(st.tuples(names, st.sampled_from([KLL, HLL])), blobs, max_size=6))
def test_the_sketches_blob_gives_back_every_sketch(sketches):
    triples = [(name, kind, blob) for (name, kind), blob in sketches.items()]
    assert list(unpack_sketches(encode_sketches(triples))) == triples


@given(st.dictionaries(names, st.none() | blobs, max_size=3), st.dictionaries(names, st.none() | blobs, max_size=3))
def test_a_rows_sketches_blob_loads_back_into_its_data(klls, hlls):
    data = PaneData(3, {name: ValueStats(1, 2.0, 2.0, 2.0, kll) for name, kll in klls.items()}, hlls)
    back = load_data(3, stats_text(data), sketches_blob(data))
    assert back == PaneData(3, data.values, {name: h for name, h in hlls.items() if h is not None})


def test_an_empty_or_unknown_blob():
    assert list(unpack_sketches(NO_SKETCHES)) == [] == list(unpack_sketches(b""))
    with pytest.raises(ValueError, match="version 2"):
        list(unpack_sketches(b"\x02k"))


# The tables as stores made before this change created them (store/tables.py then).
OLD_DDL = {
    "panes": """CREATE TABLE panes (stream TEXT NOT NULL, start_ms INTEGER NOT NULL, dims TEXT NOT NULL,
        end_ms INTEGER NOT NULL, count INTEGER NOT NULL, stats TEXT NOT NULL, revision INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL, last_batch INTEGER NOT NULL, PRIMARY KEY (stream, start_ms, dims)) WITHOUT ROWID;
    CREATE TABLE pane_sketches (stream TEXT NOT NULL, start_ms INTEGER NOT NULL, dims TEXT NOT NULL, field TEXT NOT NULL,
        kind TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (stream, start_ms, dims, field, kind)) WITHOUT ROWID;""",
    "tier_rows": """CREATE TABLE tier_rows (stream TEXT NOT NULL, granule_ms INTEGER NOT NULL, proj TEXT NOT NULL,
        start_ms INTEGER NOT NULL, dims TEXT NOT NULL, end_ms INTEGER NOT NULL, count INTEGER NOT NULL,
        stats TEXT NOT NULL, revision INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, last_batch INTEGER NOT NULL,
        PRIMARY KEY (stream, granule_ms, proj, start_ms, dims)) WITHOUT ROWID;
    CREATE TABLE tier_sketches (stream TEXT NOT NULL, granule_ms INTEGER NOT NULL, proj TEXT NOT NULL,
        start_ms INTEGER NOT NULL, dims TEXT NOT NULL, field TEXT NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL,
        PRIMARY KEY (stream, granule_ms, proj, start_ms, dims, field, kind)) WITHOUT ROWID;""",
}
KEYS = {"panes": ("stream", "start_ms", "dims"), "tier_rows": ("stream", "granule_ms", "proj", "start_ms", "dims")}


def _to_old_layout(store, kind: str) -> None:
    """Rewrite a store's panes and tier rows as the old layout held them: each table dropped
    and made again by its old DDL, its sketches one row each in the old sketch table (the
    dimensions as text, as then: tests/unit/test_dim_sets.py to_text_dims first)."""
    from store.postgres.schema import translate_ddl
    from tests.unit.test_dim_sets import to_text_dims

    to_text_dims(store, kind)
    db = store.side_db()
    with db.transaction():
        for table, key in KEYS.items():
            rows = db.execute(f"SELECT * FROM {table}").fetchall()
            columns = [c for c in _columns(table) if c != "sketches"]
            db.execute(f"DROP TABLE {table}")
            for statement in OLD_DDL[table].split(";")[:2]:
                db.execute(translate_ddl(statement) if kind == "postgres" else statement)
            sketch_table = "pane_sketches" if table == "panes" else "tier_sketches"
            at = {c: i for i, c in enumerate(_columns(table))}
            db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                           [[row[at[c]] for c in columns] for row in rows])
            db.executemany(f"INSERT INTO {sketch_table} ({', '.join(key)}, field, kind, data)"
                           f" VALUES ({', '.join('?' * (len(key) + 3))})",
                           [(*(row[at[c]] for c in key), *sketch) for row in rows
                            for sketch in unpack_sketches(row[at["sketches"]])])
    db.close()


def _columns(table: str) -> list[str]:
    """The columns of `table` as the store of before the dimensions were numbered (TEXT_DIMS_TABLES) made it, in order."""
    ddl = table_ddl(table, TEXT_DIMS_TABLES)
    body = ddl[ddl.index("(") + 1:ddl.index("PRIMARY KEY")]
    return [part.split()[0] for part in body.split(",") if part.strip()]


def _everything(store) -> tuple:
    panes = store.read_panes("s", -2**62, 2**62, value_field="v", distinct_field="u", with_sketches=True)
    tiers = [store.read_tier("s", t.granule_ms, t.proj, -2**62, 2**62, value_field="v", distinct_field="u",
                             with_sketches=True, pane_ms=LAYOUT.pane_ms) for t in LAYOUT.tiers()]
    only_kll = store.read_tier("s", 60_000, "", -2**62, 2**62, value_field="v", with_sketches=True, with_stats=False)
    # In key order: a table the migration rewrote may give rows of one start in another order
    # (PostgreSQL's UPDATE moves them), which no reader relies on.
    return sorted(panes, key=repr), [sorted(rows, key=repr) for rows in tiers], sorted(only_kll, key=repr)


def _commit(store, batch_id: int) -> None:
    partials = _partials(batch_id, 24)
    store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                   {"s": max(p.start_ms for p in partials)}, {}), lateness_ms={"s": 0}, now_ms=T0)


def test_a_store_in_the_old_layout_is_migrated_when_opened(store_backend):
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(3):
        _commit(store, batch_id)
    before = _everything(store)
    assert sum(len(rows) for rows in before[1]) > 0 and any(p.data.distincts for p in before[0])
    _to_old_layout(store, store_backend.kind)
    store.close()

    migrated = store_backend.reopen(store)
    assert _everything(migrated) == before
    # The old sketch tables are gone, and the store takes a batch merging into migrated rows.
    with pytest.raises(Exception):
        store_backend.tables(migrated, ("pane_sketches",))
    _commit(migrated, 3)
    _commit(migrated, 1)  # a replay: skipped
    assert assert_tiers_match_panes(migrated, "s") > 0
    panes = migrated.read_panes("s", -2**62, 2**62, value_field="v", with_sketches=True)
    assert sum(p.data.count for p in panes) == 4 * 24 * 2
    assert all(p.data.values["v"].kll is not None for p in panes)
    assert store_backend.reopen(migrated) is not None  # opening a migrated store again changes nothing
