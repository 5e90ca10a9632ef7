"""A batch's partials given as columns (store/partial_columns.py) make the tier deltas the
partials' objects make (store/tier_levels.py `tier_deltas`): the same rows, numbers, field
order, and the stats text and sketches blob the store writes, byte for byte; a commit plan
with the columns writes what the plan of the same partials as objects writes (its fresh panes
from the columns, the others merged as objects); and every store backend writes the same rows
with them as without."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import BatchCommit, PaneData, PanePartial, ValueStats
from store.commit_plan import StoredPane, StreamState, column_partials, pane_ids, pane_keys, pane_rows, plan_batch
from store.panes import dims_key
from store.partial_columns import PartialColumns
from store.row_codec import sketches_blob, stats_text
from store.tier_levels import tier_deltas_of_columns
from store.tiers import TierLayout, tier_deltas
from tests.unit.test_tier_levels import _pane

PANE = 10_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
LAYOUT = TierLayout(PANE, 86_400_000, ((60_000, 86_400_000), (3_600_000, 86_400_000)), ("", "a", "a,b", "c"))

# At most 30 rows of at most 3 values per field: no group reaches k = 200 items, so no KLL
# compacts (DataSketches' compaction draws a random bit: two runs would differ in bytes).
values = st.lists(st.one_of(st.integers(-5, 5).map(float), st.floats(-1e6, 1e6, allow_nan=False)), max_size=3)


def _data(vals: list[float], other: list[float], users: list[str]) -> PaneData:
    return _pane(vals, other, users, bounds=True)  # real sketches, as test_tier_levels makes them


partials_st = st.lists(st.tuples(
    st.integers(-30, 400).map(lambda i: T0 + i * PANE),
    st.fixed_dictionaries({}, optional={"a": st.sampled_from("xy"), "b": st.sampled_from("pq"), "c": st.just("z")}),
    values, values, st.lists(st.sampled_from([f"u{i}" for i in range(12)]), max_size=4),
    st.integers(1, 4),
), max_size=30).map(lambda rows: [(PanePartial("s", start, start + PANE, dims, _data(v, w, users)), revision)
                                  for start, dims, v, w, users, revision in rows])


def _written(deltas) -> dict:
    """What the store writes of each tier row, in order: its dims, revision, count, field order,
    stats text and sketches blob."""
    return {key: (dict(d.dims), d.revision, d.data.count, list(d.data.values), list(d.data.distincts),
                  stats_text(d.data), sketches_blob(d.data)) for key, d in deltas.items()}


@settings(max_examples=120, deadline=None)
@given(partials_st)
def test_tier_deltas_from_columns_are_those_from_the_partials_byte_for_byte(rows):
    partials = [p for p, _ in rows]
    revisions = [r for _, r in rows]
    keys = [dims_key(p.dims) for p in partials]
    cols = PartialColumns.of("s", partials, ("v", "w"), ("u",))
    assert cols is not None and len(cols) == len(partials)
    by_rows = tier_deltas([(p.start_ms, p.dims, key, p.data, r) for p, key, r in zip(partials, keys, revisions)], LAYOUT)
    by_columns = tier_deltas_of_columns(cols, revisions, LAYOUT)
    assert list(by_columns) == list(by_rows)
    assert _written(by_columns) == _written(by_rows)


def test_columns_refuse_what_they_cannot_say():
    good = PanePartial("s", T0, T0 + PANE, {}, _data([1.0], [], ["u1"]))
    assert PartialColumns.of("s", [good], ("v", "w"), ("u",)) is not None
    no_bounds = replace(good, data=PaneData(1, {"v": ValueStats(1, 1.0, None, 1.0, None)}))
    other_order = replace(good, data=PaneData(2, {"w": ValueStats(1, 1.0, 1.0, 1.0), "v": ValueStats(1, 1.0, 1.0, 1.0)}))
    for bad in (no_bounds, other_order, replace(good, stream="t"),
                replace(good, data=PaneData(1, {}, {"u": None})), replace(good, data=PaneData(1, {"x": ValueStats(1, 1.0, 1.0, 1.0)}))):
        assert PartialColumns.of("s", [good, bad], ("v", "w"), ("u",)) is None


def _view(plan) -> tuple:
    """What a plan writes: its pane rows in order, counts, tier rows, progress."""
    return (pane_rows(plan), plan.panes_new, plan.panes_updated, plan.corrections,
            {s: _written(d) for s, d in plan.tier_deltas.items()}, plan.streams, plan.dead_counts)


@settings(max_examples=60, deadline=None)
@given(partials_st, st.integers(0, 3))
def test_a_plan_with_columns_writes_what_the_plan_of_the_objects_writes(rows, stored_every):
    # Panes already stored (merged: revisions move; final: corrections), two partials of one pane,
    # another stream without tiers, and an object partial of the stream merging into a pane of a
    # column row: the same rows written every time.
    partials = [p for p, _ in rows]
    cols = PartialColumns.of("s", partials, ("v", "w"), ("u",))
    assert column_partials(cols, range(len(cols))) == partials
    other = PanePartial("t", T0, T0 + PANE, {"a": "x"}, PaneData(3))
    commit = BatchCommit("main", 7, [other], 0, partial_columns={"s": cols})
    plain = BatchCommit("main", 7, [*partials, other], 0)
    ids = pane_ids(plain)
    assert pane_ids(commit) == ids
    stored = {pane: StoredPane(PaneData(1), 1 + i % 2) for i, pane in enumerate(ids) if stored_every and i % stored_every == 0}
    before = {"s": StreamState(T0 + 100 * PANE, T0 + 100 * PANE)}
    layouts = {"s": LAYOUT}

    def plan(c):
        n = sum(x.data.count for x in c.partials) + sum(cols.count) * ("s" in c.partial_columns)
        return plan_batch(replace(c, events_read=n), stored, before, {"s": 0}, layouts, keys=pane_keys(c))

    by_columns = plan(commit)
    assert _view(by_columns) == _view(plan(plain))
    # The fresh panes (none stored, the only partial of their pane, not final) are written from
    # the columns, without a PaneWrite; every other partial is merged as an object.
    ids_of = [(p.stream, p.start_ms, dims_key(p.dims)) for p in partials]
    fresh = [i for i, (p, pane) in enumerate(zip(partials, ids_of)) if pane not in stored
             and ids_of.count(pane) == 1 and p.end_ms > T0 + 100 * PANE]
    assert [i for block in by_columns.fresh for i in block.rows] == fresh
    assert len(by_columns.panes) == len(partials) - len(fresh) + 1
    if partials:
        extra = PanePartial("s", partials[0].start_ms, partials[0].end_ms, dict(partials[0].dims), PaneData(2))
        appended = replace(commit, partials=[other, extra])
        assert _view(plan(appended)) == _view(plan(replace(plain, partials=[*partials, other, extra])))


# Each example makes its own two stores (the fixture only says which backend).
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partials_st)
def test_every_backend_writes_the_same_rows_with_the_columns_as_without(store_backend, rows):
    # Batch 0 into an empty store (every pane new: its rows encoded from the columns), batch 1
    # the same partials again (every pane merged: encoded row by row).
    partials = [p for p, _ in rows]
    cols = PartialColumns.of("s", partials, ("v", "w"), ("u",))
    stores = []
    for objects, columns in (([], {"s": cols}), (partials, {})):
        store = store_backend.create()
        store.configure_tiers({"s": LAYOUT}, now_ms=T0)
        for batch_id in (0, 1):
            commit = BatchCommit("main", batch_id, objects, sum(p.data.count for p in partials),
                                 {"s": T0} if partials else {}, {}, partial_columns=columns)
            store.commit_batch(commit, lateness_ms={"s": 0}, now_ms=T0)
        stores.append(store)
    with_columns, without = (store_backend.tables(store, ["panes", "tier_rows"]) for store in stores)
    assert with_columns == without
