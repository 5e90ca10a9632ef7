"""Enrichment of a batch on the driver in Python (aggregates/enrichment_driver.py), without Spark:
its lookups checked with Hypothesis against the pure rules (`as_of` for a table, `joined_as_of`
for a view), and Spark's null handling (a row without ids, dims or times). That it commits what
the Spark stages commit is tests/spark/test_driver_batch.py's (the demo's view) and
tests/spark/test_enrichment*.py's (pandas as of the event time, on small batches)."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregates.batch_ids import BatchIds
from aggregates.enrichment_driver import MISSING, DriverLookup, enrich, enrich_table, lookup_time, plan
from aggregates.view_join import ViewShape, joined_as_of
from catalog import load_catalog
from ingest.source_rows import SOURCE_SCHEMA
from sketchboard.settings import DEFAULT_STREAMS
from store.table_versions import SingleVersions, TableVersion, as_of, by_key

KEYS = ["k1", "k2", "k3"]
PLANS = ["free", "pro", "gone"]
TABLE = DriverLookup(stream="s", declared="users", key_index=1, table="users", names=("user_id", "plan", "country"),
                     columns=("plan", "country"), slots=("endpoint", "plan", "country"), miss="_miss_s_0")


def view_lookup(kind: str, foreign_key: str | None) -> DriverLookup:
    return DriverLookup(stream="s", declared="user_plans", key_index=1, table="users",
                        names=("user_id", "plan", "country"), columns=("country", "tier"),
                        slots=("endpoint", "country", "tier"), miss="_miss_s_0", right="plans",
                        right_names=("plan", "tier"), foreign_key=foreign_key, left_kind=kind == "left")


def versions(draw_rows, keys) -> dict[str, list[TableVersion]]:
    return by_key((key, TableVersion(at, 0, i, row)) for i, (key, at, row) in enumerate(draw_rows) if key in keys)


# Mostly rows (a delete now and then), mostly keys and times (a null now and then): lookups that find
# rows, miss them, and find a left row without its right one, in most examples.
user_row = st.fixed_dictionaries({"user_id": st.sampled_from(KEYS), "plan": st.sampled_from(PLANS + [None]),
                                  "country": st.sampled_from(["FR", "DE", None])})
users_rows = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 60), st.one_of(user_row, user_row, st.none())),
                      min_size=1, max_size=12)
plan_row = st.fixed_dictionaries({"plan": st.sampled_from(PLANS), "tier": st.sampled_from(["a", "b", 3])})
plans_rows = st.lists(st.tuples(st.sampled_from(PLANS + KEYS), st.integers(0, 60), st.one_of(plan_row, plan_row,
                                                                                             st.none())), max_size=8)
some = st.integers(0, 120)
events = st.lists(st.tuples(st.sampled_from(["s", "s", "other", None]), st.one_of(st.sampled_from(KEYS), st.none()),
                            st.one_of(some, some, st.none()), st.one_of(some, some, st.none())), min_size=1, max_size=10)


def columns(evs, held: str | None = "old"):
    """`held`: what the rows' enriched slots hold before the lookup ("": dimensions the events do
    not carry, None: null items)."""
    stream = [s for s, _, _, _ in evs]
    ids = [None if k is None and i % 3 == 0 else ["x", k] for i, (_, k, _, _) in enumerate(evs)]
    dims = [None if i % 4 == 3 else ["/a", held, held] for i in range(len(evs))]
    return stream, ids, dims, [e for _, _, e, _ in evs], [g for _, _, _, g in evs]


def fetcher(tables: dict[str, dict[str, list[TableVersion]]], asked: list, *, more: bool = False):
    """`more`: every key's versions, also of keys not asked for (as the kept versions' `with_batch`
    gives a batch's new versions whatever keys it asked)."""
    def fetch(table: str, keys: set[str]):
        asked.append((table, set(keys)))
        return {k: v for k, v in tables[table].items() if more or k in keys}
    return fetch


def text(value) -> str:
    return MISSING if value is None else str(value)


@settings(max_examples=300, deadline=None)
@given(users_rows, events)
def test_a_table_lookup_is_the_row_as_of_the_events_lookup_time(rows, evs):
    tables = {"users": versions(rows, KEYS)}
    stream, ids, dims, event_time, ingest_time = columns(evs)
    out, misses = enrich(stream, ids, dims, event_time, ingest_time, [TABLE], fetcher(tables, []))
    for i in range(len(evs)):
        if stream[i] != "s":
            assert out[i] == dims[i] and misses["_miss_s_0"][i] is False
            continue
        key = ids[i][1] if ids[i] is not None else None
        at = lookup_time(event_time[i], ingest_time[i])
        row = None if key is None or at is None else as_of(tables["users"].get(key, ()), at)
        kept = dims[i][0] if dims[i] is not None else None  # a row without dims keeps nulls, as Spark's array does
        assert out[i] == [kept, text(row and row.get("plan")) if row else MISSING,
                          text(row and row.get("country")) if row else MISSING]
        assert misses["_miss_s_0"][i] is (row is None)


@settings(max_examples=300, deadline=None)
@given(users_rows, plans_rows, events, st.sampled_from(["inner", "left"]), st.sampled_from(["plan", None]))
def test_a_view_lookup_is_the_join_of_both_tables_as_of_the_events_lookup_time(users, plans, evs, kind, fk):
    tables = {"users": versions(users, KEYS), "plans": versions(plans, PLANS + KEYS)}
    shape = ViewShape(foreign_key=fk, inner=kind == "inner", right_columns=("tier",))
    stream, ids, dims, event_time, ingest_time = columns(evs)
    out, misses = enrich(stream, ids, dims, event_time, ingest_time, [view_lookup(kind, fk)], fetcher(tables, []))
    for i in range(len(evs)):
        if stream[i] != "s":
            continue
        key = ids[i][1] if ids[i] is not None else None
        at = lookup_time(event_time[i], ingest_time[i])
        if key is None or at is None:
            row, complete = None, False
        else:
            row, complete = joined_as_of(shape, key, tables["users"].get(key, ()), tables["plans"], at)
        expected = [MISSING, MISSING] if row is None else [text(row.get("country")), text(row.get("tier"))]
        assert out[i][1:] == expected, (i, row)
        assert misses["_miss_s_0"][i] is (not complete)


def test_times_and_keys_follow_sparks_nulls():
    assert lookup_time(5, 3) == 3 and lookup_time(None, 3) == 3 and lookup_time(5, None) == 5
    assert lookup_time(None, None) is None
    tables = {"users": by_key([("k1", TableVersion(0, 0, 0, {"user_id": "k1", "plan": "pro", "country": None}))])}
    asked: list = []
    out, misses = enrich(["s", "s", "s", "other"], [["x", "k1"], ["x"], None, ["x", "k1"]],
                         [["/a", "p", "c"], ["/b", "p", "c"], None, ["/c"]], [10, 10, 10, 10], [20, 20, 20, 20],
                         [TABLE], fetcher(tables, asked))
    assert out == [["/a", "pro", MISSING], ["/b", MISSING, MISSING], [None, MISSING, MISSING], ["/c"]]
    assert misses == {"_miss_s_0": [False, True, True, False]}
    assert asked == [("users", {"k1"})]  # only the keys the stream's events name, once per lookup


def test_the_demo_plan_looks_up_through_its_view_with_the_stages_miss_names():
    catalog = load_catalog(DEFAULT_STREAMS)
    streams = {n: s for n, s in catalog.streams.items() if s.enrich}
    tables = {n: catalog.streams[n] for n in ("users", "plans")}
    [lookup] = plan(catalog, streams, tables, ["http_requests"])
    assert (lookup.stream, lookup.declared, lookup.table, lookup.right) == ("http_requests", "user_plans", "users", "plans")
    assert lookup.foreign_key == "plan" and lookup.left_kind and lookup.miss == "_miss_http_requests_0"
    assert lookup.columns == ("plan", "country", "tier")


def as_table(stream, ids, dims, event_time, ingest_time) -> pa.Table:
    return pa.Table.from_pydict({"stream": stream, "ids": ids, "dims": dims, "event_time": event_time,
                                 "ingest_time": ingest_time},
                                schema=pa.schema([SOURCE_SCHEMA.field(c) for c in ("stream", "ids", "dims", "event_time",
                                                                                   "ingest_time")]))


@settings(max_examples=300, deadline=None)
@given(users_rows, plans_rows, events, st.sampled_from(["table", "inner", "left"]), st.sampled_from(["plan", None]),
       st.booleans(), st.integers(0, 2), st.booleans(), st.sampled_from(["old", "", None]))
# A left row whose foreign key is null names no right row: no right key is asked for.
@example(users=[("k1", 0, {"user_id": "k1", "plan": None, "country": "FR"})], plans=[], evs=[("s", "k1", 0, None)],
         kind="inner", fk="plan", twice=False, cut=0, more=False, held="old")
# A table sliced past its start, with a row of no dims (its lists' offsets and null bitmap sliced).
@example(users=[("k1", 0, {"user_id": "k1", "plan": "pro", "country": "FR"})], plans=[],
         evs=[("s", "k1", 0, None), ("other", "k1", None, None), ("s", "k2", 0, None), ("other", "k1", 1, 1)],
         kind="table", fk=None, twice=False, cut=1, more=False, held="old")
# A table holding none of the events' keys, whose enriched slots are "" already: the lists are kept
# as they are; with null items there instead, they are rebuilt (a null is not MISSING).
@example(users=[("k3", 0, {"user_id": "k3", "plan": "pro", "country": "FR"})], plans=[],
         evs=[("s", "k1", 0, None), ("s", "k2", 5, 5), ("other", "k1", 1, 1)],
         kind="left", fk="plan", twice=False, cut=1, more=False, held="")
@example(users=[("k3", 0, {"user_id": "k3", "plan": "pro", "country": "FR"})], plans=[],
         evs=[("s", "k1", 0, None), ("s", "k2", 5, 5), ("other", "k1", 1, 1)],
         kind="left", fk="plan", twice=False, cut=1, more=False, held=None)
def test_the_whole_column_lookup_gives_what_the_row_by_row_one_gives(users, plans, evs, kind, fk, twice, cut, more,
                                                                      held):
    """`enrich_table` (numpy over a key's events when it has one version, `as_of` per event
    otherwise) against `enrich`: the same dims, misses and keys asked for; two lookups in a row
    (the second reads the first's dims) when `twice`; over a table sliced `cut` rows past its start;
    with `more`, its fetch giving versions of keys not asked for too; with the enriched slots
    holding `held` before the lookup."""
    tables = {"users": versions(users, KEYS), "plans": versions(plans, PLANS + KEYS)}
    lookup = TABLE if kind == "table" else view_lookup(kind, fk)
    lookups = [lookup, replace(lookup, miss="_miss_s_1")] if twice else [lookup]
    cols = columns(evs, held)
    asked_rows, asked_table = [], []
    want_dims, want_misses = enrich(*cols, lookups, fetcher(tables, asked_rows))
    before = (["other"] * cut, [["x", "k1"]] * cut, [None, ["/z", "old", "old"]][:cut], [0] * cut, [0] * cut)
    whole = as_table(*[b + list(c) for b, c in zip(before, cols, strict=True)])
    for encoded in (None, BatchIds.of(whole.slice(cut).column("ids"))):  # the ids hashed here, or given
        asked_table = []
        got_dims, got_misses = enrich_table(whole.slice(cut), lookups, fetcher(tables, asked_table, more=more),
                                            encoded_ids=encoded)
        assert got_dims.to_pylist() == want_dims
        assert {m: a.to_pylist() for m, a in got_misses.items()} == want_misses
        assert asked_table == asked_rows


# Half the time one change a key, so most keys have one version (the columns' case).
one_each = st.one_of(users_rows, users_rows.map(lambda rows: list({key: (key, at, row) for key, at, row in rows}.values())))


@settings(max_examples=300, deadline=None)
@given(one_each, plans_rows, events, st.sampled_from(["table", "inner", "left"]), st.sampled_from(["plan", None]),
       st.booleans(), st.sets(st.sampled_from(KEYS + PLANS)), st.sets(st.sampled_from(KEYS + PLANS)))
# A key that got its one version after the columns were made, and one changed since: both looked up
# among the versions `fetch` gives, after the columns' rows.
@example(users=[("k1", 0, {"user_id": "k1", "plan": "pro", "country": "FR"}),
                ("k2", 0, {"user_id": "k2", "plan": "free", "country": "DE"})],
         plans=[], evs=[("s", "k2", 5, 5), ("s", "k1", 5, 5)], kind="table", fk=None, more=False, unheld={"k2"},
         excluded=set())
@example(users=[("k1", 0, {"user_id": "k1", "plan": "pro", "country": "FR"}),
                ("k2", 0, {"user_id": "k2", "plan": "free", "country": "DE"})],
         plans=[], evs=[("s", "k2", 5, 5), ("s", "k1", 5, 5)], kind="table", fk=None, more=True, unheld=set(),
         excluded={"k2"})
def test_keys_taken_from_the_single_version_columns_give_what_the_row_by_row_lookup_gives(users, plans, evs, kind, fk,
                                                                                          more, unheld, excluded):
    """`enrich_table` with each table's single-version keys as columns (less the `unheld` ones: keys
    that got their one version after the columns were made) and some of them `excluded` (changed
    since, or by the batch): the same dims and misses as `enrich`, and `fetch` asked for exactly the
    keys the columns may not answer for."""
    tables = {"users": versions(users, KEYS), "plans": versions(plans, PLANS + KEYS)}
    held = {t: SingleVersions.of({k: vs for k, vs in kept.items() if k not in unheld}) for t, kept in tables.items()}
    takeable = {t: set(h.keys.to_pylist()) - excluded for t, h in held.items()}
    lookup = TABLE if kind == "table" else view_lookup(kind, fk)
    cols = columns(evs)
    asked_rows, asked_table = [], []
    want_dims, want_misses = enrich(*cols, [lookup], fetcher(tables, asked_rows))
    for encoded in (None, BatchIds.of(as_table(*cols).column("ids"))):
        asked_table = []
        got_dims, got_misses = enrich_table(as_table(*cols), [lookup], fetcher(tables, asked_table, more=more),
                                            lambda table, asked: (held[table], excluded), encoded_ids=encoded)
        assert got_dims.to_pylist() == want_dims
        assert {m: a.to_pylist() for m, a in got_misses.items()} == want_misses
        assert asked_table == [(t, keys - takeable[t]) for t, keys in asked_rows]


def test_dims_whose_items_start_past_their_buffers_start_are_read_where_they_are():
    """The lists' items as a slice of a longer array (its offsets counted from the slice): the check
    that keeps unchanged lists as they are reads each item's length there, not from the array's
    start (empty items, which would pass the check), and the result is the row-by-row one's whether
    the items are "" (kept) or not (rebuilt)."""
    tables = {"users": by_key([("k3", TableVersion(0, 0, 0, {"user_id": "k3", "plan": "pro", "country": "FR"}))])}
    for held in ("", "old"):
        stream, ids, dims, event_time, ingest_time = columns([("s", "k1", 0, 1), ("s", "k2", 5, 5), ("other", "k1", 1, 1)],
                                                             held)
        items = pa.array([""] * 6 + [item for row in dims if row is not None for item in row], pa.string())
        offsets = pa.array([0, 3, 6, 9], pa.int32())  # no row of `columns` is a null list here
        sliced = pa.ListArray.from_arrays(offsets, items.slice(6), type=SOURCE_SCHEMA.field("dims").type)
        assert sliced.values.offset == 6 and sliced.to_pylist() == dims
        batch = as_table(stream, ids, dims, event_time, ingest_time).set_column(2, "dims", sliced)
        want_dims, want_misses = enrich(stream, ids, dims, event_time, ingest_time, [TABLE], fetcher(tables, []))
        got_dims, got_misses = enrich_table(batch, [TABLE], fetcher(tables, []))
        assert got_dims.to_pylist() == want_dims and all(d[1:] == [MISSING, MISSING] for d in want_dims[:2])
        assert {m: a.to_pylist() for m, a in got_misses.items()} == want_misses
