"""Roll-up tiers: a query answered from tier rows equals the pane-level roll-up (exact stats
equal, sketches within bounds), with stragglers, corrections, rebuilds and per-tier retention.

Written against the PaneStore interface, so the PostgreSQL backend runs them too.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.eventtime import BEYOND_RETENTION
from sketches import HllSketch, KllSketch
from store import BatchCommit, DeadLetter, PaneData, PanePartial, PaneStore, ValueStats
from store import tier_folds
from store.panes import dims_key
from store.planner import Segment, cover, kept_from_ms, plan_read
from store.final_points import FinalPoints
from store.point_cache import PointCache
from store.rollup import rollup
from store.series import query_series
from store.tiers import ALL_DIMS, TierLayout, layout_for, tier_deltas
from tests.sqlite_steps import counted_steps
from tests.tier_checks import assert_tiers_match_panes

PANE = 10_000
MINUTE = 60_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # an hour boundary
LATENESS = 30_000
RETENTION = 7 * 86_400_000
# Granules 1m and 10m; the total, a one-dimension and a two-dimension group-by besides all dimensions.
LAYOUT = TierLayout(PANE, RETENTION, ((MINUTE, RETENTION), (10 * MINUTE, RETENTION)), ("", "a", "a,b"))
DIMS = ("a", "b", "c")


def store_at(backend, layout: TierLayout | None) -> PaneStore:
    """A new store of the backend under test (tests/store_backends.py) keeping these tiers."""
    store = backend.create()
    store.configure_tiers({"s": layout}, now_ms=T0)
    return store


def events_to_partials(events: Sequence[tuple[int, dict, float, str]]) -> list[PanePartial]:
    """Events (time, dims, value, user) as the executors would aggregate them: real sketches."""
    groups: dict[tuple[int, tuple], list] = defaultdict(list)
    for t, dims, value, user in events:
        groups[(t - t % PANE, tuple(sorted(dims.items())))].append((value, user))
    out = []
    for (start, dims), items in groups.items():
        kll, hll = KllSketch(), HllSketch()
        for value, user in items:
            kll.update(value)
            hll.update(user)
        values = [v for v, _ in items]
        data = PaneData(len(items), {"v": ValueStats(len(values), math.fsum(values), min(values), max(values),
                                                     kll.to_bytes())}, {"u": hll.to_bytes()})
        out.append(PanePartial("s", start, start + PANE, dict(dims), data))
    return out


def point(store: PaneStore) -> int | None:
    """The point every shard of "s" has passed (store/tier_folds.py complete_point)."""
    clock = store.tier_fold_clock("s")
    return None if clock is None else tier_folds.complete_point(LAYOUT, clock)


def commit_all(store: PaneStore, batches: Sequence[Sequence[tuple]], *, now_ms: int = T0,
               first_id: int = 0) -> None:
    for batch_id, events in enumerate(batches, start=first_id):
        partials = events_to_partials(events)
        max_event = {"s": max(t for t, *_ in events)} if events else {}
        commit = BatchCommit("main", batch_id, partials, len(events), max_event, {})
        assert store.commit_batch(commit, lateness_ms={"s": LATENESS}, now_ms=now_ms).committed


def quantile_of(stat: str) -> float | None:
    """p90 -> 0.9 (the catalog's rule: catalog.model.MetricDef.check_stat); None for other stats."""
    return float(stat[1:]) / 100 if stat[:1] == "p" and stat[1:].replace(".", "").isdigit() else None


def answer(store, *, stat, start, end, step, window, group_by=(), filters=None, cache=None, now_ms=None):
    """The query path as the API runs it (planner, tier rows, exact stats summed in SQL)."""
    quantile = quantile_of(stat)
    return query_series(store, "s", PANE, stat=stat, quantile=quantile, value_field="v", distinct_field="u",
                        start_ms=start, end_ms=end, step_ms=step, window_ms=window, group_by=group_by,
                        filters=filters or {}, watermark_ms=store.watermarks().get("s"), cache=cache, now_ms=now_ms)


def pane_rollup(store, *, stat, start, end, step, window, group_by=(), filters=None):
    """The oracle: every pane of the range read and rolled up in Python, as before tiers existed."""
    quantile = quantile_of(stat)
    panes = store.read_panes("s", start, start + ((end - start - 1) // step) * step + window, value_field="v",
                             distinct_field="u", with_sketches=True)
    return rollup(panes, stat=stat, quantile=quantile, value_field="v", distinct_field="u", start_ms=start,
                  end_ms=end, step_ms=step, window_ms=window, pane_ms=PANE, group_by=group_by,
                  filters=filters or {}, watermark_ms=store.watermarks().get("s"))


def assert_same(tiered, panes, stat):
    assert [s.group for s in tiered] == [s.group for s in panes]
    for a, b in zip(tiered, panes):
        for p, q in zip(a.points, b.points, strict=True):
            assert (p.t_ms, p.count, p.final, p.revision) == (q.t_ms, q.count, q.final, q.revision)
            if stat in ("sum", "avg"):
                # A tier row's sum is rounded at each merge (a late batch's delta added to it), the
                # panes' once: the same to the last bits, not always in them. Likewise an average.
                assert p.value == (None if q.value is None else pytest.approx(q.value, rel=1e-12, abs=1e-9))
            else:
                # Exact stats are equal; these sketches hold fewer than k items (KLL) and few keys
                # (HLL coupon mode), where merging in another order gives the same answer.
                assert p.value == q.value


event = st.tuples(
    st.integers(0, 3 * 3_600_000 - 1),
    st.fixed_dictionaries({"a": st.sampled_from("xy"), "b": st.sampled_from("pqr"), "c": st.sampled_from("mn")}),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: round(v, 3)),
    st.sampled_from([f"u{i}" for i in range(40)]),
)
batches = st.lists(st.lists(event, min_size=1, max_size=25), min_size=1, max_size=6)


@st.composite
def queries(draw):
    step = draw(st.sampled_from([PANE, 30_000, MINUTE, 2 * MINUTE, 10 * MINUTE, 30 * MINUTE]))
    window = step * draw(st.sampled_from([1, 1, 2, 3, 6]))
    if draw(st.booleans()):
        window += PANE * draw(st.integers(0, 3))  # not a multiple of the step: gcd buckets
    start = T0 + step * draw(st.integers(-2, 3 * 3_600_000 // step))
    start -= start % step
    end = start + step * draw(st.integers(1, 40))
    group_by = draw(st.lists(st.sampled_from(DIMS), unique=True, max_size=2))
    filters = draw(st.dictionaries(st.sampled_from(DIMS), st.sampled_from("xypqrmn"), max_size=1))
    stat = draw(st.sampled_from(["count", "rate", "sum", "avg", "min", "max", "p90", "distinct"]))
    return dict(stat=stat, start=start, end=end, step=step, window=window, group_by=group_by, filters=filters)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, asked=st.lists(queries(), min_size=1, max_size=5))
def test_tiered_answers_equal_pane_rollups(store_backend, batches, asked):
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    try:
        commit_all(tiered, batches)
        commit_all(plain, batches)
        assert_tiers_match_panes(tiered, "s")
        for q in asked:
            expected = pane_rollup(plain, **q)
            assert_same(answer(tiered, **q), expected, q["stat"])
            assert_same(answer(plain, **q), expected, q["stat"])  # panes only: exact stats summed in SQL
    finally:
        tiered.close()
        plain.close()


# The 1 m tier without all-dimensions rows (a tier's all_dimensions: false): queries by "c" (in no
# declared group-by) read the panes there, or the 10 m rows where they fit.
NARROW = TierLayout(PANE, RETENTION, ((MINUTE, RETENTION), (10 * MINUTE, RETENTION)), ("", "a", "a,b"), (MINUTE,))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, asked=st.lists(queries(), min_size=1, max_size=5))
def test_tiered_answers_equal_pane_rollups_without_all_dimension_rows(store_backend, batches, asked):
    tiered, plain = store_at(store_backend, NARROW), store_at(store_backend, None)
    try:
        commit_all(tiered, batches)
        commit_all(plain, batches)
        assert_tiers_match_panes(tiered, "s")
        for q in asked:
            assert_same(answer(tiered, **q), pane_rollup(plain, **q), q["stat"])
    finally:
        tiered.close()
        plain.close()


def test_a_tier_without_all_dimension_rows_leaves_other_group_bys_to_finer_rows():
    assert {t.proj for t in NARROW.tiers() if t.granule_ms == MINUTE} == {"", "a", "a,b"}
    assert TierLayout.from_json(NARROW.to_json()) == NARROW and '"narrow"' not in LAYOUT.to_json()
    plan = plan_read(NARROW, PANE, T0, T0 + 25 * MINUTE, MINUTE, MINUTE, 25, ("c",))
    assert plan.segments == (Segment(PANE, T0, T0 + 25 * MINUTE, ALL_DIMS),)
    plan = plan_read(NARROW, PANE, T0 + MINUTE, T0 + 25 * MINUTE, 24 * MINUTE, 24 * MINUTE, 1, ("c",))
    assert plan.segments == (Segment(PANE, T0 + MINUTE, T0 + 10 * MINUTE, ALL_DIMS),
                             Segment(10 * MINUTE, T0 + 10 * MINUTE, T0 + 20 * MINUTE, ALL_DIMS),
                             Segment(PANE, T0 + 20 * MINUTE, T0 + 25 * MINUTE, ALL_DIMS))
    assert plan_read(NARROW, PANE, T0, T0 + 25 * MINUTE, MINUTE, MINUTE, 25, ("b",)).segments == (
        Segment(MINUTE, T0, T0 + 25 * MINUTE, "a,b"),)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=batches, then=batches, asked=st.lists(queries(), min_size=1, max_size=4))
def test_cached_points_are_recomputed_when_their_rows_change(store_backend, first, then, asked):
    """Final points kept between queries equal fresh ones after more batches (stragglers included)."""
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    kept = FinalPoints(store_backend.side_db(tiered))
    cache = PointCache(backing=kept)
    try:
        for batch_list, offset in ((first, 0), (then, len(first))):
            for store in (tiered, plain):
                commit_all(store, batch_list, first_id=offset)
            for q in asked:
                expected = pane_rollup(plain, **q)
                assert_same(answer(tiered, **q, cache=cache), expected, q["stat"])
                assert_same(answer(tiered, **q, cache=cache), expected, q["stat"])  # from the cache, where final
                kept.flush()  # then a restarted process: only the points kept in the store
                assert_same(answer(tiered, **q, cache=PointCache(backing=kept)), expected, q["stat"])
    finally:
        kept.close()
        tiered.close()
        plain.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, start=st.integers(0, 3 * 360 - 1), panes=st.integers(1, 400),
       stat=st.sampled_from(["count", "sum", "min", "p90", "distinct"]), group_by=st.sampled_from([(), ("a",), ("c",)]))
def test_one_window_with_ragged_edges_equals_panes(store_backend, batches, start, panes, stat, group_by):
    """What alert rules ask: one window starting on any pane, read with coarse rows in the middle."""
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    try:
        commit_all(tiered, batches)
        commit_all(plain, batches)
        q = dict(stat=stat, start=T0 + start * PANE, end=T0 + start * PANE + PANE, step=PANE, window=panes * PANE,
                 group_by=group_by)
        assert_same(answer(tiered, **q), pane_rollup(plain, **q), stat)
    finally:
        tiered.close()
        plain.close()


def test_a_straggler_revises_its_tier_rows_and_is_a_correction(store_backend):
    store = store_at(store_backend, LAYOUT)
    commit_all(store, [[(T0 + 5_000, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")],
                       [(T0 + 30 * MINUTE, {"a": "x", "b": "p", "c": "m"}, 2.0, "u2")],  # watermark passes T0 + 1m
                       [(T0 + 7_000, {"a": "y", "b": "q", "c": "n"}, 3.0, "u3")]])  # a straggler for the first pane
    hour = answer(store, stat="count", start=T0, end=T0 + 3_600_000, step=3_600_000, window=3_600_000)
    minute = answer(store, stat="max", start=T0, end=T0 + MINUTE, step=MINUTE, window=MINUTE)
    assert hour[0].points[0].count == 3 and hour[0].points[0].revision == 2
    assert minute[0].points[0].value == 3.0 and minute[0].points[0].revision == 2 and minute[0].points[0].final
    assert len(store.corrections(stream="s")) == 1
    store.close()


def test_the_coarser_tiers_rows_take_the_panes_the_streams_time_passes_not_every_batch(store_backend):
    """store/tier_folds.py: LAYOUT's 10 m rows hold the panes before the fold point; a batch of
    later panes leaves them as they are, the point moving past panes merges those once."""
    store = store_at(store_backend, LAYOUT)
    at = {"a": "x", "b": "p", "c": "m"}

    def ten_minutes() -> tuple[int, int]:
        (row,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
        return row.data.count, row.last_batch

    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1")]])
    assert point(store) == T0 + PANE  # a first commit: past every pane merged
    commit_all(store, [[(T0 + 20_000, at, 2.0, "u2"), (T0 + 25_000, at, 3.0, "u3")]], first_id=1)
    assert point(store) == T0 + PANE  # newest event less the lateness: before the point
    assert ten_minutes() == (1, 0)  # not written: its panes after the point wait
    commit_all(store, [[(T0 + 2 * MINUTE, at, 4.0, "u4")]], first_id=2)
    # 2 min less the lateness: the first shard's point; the others' a pane before it
    assert point(store) == T0 + 80_000
    assert tier_folds.shard_points(LAYOUT, store.tier_fold_clock("s")) == (T0 + 90_000,) + (T0 + 80_000,) * 7
    assert ten_minutes() == (3, 2)  # the panes at 20 s folded in, the new one after the point not
    commit_all(store, [[(T0 + 15_000, at, 5.0, "u5")]], first_id=3)  # a straggler before the point: merged
    assert ten_minutes() == (4, 3)
    assert_tiers_match_panes(store, "s")
    hour = answer(store, stat="count", start=T0, end=T0 + 10 * MINUTE, step=10 * MINUTE, window=10 * MINUTE)
    assert hour[0].points[0].count == 5  # the 10 m row under way is not read: finer rows answer
    store.close()


def test_a_batch_that_moves_the_point_brings_each_passed_event_into_the_rows_once(store_backend):
    """The fold is decided before the batch writes (store/tier_fold_store.py plan_fold): the panes the
    point passes reach the 10 m row as stored before the batch, the batch's own partials of them
    through its plan. Each event once, whether its pane was stored before, merged into, or new."""
    store = store_at(store_backend, LAYOUT)
    at = {"a": "x", "b": "p", "c": "m"}
    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1")], [(T0 + 20_000, at, 2.0, "u2"), (T0 + 40_000, at, 3.0, "u3")]])
    assert point(store) == T0 + PANE
    # Into the stored pane at 20 s, a new pane at 50 s (both passed by the point this batch moves),
    # and a pane after the new point.
    commit_all(store, [[(T0 + 25_000, at, 4.0, "u4"), (T0 + 50_000, at, 5.0, "u5"), (T0 + 4 * MINUTE, at, 6.0, "u6")]],
               first_id=2)
    assert point(store) == T0 + 3 * MINUTE + 20_000
    (row,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
    assert row.data.count == 5  # 5, 20, 25, 40 and 50 s; the event at 4 min waits for the point
    assert row.data.values["v"].sum == 15.0
    assert_tiers_match_panes(store, "s")
    store.close()


def test_each_shard_of_combinations_folds_a_pane_at_its_own_point(store_backend):
    """store/tier_folds.py shards: a batch that moves the fold clock part of a pane folds the passed
    pane for the combinations of the shards whose points pass it, and for no other (with one point,
    every combination's row took it in the same batch)."""
    store = store_at(store_backend, LAYOUT)
    combos = [{"a": f"x{i}", "b": "p", "c": "m"} for i in range(40)]
    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1") for at in combos]])
    assert point(store) == T0 + PANE
    commit_all(store, [[(T0 + 15_000, at, 2.0, "u2") for at in combos]], first_id=1)
    # The clock moves 5 s past T0 + 10 s: shards 0-3 (ahead of it by 8.75 down to 5 s) pass the
    # pane at 10 s, shards 4-7 (3.75 s down to 0) do not.
    commit_all(store, [[(T0 + 53_750, combos[0], 3.0, "u3")]], first_id=2)
    assert store.tier_fold_clock("s") == T0 + 15_000
    assert point(store) == T0 + PANE
    counts = {row.key.dims: row.data.count
              for row in store.read_tier("s", 10 * MINUTE, ALL_DIMS, T0, T0 + 1, pane_ms=PANE)}
    moved = {dims_key(at) for at in combos if tier_folds.shard(dims_key(at)) <= 3}
    assert 0 < len(moved) < len(combos)
    assert counts == {dims_key(at): 2 if dims_key(at) in moved else 1 for at in combos}
    (total,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
    assert total.data.count == len(combos) + len(moved)  # the group-by rows take each shard's part
    assert_tiers_match_panes(store, "s")
    # The rest of the pane's shards pass it later; each combination's row then holds both panes once.
    commit_all(store, [[(T0 + 60_000, combos[0], 4.0, "u4")]], first_id=3)
    assert point(store) == T0 + 20_000
    assert {row.key.dims: row.data.count for row in store.read_tier("s", 10 * MINUTE, ALL_DIMS, T0, T0 + 1,
                                                                    pane_ms=PANE)} == {dims_key(at): 2 for at in combos}
    assert_tiers_match_panes(store, "s")
    store.close()


def test_tiers_rebuilt_from_the_panes_fold_on_from_past_every_pane(store_backend):
    """A rebuild merges every pane into the rows: the stream has no point until its next commit,
    which sets it past every stored pane (nothing folded twice)."""
    store = store_at(store_backend, None)
    at = {"a": "x", "b": "p", "c": "m"}
    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1"), (T0 + 8 * MINUTE, at, 2.0, "u2")]])
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    assert store.tier_fold_clock("s") is None
    commit_all(store, [[(T0 + 3 * MINUTE, at, 3.0, "u3")]], first_id=1)
    assert point(store) == T0 + 8 * MINUTE + PANE
    commit_all(store, [[(T0 + 9 * MINUTE, at, 4.0, "u4")], [(T0 + 12 * MINUTE, at, 5.0, "u5")]], first_id=2)
    assert point(store) == T0 + 11 * MINUTE + 20_000
    assert_tiers_match_panes(store, "s")
    (row,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
    assert row.data.count == 4
    store.configure_tiers({"s": None}, now_ms=T0)
    assert store.tier_fold_clock("s") is None
    store.close()


def test_a_stream_without_events_moves_its_point_by_the_batch_clock(store_backend):
    """Else a stream gone quiet kept the hour row it stopped in unread for good, and once the finer
    rows under it went past their keep that hour would be answered from nothing."""
    store = store_at(store_backend, LAYOUT)
    at = {"a": "x", "b": "p", "c": "m"}
    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1"), (T0 + 25_000, at, 2.0, "u2")]])
    assert point(store) == T0 + 30_000
    quiet = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=T0 + 12 * MINUTE + 3_000)
    assert store.commit_batch(quiet, lateness_ms={"s": LATENESS}, now_ms=T0 + 12 * MINUTE).committed
    assert point(store) == T0 + 11 * MINUTE + 20_000
    assert_tiers_match_panes(store, "s")
    (row,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
    assert row.data.count == 2
    store.close()


def test_a_stream_no_longer_foldable_has_every_pane_merged_into_its_rows(store_backend):
    """A lateness raised past what the first tier's keep allows (store/tier_folds.py foldable): the
    panes after the point go into the rows and the point goes, so the planner reads them all again."""
    store = store_at(store_backend, LAYOUT)
    at = {"a": "x", "b": "p", "c": "m"}
    commit_all(store, [[(T0 + 5_000, at, 1.0, "u1")], [(T0 + 40_000, at, 2.0, "u2")]])
    assert point(store) == T0 + PANE
    late = BatchCommit("main", 2, events_to_partials([(T0 + 50_000, at, 3.0, "u3")]), 1, {"s": T0 + 50_000}, {})
    assert store.commit_batch(late, lateness_ms={"s": RETENTION}, now_ms=T0).committed
    assert store.tier_fold_clock("s") is None
    assert_tiers_match_panes(store, "s")
    (row,) = store.read_tier("s", 10 * MINUTE, "", T0, T0 + 1, pane_ms=PANE)
    assert row.data.count == 3
    store.close()


def test_sums_past_a_double_neither_fail_the_commit_nor_the_reads(store_backend):
    """Values from before ingest bounded them (ingest/events.py MAX_ABS_VALUE), in the log or the
    store: two 1e308 in one tier row made math.fsum raise, failing the batch at every replay (and a
    tier rebuild at start); an infinite sum was stored as "Infinity", which neither store's JSON
    functions read. Now the plain sum, stored as the largest double; a query answers it."""
    store = store_at(store_backend, LAYOUT)
    commit_all(store, [[(T0 + 5_000, {"a": "x", "b": "p", "c": "m"}, 1e308, "u1"),
                        (T0 + 15_000, {"a": "x", "b": "p", "c": "m"}, 1e308, "u2")],
                       [(T0 + 25_000, {"a": "x", "b": "p", "c": "m"}, -1e308, "u3")]])
    for stat in ("sum", "avg", "max", "count"):
        (series,) = answer(store, stat=stat, start=T0, end=T0 + MINUTE, step=MINUTE, window=MINUTE)
        assert series.points[0].count == 3, stat
    store.configure_tiers({"s": NARROW}, now_ms=T0)  # rebuilt from the panes: the same sums again
    (series,) = answer(store, stat="max", start=T0, end=T0 + MINUTE, step=MINUTE, window=MINUTE)
    assert series.points[0].value == 1e308
    store.close()


def test_sums_the_store_adds_are_exactly_rounded_as_the_pane_rollup(store_backend):
    """A bucket's parts were added by SQL SUM, in the order rows came and rounded at each step:
    1e16 + 1 - 1e16 answered 0.0 where the pane roll-up (math.fsum) says 1.0."""
    store = store_at(store_backend, LAYOUT)
    commit_all(store, [[(T0 + 5_000, {"a": "x", "b": "p", "c": "m"}, 1e16, "u1"),
                        (T0 + 15_000, {"a": "x", "b": "p", "c": "m"}, 1.0, "u2"),
                        (T0 + 25_000, {"a": "x", "b": "p", "c": "m"}, -1e16, "u3")]])
    for stat, group_by in (("sum", ()), ("avg", ()), ("sum", ("c",))):  # the total's rows; the panes
        asked = dict(stat=stat, start=T0, end=T0 + MINUTE, step=30_000, window=30_000, group_by=group_by)
        (series,) = answer(store, **asked)
        (expected,) = pane_rollup(store, **asked)
        assert [p.value for p in series.points] == [p.value for p in expected.points], (stat, group_by)
        assert series.points[0].value == (1.0 if stat == "sum" else 1 / 3)
    store.close()


def test_a_negative_zero_min_and_max_come_back_negative_as_the_pane_rollup_s(store_backend):
    """The stats summed by the store (aggregate_tier) keep -0.0 as the panes hold it: PostgreSQL read
    them as jsonb, whose numbers have no -0.0, and answered 0.0."""
    store = store_at(store_backend, LAYOUT)
    commit_all(store, [[(T0 + 5_000, {"a": "x", "b": "p", "c": "m"}, -0.0, "u1"),
                        (T0 + 15_000, {"a": "x", "b": "p", "c": "m"}, -0.0, "u2")]])
    for bucket_ms, pane_ms in ((PANE, PANE), (MINUTE, PANE), (MINUTE, None)):  # one row a bucket; summed; tier rows
        found = store.aggregate_tier("s", PANE if pane_ms else MINUTE, ALL_DIMS if pane_ms else "", T0, T0 + MINUTE,
                                     origin_ms=T0, bucket_ms=bucket_ms, value_field="v", pane_ms=pane_ms)
        assert found, (bucket_ms, pane_ms)
        for stats in found:
            assert (math.copysign(1, stats.min), math.copysign(1, stats.max)) == (-1, -1), (bucket_ms, pane_ms, stats)
    for stat in ("min", "max"):
        (series,) = answer(store, stat=stat, start=T0, end=T0 + MINUTE, step=MINUTE, window=MINUTE)
        assert math.copysign(1, series.points[0].value) == -1, stat
    store.close()


def test_the_planner_reads_the_coarsest_rows_that_fit():
    plan = plan_read(LAYOUT, PANE, T0, T0 + 86_400_000, 3_600_000, 3_600_000, 24, ())
    assert plan.segments == (Segment(10 * MINUTE, T0, T0 + 86_400_000, ""),)
    plan = plan_read(LAYOUT, PANE, T0, T0 + 86_400_000 + 50 * MINUTE, MINUTE, 3_600_000, 1440, ("a",))
    assert plan.segments == (Segment(MINUTE, T0, T0 + 86_400_000 + 50 * MINUTE, "a"),)
    assert plan_read(LAYOUT, PANE, T0, T0 + 2 * MINUTE, MINUTE, MINUTE, 2, ("b",)).segments == (
        Segment(MINUTE, T0, T0 + 2 * MINUTE, "a,b"),)
    assert plan_read(LAYOUT, PANE, T0, T0 + 2 * MINUTE, MINUTE, MINUTE, 2, ("c",)).segments == (
        Segment(MINUTE, T0, T0 + 2 * MINUTE, ALL_DIMS),)
    assert plan_read(LAYOUT, PANE, T0, T0 + MINUTE, 30_000, 30_000, 2, ()).segments == (
        Segment(PANE, T0, T0 + MINUTE, ""),)
    assert plan_read(None, PANE, T0, T0 + MINUTE, MINUTE, MINUTE, 1, ()).segments == (Segment(PANE, T0, T0 + MINUTE),)


def test_a_folded_granule_is_read_only_for_rows_ending_by_the_fold_point():
    """The 10 m row the fold point falls in lacks its later panes (store/tier_folds.py): finer
    rows answer from its start, and later 10 m rows are not read either."""
    point = T0 + 5 * 3_600_000 + 25 * MINUTE + PANE
    plan = plan_read(LAYOUT, PANE, T0, T0 + 86_400_000, 3_600_000, 3_600_000, 24, (), folded_ms=point)
    assert plan.segments == (Segment(10 * MINUTE, T0, T0 + 5 * 3_600_000 + 20 * MINUTE, ""),
                             Segment(MINUTE, T0 + 5 * 3_600_000 + 20 * MINUTE, T0 + 86_400_000, ""))
    plan = plan_read(LAYOUT, PANE, T0, T0 + 86_400_000, 3_600_000, 3_600_000, 24, (), now_ms=T0 + 86_400_000,
                     folded_ms=point)
    assert plan.segments[0] == Segment(10 * MINUTE, T0, T0 + 5 * 3_600_000 + 20 * MINUTE, "")
    # Before the first 10 m row ends, none is read; a 1 m tier is never folded.
    assert plan_read(LAYOUT, PANE, T0, T0 + 3_600_000, 3_600_000, 3_600_000, 1, (), folded_ms=T0 + 9 * MINUTE
                     ).segments == (Segment(MINUTE, T0, T0 + 3_600_000, ""),)
    assert LAYOUT.folded_granules() == (10 * MINUTE,)


def test_a_stream_is_folded_where_its_first_tier_outlives_a_row_under_way():
    assert tier_folds.foldable(LAYOUT, LATENESS)
    assert not tier_folds.foldable(LAYOUT, None)  # no longer configured
    assert not tier_folds.foldable(LAYOUT, RETENTION)
    short = TierLayout(PANE, 30 * MINUTE, ((MINUTE, 30 * MINUTE), (3_600_000, 86_400_000)), ("",))
    assert not tier_folds.foldable(short, LATENESS)  # hour rows under way outlive the minutes under them
    assert not tier_folds.foldable(TierLayout(PANE, RETENTION, ((MINUTE, RETENTION),), ("",)), LATENESS)
    # The clock: the newest event less the lateness and the shards' spread, never back; the first
    # shard's point is the newest event less the lateness on a pane boundary, the last's a pane before.
    assert tier_folds.fold_clock(LAYOUT, T0, T0 + 95_000, LATENESS) == T0 + 56_250
    assert tier_folds.shard_points(LAYOUT, T0 + 56_250) == (T0 + 60_000,) * 5 + (T0 + 50_000,) * 3
    assert tier_folds.complete_point(LAYOUT, T0 + 56_250) == T0 + 50_000
    assert tier_folds.fold_clock(LAYOUT, T0 + 60_000, T0 + 95_000, LATENESS) is None
    assert tier_folds.fold_clock(LAYOUT, T0 + 56_250, T0 + 95_500, LATENESS) is None  # no shard's point moves
    assert tier_folds.fold_clock(LAYOUT, T0, None, LATENESS) is None
    # A point stored before shards (on a pane boundary) is every shard's.
    assert tier_folds.shard_points(LAYOUT, T0 + 60_000) == (T0 + 60_000,) * tier_folds.SHARDS


def test_the_pane_granule_keeps_only_the_total_so_grouped_edges_read_the_panes():
    """Pane-granule rows of a group-by merge about one pane each and were most of a backfill's
    tier rows: only the total is kept there, and a grouped query reads the panes at its edges."""
    assert {t.proj for t in LAYOUT.tiers() if t.granule_ms == PANE} == {""}
    assert plan_read(LAYOUT, PANE, T0, T0 + MINUTE, 30_000, 30_000, 2, ("b",)).segments == (
        Segment(PANE, T0, T0 + MINUTE, ALL_DIMS),)
    # One window from 10:00:10 to 10:11:10 by a: the minutes in "a" rows, the edges from the panes.
    assert plan_read(LAYOUT, PANE, T0 + PANE, T0 + 11 * MINUTE + PANE, PANE, 11 * MINUTE, 1, ("a",)).segments == (
        Segment(PANE, T0 + PANE, T0 + MINUTE, ALL_DIMS), Segment(MINUTE, T0 + MINUTE, T0 + 11 * MINUTE, "a"),
        Segment(PANE, T0 + 11 * MINUTE, T0 + 11 * MINUTE + PANE, ALL_DIMS))


def test_cover_puts_finer_rows_only_at_the_edges():
    start, end = T0 + PANE, T0 + 25 * MINUTE + 2 * PANE
    assert cover(start, end, [10 * MINUTE, MINUTE, PANE]) == [
        Segment(PANE, T0 + PANE, T0 + MINUTE), Segment(MINUTE, T0 + MINUTE, T0 + 10 * MINUTE),
        Segment(10 * MINUTE, T0 + 10 * MINUTE, T0 + 20 * MINUTE), Segment(MINUTE, T0 + 20 * MINUTE, T0 + 25 * MINUTE),
        Segment(PANE, T0 + 25 * MINUTE, end)]


def test_configuring_tiers_on_existing_panes_rebuilds_them(store_backend):
    rng = random.Random(7)
    batches = [[(rng.randrange(3 * 3_600_000), {"a": rng.choice("xy"), "b": rng.choice("pq"), "c": "m"},
                 float(rng.randrange(1000)), f"u{rng.randrange(30)}") for _ in range(20)] for _ in range(5)]
    store = store_at(store_backend, None)  # a store from before tiers
    commit_all(store, batches)
    expected = answer(store, stat="p90", start=T0, end=T0 + 3 * 3_600_000, step=10 * MINUTE, window=30 * MINUTE,
                      group_by=("a",))
    progress = []
    assert store.configure_tiers({"s": LAYOUT}, now_ms=T0, progress=progress.append) == ["s"]
    assert progress and store.tier_layout("s") == LAYOUT
    assert store.configure_tiers({"s": LAYOUT}, now_ms=T0) == []  # unchanged: nothing to do
    got = answer(store, stat="p90", start=T0, end=T0 + 3 * 3_600_000, step=10 * MINUTE, window=30 * MINUTE,
                 group_by=("a",))
    assert_same(got, expected, "p90")
    assert store.configure_tiers({"s": None}, now_ms=T0) == ["s"] and store.tier_layout("s") is None
    store.close()


def test_each_tier_keeps_its_own_retention(store_backend):
    day = 86_400_000
    layout = TierLayout(PANE, 2 * day, ((MINUTE, 3 * day), (3_600_000, 10 * day)), ("",))
    store = store_at(store_backend, layout)
    old = [(T0 + 5_000, {"a": "x"}, 1.0, "u1")]
    commit_all(store, [old])
    now = T0 + 5 * day  # past the panes' and the minutes' retention, not the hours'
    batch = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now)
    store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": 2 * day})
    read = lambda g, p: store.read_tier("s", g, p, T0, T0 + day, pane_ms=PANE)  # noqa: E731
    assert read(PANE, ALL_DIMS) == [] and read(PANE, "") == []
    assert read(MINUTE, ALL_DIMS) == [] and read(MINUTE, "") == []
    assert [r.data.count for r in read(3_600_000, ALL_DIMS)] == [1] and [r.data.count for r in read(3_600_000, "")] == [1]
    store.close()


def test_a_tier_row_goes_when_it_ends_at_its_tiers_horizon_not_before(store_backend):
    """Per tier and projection, the rows ending at or before batch_now - keep go; one ending a
    pane later stays (the drop is asked as a range of the rows' start: store/tier_retention.py)."""
    day = 86_400_000
    layout = TierLayout(PANE, day, ((MINUTE, day), (10 * MINUTE, 2 * day)), ("", "a"))
    store = store_at(store_backend, layout)
    commit_all(store, [[(T0 + m * MINUTE + 5_000, {"a": "x", "b": "y"}, 1.0, "u") for m in range(30)]])
    now = T0 + day + 20 * MINUTE  # the minute rows ending by T0 + 20m go; the 10-minute rows all stay
    batch = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now)
    store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": 3 * day})
    for proj in (ALL_DIMS, "", "a"):
        minutes = store.read_tier("s", MINUTE, proj, 0, 2**62, pane_ms=PANE)
        assert [r.end_ms for r in minutes] == [T0 + m * MINUTE for m in range(21, 31)], proj
        assert len(store.read_tier("s", 10 * MINUTE, proj, 0, 2**62, pane_ms=PANE)) == 3, proj
    store.close()


def test_a_commits_tier_retention_reads_what_it_drops_not_every_row_kept(tmp_path):
    """Every batch's commit drops what its tiers no longer keep. Asked by end time alone, it read
    every row of a granule, of every projection and over all the time kept (the demo's ~300 000
    after 8 days, each in its own page for its sketches: ~0.6 s a commit), to drop the few a batch
    frees. SQLite's virtual-machine steps, counted, not timed."""
    from store import SqlitePaneStore, tier_retention

    day = 86_400_000
    layout = TierLayout(PANE, day, ((MINUTE, day),), ("",))
    steps = {}
    for minutes in (20, 1_000):
        store = SqlitePaneStore(tmp_path / f"{minutes}.db", synchronous="OFF")
        store.configure_tiers({"s": layout}, now_ms=T0)
        conn = store._conn
        dims_id = 0
        conn.executemany(  # rows as kept: a tier row spans its granule; sketches of a few kilobytes
            "INSERT INTO tier_rows (stream, granule_ms, proj, start_ms, dims_id, end_ms, count, stats, revision,"
            " updated_at_ms, last_batch, sketches) VALUES ('s', ?, ?, ?, ?, ?, 1, '{}', 0, 0, 0, zeroblob(3000))",
            [(MINUTE, proj, T0 + m * MINUTE, dims_id, T0 + (m + 1) * MINUTE) for m in range(minutes)
             for proj in (ALL_DIMS, "")])
        # nothing is a day old yet
        steps[minutes] = counted_steps(conn, lambda: tier_retention.drop_expired(conn, "?", "s", layout, T0 + day))[1]
        assert conn.execute("SELECT COUNT(*) FROM tier_rows").fetchone()[0] == 2 * minutes
        store.close()
    assert steps[1_000] <= 2 * steps[20] + 2, steps  # 50 times the rows, the same work


def test_a_stream_removed_from_the_configuration_goes_at_its_stored_retention(store_backend):
    """The pipeline's retention run names the configured streams only: a stream removed from the
    configuration used to keep its panes and dead letters for good. It goes at the retention its
    stored layout was kept with, as if it had stayed; a configured stream keeps its own."""
    day = 86_400_000
    store = store_backend.create()
    kept, gone = (TierLayout(PANE, keep, ((MINUTE, keep),), ("",)) for keep in (10 * day, 2 * day))
    store.configure_tiers({"s": kept, "gone": gone}, now_ms=T0)
    partials = [PanePartial(stream, T0, T0 + PANE, {"a": "x"}, PaneData(count=1)) for stream in ("s", "gone")]
    dead = [DeadLetter("gone", 0, 7, BEYOND_RETENTION, T0 - 10 * day, T0)]
    store.commit_batch(BatchCommit("main", 0, partials, 3, {"s": T0, "gone": T0}, {}, dead, {"s": 1, "gone": 2},
                                   {"gone": {BEYOND_RETENTION: 1}}), lateness_ms={"s": LATENESS, "gone": LATENESS},
                       now_ms=T0)
    store.configure_tiers({"s": kept}, now_ms=T0 + day)  # restarted without "gone"
    now = T0 + 5 * day  # past the removed stream's retention, within the configured one's
    store.commit_batch(BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now), lateness_ms={"s": LATENESS},
                       now_ms=now, retention_ms={"s": 10 * day})
    assert store.read_panes("gone", 0, 2**62) == [] and store.dead_letters(stream="gone") == []
    assert store.read_tier("gone", MINUTE, ALL_DIMS, 0, 2**62, pane_ms=PANE) == []
    assert [p.data.count for p in store.read_panes("s", 0, 2**62)] == [1]
    assert [r.data.count for r in store.read_tier("s", MINUTE, ALL_DIMS, 0, 2**62, pane_ms=PANE)] == [1]
    store.close()


def test_a_layout_change_keeps_the_coarse_history_past_the_panes(store_backend):
    """Hour rows are kept longer than the panes (the demo: 90 days against 8). Changing the layout
    (a tier kept longer, a group-by added) used to delete every tier row and roll them up again
    from the panes left, losing the hours past the panes' retention: hourly counts over them then
    answered 0, final. Rows of a tier both layouts keep that start before the first pane stay
    (the hour holding the first pane too: it holds panes gone since); a new group-by's rows start
    at the panes, as no older history can be made for it."""
    hour, day = 3_600_000, 86_400_000
    retention = 30 * MINUTE
    before = TierLayout(PANE, retention, ((MINUTE, retention), (hour, day)), ("",))
    store = store_at(store_backend, before)
    commit_all(store, [[(T0 + 5_000, {"a": "x"}, 1.0, "u1"), (T0 + 5 * hour + 5 * MINUTE, {"a": "x"}, 2.0, "u2"),
                        (T0 + 5 * hour + 20 * MINUTE, {"a": "y"}, 3.0, "u3")]])
    now = T0 + 5 * hour + 40 * MINUTE  # the panes before 5:10 are gone, their hours kept
    batch = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now)
    store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": retention})
    hourly = lambda: [p.count for p in answer(store, stat="count", start=T0, end=T0 + 6 * hour, step=hour,  # noqa: E731
                                              window=hour)[0].points]
    assert hourly() == [1, 0, 0, 0, 0, 2]

    after = TierLayout(PANE, retention, ((MINUTE, retention), (hour, 2 * day)), ("", "a"))
    assert store.configure_tiers({"s": after}, now_ms=now) == ["s"]
    assert hourly() == [1, 0, 0, 0, 0, 2]

    def counts(proj: str) -> dict[int, int]:  # per hour row start, summed over its dimensions
        out: dict[int, int] = defaultdict(int)
        for row in store.read_tier("s", hour, proj, T0, T0 + day, pane_ms=PANE):
            out[row.key.start_ms] += row.data.count
        return dict(out)

    assert counts(ALL_DIMS) == counts("") == {T0: 1, T0 + 5 * hour: 2}
    assert counts("a") == {T0 + 5 * hour: 1}  # new: rolled up from the panes left, no older history
    store.close()


def test_a_cached_window_recomputed_alone_reads_the_granules_of_the_whole_query(store_backend):
    """At the minute tier's keep horizon the hour row still holds minutes the minute rows dropped.
    A 1 h window every 30 min reads minutes (a bucket is 30 min); when a straggler changed one
    window's fingerprint, that window alone was computed again, planned as a one-window query
    (any granule fits): from the hour row, 181 events where the query without a cache says 76,
    and kept under the whole plan's fingerprint."""
    hour = 3_600_000
    layout = TierLayout(PANE, hour, ((MINUTE, hour), (hour, 30 * hour)), ("",))
    store = store_at(store_backend, layout)
    now = T0 + 3 * hour + 35 * MINUTE  # minutes and panes kept from 2:35 on, hours for 30 h

    def commit(batch_id: int, events: list[tuple]) -> None:
        batch = BatchCommit("main", batch_id, events_to_partials(events), len(events),
                            {"s": max(t for t, *_ in events)}, {}, batch_now_ms=now)
        assert store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now,
                                  retention_ms={"s": hour}).committed

    def ask(cache: PointCache | None) -> list[tuple]:
        (series,) = answer(store, stat="p90", start=T0 + 90 * MINUTE, end=T0 + 150 * MINUTE, step=30 * MINUTE,
                           window=hour, cache=cache)
        return [(p.t_ms, p.count, p.value, p.final, p.revision) for p in series.points]

    commit(1, [(T0 + i * MINUTE, {"a": "x"}, float(i % 7), f"u{i}") for i in range(216)])
    cache = PointCache()
    assert ask(cache) == ask(None)
    commit(2, [(T0 + 160 * MINUTE, {"a": "x"}, 3.0, "late")])  # revises the second window only
    assert ask(cache) == ask(None)
    assert [count for _, count, *_ in ask(None)] == [0, 26]
    store.close()


def test_tier_deltas_derive_coarse_rows_from_the_finest_that_can():
    rows = [(T0 + i * PANE, {"a": "xy"[i % 2], "b": "p", "c": "m"}, PaneData(1), 1 + (i == 7)) for i in range(12)]
    deltas = tier_deltas(rows, LAYOUT)
    totals = {(k.granule_ms, k.proj, k.start_ms): d for k, d in deltas.items() if k.proj == ""}
    assert totals[(PANE, "", T0)].data.count == 1
    assert totals[(MINUTE, "", T0)].data.count == 6 and totals[(MINUTE, "", T0)].revision == 1
    assert totals[(MINUTE, "", T0 + MINUTE)].revision == 2
    assert totals[(10 * MINUTE, "", T0)].data.count == 12 and totals[(10 * MINUTE, "", T0)].revision == 2
    by_a = {k.dims: d.data.count for k, d in deltas.items() if k.proj == "a" and k.granule_ms == 10 * MINUTE}
    assert by_a == {'{"a":"x"}': 6, '{"a":"y"}': 6}


def test_the_catalog_declares_tiers(tmp_path):
    from catalog import Catalog

    parse_catalog = Catalog.model_validate
    catalog = parse_catalog({"streams": {"s": {"dimensions": ["a", "b"], "rollup_group_bys": [["b"], ["a", "b"]],
                                               "tiers": [{"every": "1m"}, {"every": "1h", "keep": "90d"}]}}})
    layout = layout_for(catalog.streams["s"])
    assert layout.granules == ((MINUTE, 7 * 86_400_000), (3_600_000, 90 * 86_400_000))
    assert layout.group_bys == ("", "b")  # [a, b] is every dimension: the '*' rows
    assert layout.narrow == ()
    narrow = parse_catalog({"streams": {"s": {"dimensions": ["a"], "tiers": [{"every": "1m", "all_dimensions": False},
                                                                             {"every": "1h"}]}}})
    assert layout_for(narrow.streams["s"]).narrow == (MINUTE,)
    assert layout_for(parse_catalog({"streams": {"s": {"dimensions": ["a"]}}}).streams["s"]).granules_ms() == [
        PANE, MINUTE, 3_600_000]
    for bad, message in (
        ({"tiers": [{"every": "15s"}]}, "multiple of, and coarser than, the pane"),
        ({"tiers": [{"every": "1h"}, {"every": "1m"}]}, "coarser than, the previous tier"),
        ({"tiers": [{"every": "7m"}]}, "divide one day"),
        ({"tiers": [{"every": "1m", "keep": "1d"}]}, "at least the stream's retention"),
        ({"rollup_group_bys": [["nope"]]}, "'nope' is not a dimension"),
        ({"rollup_group_bys": [["a"], ["a"]]}, "declared twice"),
    ):
        with pytest.raises(Exception, match=message):
            parse_catalog({"streams": {"s": {"dimensions": ["a", "b"], **bad}}})


# Tiers kept for different times: the panes 2 days, the minutes 3, the hours 10.
DAY = 86_400_000
KEPT = TierLayout(PANE, 2 * DAY, ((MINUTE, 3 * DAY), (3_600_000, 10 * DAY)), ("", "a"))


@st.composite
def kept_queries(draw):
    """A query over events of [T0, T0 + 6h) asked at a clock that puts the horizons among them."""
    now = T0 + 2 * DAY + draw(st.integers(0, 2 * DAY // PANE)) * PANE + draw(st.sampled_from([0, 1, 4_999]))
    step = draw(st.sampled_from([PANE, MINUTE, 5 * MINUTE, 30 * MINUTE, 60 * MINUTE, 90 * MINUTE, 120 * MINUTE]))
    window = step * draw(st.sampled_from([1, 1, 2, 3]))
    start = T0 - 3_600_000 + step * draw(st.integers(0, 8 * 3_600_000 // step))
    start -= start % step
    end = start + step * draw(st.integers(1, 30))
    group_by = draw(st.sampled_from([(), ("a",), ("b",)]))
    return dict(now=now, start=start, end=end, step=step, window=window, group_by=group_by)


def _plan_of(q):
    n_points = len(range(q["start"], q["end"], q["step"]))
    span_end = q["start"] + (n_points - 1) * q["step"] + q["window"]
    plan = plan_read(KEPT, PANE, q["start"], span_end, q["step"], q["window"], n_points, q["group_by"], q["now"])
    return plan, n_points, span_end


@settings(max_examples=300, deadline=None)
@given(q=kept_queries())
def test_the_planner_reads_no_granule_past_its_keep(q):
    """Every segment reads rows retention still keeps (from the granule's horizon at the clock, a row
    straddling it counted as gone); segments and missing spans tile the range after the horizon of
    every granule; rows fit the buckets."""
    plan, n_points, span_end = _plan_of(q)
    gone = min(kept_from_ms(KEPT, g, q["now"]) for g in KEPT.granules_ms())
    bucket = math.gcd(q["step"], q["window"])
    for seg in plan.segments:
        assert seg.start_ms >= kept_from_ms(KEPT, seg.granule_ms, q["now"]), (seg, q)
        assert seg.start_ms % seg.granule_ms == 0 and seg.end_ms % seg.granule_ms == 0
        if n_points > 1:
            assert bucket % seg.granule_ms == 0
    spans = sorted([(s.start_ms, s.end_ms) for s in plan.segments] + list(plan.missing))
    at = max(q["start"], min(gone, span_end))
    for lo, hi in spans:
        assert lo == at and hi > lo, (spans, q)
        at = hi
    assert at == span_end


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.tuples(st.integers(0, 6 * 3_600_000 - 1), st.sampled_from("xy"), st.sampled_from("pq")),
                       min_size=1, max_size=60),
       asked=st.lists(kept_queries(), min_size=1, max_size=4))
def test_past_a_finer_tiers_keep_the_answer_is_the_events_or_refused(store_backend, events, asked):
    """After retention drops the panes and minutes of old events (the hours kept), a count over
    them is the events' count at every step the planner answers, and the planner answers the
    query (no missing span) whenever its step is a multiple of a granule kept over its range:
    never 0 from rows already dropped."""
    store = store_at(store_backend, KEPT)
    commit_all(store, [[(T0 + t, {"a": a, "b": b}, 1.0, "u") for t, a, b in events]])
    for batch_id, q in enumerate(sorted(asked, key=lambda q: q["now"]), start=1):  # the clock moves forward
        now = q["now"]
        store.commit_batch(BatchCommit("main", batch_id, [], 0, {}, {}, batch_now_ms=now - now % PANE),
                           lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": KEPT.retention_ms})
        plan, n_points, _ = _plan_of(q)
        gone = min(kept_from_ms(KEPT, g, now) for g in KEPT.granules_ms())
        finest = min(g for g in KEPT.granules_ms() if kept_from_ms(KEPT, g, now) <= max(q["start"], gone))
        if q["step"] % finest == 0 and q["window"] % finest == 0:
            assert not plan.missing, q
        if plan.missing:
            continue
        counts: dict[int, int] = defaultdict(int)
        for series in answer(store, stat="count", start=q["start"], end=q["end"], step=q["step"],
                             window=q["window"], group_by=q["group_by"], now_ms=now):
            for p in series.points:
                counts[p.t_ms] += p.count
        for t in range(q["start"], q["end"], q["step"]):
            if t >= gone:
                assert counts.get(t, 0) == sum(1 for e, *_ in events if t <= T0 + e < t + q["window"]), (t, q)
    store.close()
