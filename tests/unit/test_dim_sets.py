"""Dimension combinations numbered per stream (store/dim_sets.py) and stats as arrays
(store/row_codec.py), issue 27's disk bar: rows keep a number instead of ~100 bytes of JSON
text. A store written in the layout of before (dimensions as text in every pane, tier and change
row; stats as {field: {n, sum, min, max}}; made here by the old DDL) is migrated when it is
opened, on SQLite and PostgreSQL, reading what it read before and taking new batches."""

from __future__ import annotations

import json

import pytest

from store import BatchCommit, PanePartial
from store import dim_sets, dims_migration
from store.panes import dims_key
from store.tables import TEXT_DIMS_TABLES, table_ddl
from tests.tier_checks import assert_tiers_match_panes
from tests.unit.test_commit_bulk import LAYOUT, PANE, T0, _pane, _partials


def to_text_dims(store, kind: str, tables=tuple(dims_migration.TABLES)) -> None:
    """Rewrite a store's panes, tier rows and change records (or some of them) as a store of
    before held them: each table dropped and made again by its old DDL (TEXT_DIMS_TABLES), every
    row with its dimensions' text and its stats as objects; dim_sets emptied when all are."""
    from store.postgres.schema import translate_ddl

    db = store.side_db()
    with db.transaction():
        for table in tables:
            columns = dims_migration.TABLES[table]
            rows = db.execute(f"SELECT {', '.join(f't.{c}' for c in columns)}, COALESCE(d.dims, t.dims_id || '')"
                              f" FROM {table} t LEFT JOIN dim_sets d ON d.stream = t.stream AND d.id = t.dims_id"
                              ).fetchall()
            if table == "changes":  # a switch's record keeps its text
                texts = dict(db.execute("SELECT seq, dims FROM changes WHERE dims IS NOT NULL").fetchall())
                rows = [(*row[:-1], texts.get(row[0], row[-1])) for row in rows]
            db.execute(f"DROP TABLE {table}")
            ddl = table_ddl(table, TEXT_DIMS_TABLES)
            db.execute(translate_ddl(ddl) if kind == "postgres" else ddl)
            at = columns.index("stats") if "stats" in columns else None
            old = [[*row] for row in rows]
            if at is not None:
                for row in old:
                    row[at] = json.dumps({name: dict(zip(("n", "sum", "min", "max"), v))
                                          for name, v in json.loads(row[at]).items()}, separators=(",", ":"))
            db.executemany(f"INSERT INTO {table} ({', '.join(columns)}, dims) VALUES ({', '.join('?' * (len(columns) + 1))})",
                           old)
        if len(tables) == len(dims_migration.TABLES):
            db.execute("DELETE FROM dim_sets")
    db.close()


def _everything(store) -> tuple:
    panes = store.read_panes("s", -2**62, 2**62, value_field="v", distinct_field="u", with_sketches=True)
    tiers = [store.read_tier("s", t.granule_ms, t.proj, -2**62, 2**62, value_field="v", distinct_field="u",
                             with_sketches=True, pane_ms=LAYOUT.pane_ms) for t in LAYOUT.tiers()]
    sums = [store.aggregate_tier("s", t.granule_ms, t.proj, -2**62, 2**62, origin_ms=0, bucket_ms=3_600_000,
                                 group_by=["a"], filters={"b": "1"}, value_field="v", pane_ms=LAYOUT.pane_ms)
            for t in LAYOUT.tiers() if t.proj in ("*", "a,b")]
    newest = store.newest_pane_ends("s", -2**62, 2**62)
    # In key order: rows of one start may come in another order after a rebuild, which no reader relies on.
    return (sorted(panes, key=repr), [sorted(rows, key=repr) for rows in tiers], [sorted(s) for s in sums],
            sorted(newest, key=repr), store.changes_since(0, limit=10_000))


def _commit(store, batch_id: int) -> None:
    partials = _partials(batch_id, 24)
    store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                   {"s": max(p.start_ms for p in partials)}, {}), lateness_ms={"s": 0}, now_ms=T0)


def test_rows_keep_a_number_for_their_dimensions(store_backend):
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(2):
        _commit(store, batch_id)
    tables = store_backend.tables(store, ("dim_sets", "panes", "changes"))
    texts = {text for _, _, text in tables["dim_sets"]}
    assert {p.key.dims for p in store.read_panes("s", -2**62, 2**62)} <= texts
    assert sorted(number for _, number, _ in tables["dim_sets"]) == list(range(1, len(texts) + 1))
    assert all(isinstance(cell, int) for row in tables["panes"] for cell in row[1:3])  # start, number


def test_a_store_with_text_dimensions_is_migrated_when_opened(store_backend):
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(3):
        _commit(store, batch_id)
    db = store.side_db()  # a switch's record, its text in the row (store/switch.py)
    db.execute("INSERT INTO changes (stream, start_ms, dims, revision, batch_id, count_added, at_ms)"
               " VALUES ('s', 0, '{}', -1, -1, 0, 1)")
    db.close()
    before = _everything(store)
    assert sum(len(rows) for rows in before[1]) > 0 and before[2][0] and before[4][-1].revision == -1
    to_text_dims(store, store_backend.kind)
    store.close()

    migrated = store_backend.reopen(store)
    assert _everything(migrated) == before
    assert store_backend.tables(migrated, ("dim_sets",))["dim_sets"]
    if store_backend.kind == "postgres":  # the tables the migration made anew compress with lz4 too
        from tests.unit.test_postgres_row_storage import _compression

        assert set(_compression(migrated.dsn).values()) == {"l"}
    _commit(migrated, 3)
    _commit(migrated, 1)  # a replay: skipped
    assert assert_tiers_match_panes(migrated, "s") > 0
    changes = migrated.changes_since(0, limit=10_000)
    assert changes[:len(before[4])] == before[4] and changes[-1].seq > before[4][-1].seq  # numbered on
    panes = migrated.read_panes("s", -2**62, 2**62, value_field="v", with_sketches=True)
    assert sum(p.data.count for p in panes) == 4 * 24 * 2
    assert store_backend.reopen(migrated) is not None  # opening a migrated store again changes nothing


def test_a_store_with_only_its_change_feed_in_text_is_migrated_too(store_backend):
    """A store of long ago lacked panes and tier rows: made new at open, beside an old change feed."""
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    _commit(store, 0)
    before = _everything(store)
    to_text_dims(store, store_backend.kind, ("changes",))
    store.close()
    migrated = store_backend.reopen(store)
    assert _everything(migrated) == before
    _commit(migrated, 1)
    assert [c.batch_id for c in migrated.changes_since(before[4][-1].seq)] == [1] * 24
    texts = [text for _, _, text in store_backend.tables(migrated, ("dim_sets",))["dim_sets"]]
    assert len(texts) == len(set(texts))  # each combination numbered once


def test_combinations_past_an_index_entrys_size_are_numbered_once(store_backend):
    """Labels are at most 1 024 characters, but a combination's text can be ~3 000 bytes and more
    (long random CJK or several long labels): past the ~2 700 bytes of a PostgreSQL B-tree entry,
    the unique index on the text refused its insert, and a batch holding one failed at every
    replay. Indexed by a hash index there, it is numbered once and read back whole."""
    import random

    rng = random.Random(57)
    cjk = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(1024))  # ~3 072 bytes of UTF-8
    ascii_ = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789/") for _ in range(1024)) for _ in range(3)]
    combos = [{"a": cjk, "b": "1"}, {"a": ascii_[0], "b": ascii_[1], "c": ascii_[2]}, {"a": "x", "b": "2"}]
    store = store_backend.create()
    # A store of before held the unique index on the text: opening it again drops it on PostgreSQL.
    store.side_db().execute("CREATE UNIQUE INDEX IF NOT EXISTS dim_sets_by_text ON dim_sets (stream, dims)")
    store = store_backend.reopen(store)
    _commit_numbered_once(store_backend, store, combos, batches=2)


def _commit_numbered_once(store_backend, store, combos: list[dict], batches: int) -> None:
    """A pane of each combination in each of `batches` batches (the later ones find the first
    one's numbers): every pane reads back its combination, and each text is numbered once."""
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(batches):
        partials = [PanePartial("s", T0 + batch_id * PANE, T0 + (batch_id + 1) * PANE, dims,
                                _pane(dims, [1.0], ["u1"])) for dims in combos]
        store.commit_batch(BatchCommit("main", batch_id, partials, len(partials), {"s": T0 + batch_id * PANE}, {}),
                           lateness_ms={"s": 0}, now_ms=T0)
    panes = store.read_panes("s", -2**62, 2**62)
    assert sorted(p.key.dims for p in panes) == sorted([dims_key(d) for d in combos] * batches)
    texts = [text for _, _, text in store_backend.tables(store, ("dim_sets",))["dim_sets"]]  # the tiers' too
    assert len(texts) == len(set(texts)) and {dims_key(d) for d in combos} <= set(texts)


def test_combinations_with_quotes_backslashes_and_braces_are_numbered_once(store_backend):
    """PostgreSQL looks a batch's texts up as one text array sent in binary (store/dim_sets.py):
    JSON texts full of quotes, and labels with backslashes, braces, commas and non-ASCII (what an
    array literal in text format escapes), come back the same and keep their number batch after batch."""
    combos = [{"a": 'say "hi", {x}', "b": "1"}, {"a": "back\\slash\\\\", "b": "NULL"}, {"a": "ünï ☃ {}", "b": ","},
              {"a": "", "b": " "}]
    store = store_backend.create()
    _commit_numbered_once(store_backend, store, combos, batches=3)
    # The minute's rows, which every batch merges into (the 10 min rows are folded: store/tier_folds.py).
    minutes = store.read_tier("s", 60_000, "*", -2**62, 2**62, pane_ms=LAYOUT.pane_ms)
    assert sorted(r.key.dims for r in minutes) == sorted(dims_key(d) for d in combos)
    assert all(r.data.count == 3 for r in minutes)
    assert_tiers_match_panes(store, "s")


def _batch(batch_id: int, combos: list[dict], *, read: int | None = None, streams: str = "s") -> BatchCommit:
    """A pane of each combination in the same 10 s (later batches merge into the first one's rows), in
    each of `streams`."""
    partials = [PanePartial(stream, T0, T0 + PANE, dims, _pane(dims, [float(batch_id)], [f"u{batch_id}"]))
                for stream in streams for dims in combos]
    return BatchCommit("main", batch_id, partials, len(partials), {stream: T0 for stream in streams}, {},
                       read_by_stream={stream: len(combos) if read is None else read for stream in streams})


def test_a_commit_reads_each_texts_number_once_for_all_its_streams(store_backend, monkeypatch):
    """A commit numbers its texts to load the panes and tier rows it merges into, and again to save
    them: each text's number is read from dim_sets once a commit (dim_sets.kept), not once a step
    (four reads of a batch's ~1 000 texts, ~3 ms each on SQLite, ~5 ms on PostgreSQL), and the
    texts of every stream in one lookup (the panes', then the tier rows' projections: on
    PostgreSQL one statement each, where the demo's six streams took six)."""
    combos = [{"a": a, "b": b} for a in "xyz" for b in "12"]
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT, "t": LAYOUT}, now_ms=T0)
    store.commit_batch(_batch(0, combos, streams="st"), lateness_ms={"s": 0, "t": 0}, now_ms=T0)
    lookups: list[list[tuple[str, str]]] = []
    stored = dim_sets._stored
    monkeypatch.setattr(dim_sets, "_stored", lambda cursor, p, texts: lookups.append(
        [(stream, text) for stream, of_stream in texts.items() for text in of_stream]) or stored(cursor, p, texts))
    store.commit_batch(_batch(1, combos, streams="st"), lateness_ms={"s": 0, "t": 0}, now_ms=T0)
    read = [pair for lookup in lookups for pair in lookup]
    assert len(read) == len(set(read)) and {(s, dims_key(d)) for s in "st" for d in combos} <= set(read)
    assert len([lookup for lookup in lookups if lookup]) <= 2
    for stream in "st":
        assert [p.data.count for p in store.read_panes(stream, -2**62, 2**62)] == [2] * len(combos)


def test_numbers_given_out_by_a_commit_that_failed_are_not_kept(store_backend):
    """A commit that fails after numbering a new combination rolls its number back: the next
    commit numbers it again rather than reuse the number it kept."""
    store = store_backend.create()
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    store.commit_batch(_batch(0, [{"a": "x"}]), lateness_ms={"s": 0}, now_ms=T0)
    new = [{"a": "x"}, {"a": "new"}]
    with pytest.raises(ValueError, match="records read"):  # after the load numbered "new" (the plan's check)
        store.commit_batch(_batch(1, new, read=5), lateness_ms={"s": 0}, now_ms=T0)
    store.commit_batch(_batch(1, new), lateness_ms={"s": 0}, now_ms=T0)
    assert sorted((p.key.dims, p.data.count) for p in store.read_panes("s", -2**62, 2**62)) == [
        (dims_key({"a": "new"}), 1), (dims_key({"a": "x"}), 2)]
    texts = [text for _, _, text in store_backend.tables(store, ("dim_sets",))["dim_sets"]]
    assert len(texts) == len(set(texts))
