"""store.rollup against exact computation over the raw events the panes were built from."""

from __future__ import annotations

import bisect
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from store.panes import Pane, PaneData, PaneKey, ValueStats, dims_key, pane_start
from store.rollup import (
    ErrorBound,
    Point,
    RollupError,
    Series,
    align_range,
    rollup,
    window_points,
)

PANE = 10_000


@dataclass(frozen=True)
class Event:
    t_ms: int
    value: float | None = None
    user: str | None = None
    dims: dict[str, str] = field(default_factory=dict)


def make_panes(events: Sequence[Event], pane_ms: int = PANE, revision: int = 1) -> list[Pane]:
    """Panes as the aggregator would store them: real KLL and HLL bytes."""
    by_key: dict[tuple[int, str], list[Event]] = defaultdict(list)
    for e in events:
        by_key[(pane_start(e.t_ms, pane_ms), dims_key(e.dims))].append(e)
    panes = []
    for (start, dims), evs in by_key.items():
        values = [e.value for e in evs if e.value is not None]
        data = PaneData(count=len(evs))
        stats: dict[str, ValueStats] = {}
        if values:
            kll = KllSketch()
            for v in values:
                kll.update(v)
            stats["v"] = ValueStats(n=len(values), sum=math.fsum(values), min=min(values), max=max(values), kll=kll.to_bytes())
        distincts: dict[str, bytes] = {}
        users = [e.user for e in evs if e.user is not None]
        if users:
            hll = HllSketch()
            for u in users:
                hll.update(u)
            distincts["user"] = hll.to_bytes()
        data = PaneData(count=len(evs), values=stats, distincts=distincts)
        panes.append(Pane(PaneKey("s", start, dims), start + pane_ms, data, revision, 0, 0))
    return panes


def run(panes, stat="count", *, start=0, end=60_000, step=PANE, window=None, quantile=None, **kw) -> list[Series]:
    return rollup(
        panes,
        stat=stat,
        quantile=quantile,
        value_field=kw.pop("value_field", "v"),
        distinct_field=kw.pop("distinct_field", "user"),
        start_ms=start,
        end_ms=end,
        step_ms=step,
        window_ms=window,
        pane_ms=kw.pop("pane_ms", PANE),
        **kw,
    )


def exact(events: Sequence[Event], stat: str, t: int, window: int) -> tuple[float | None, int]:
    inside = [e for e in events if t <= e.t_ms < t + window]
    values = [e.value for e in inside if e.value is not None]
    value: float | None
    if stat == "count":
        value = float(len(inside))
    elif stat == "rate":
        value = len(inside) / (window / 1000)
    elif stat == "sum":
        value = float(sum(values))
    elif stat == "avg":
        value = sum(values) / len(values) if values else None
    elif stat == "min":
        value = min(values, default=None)
    else:
        value = max(values, default=None)
    return value, len(inside)


SCALAR_STATS = ("count", "rate", "sum", "avg", "min", "max")


@st.composite
def queries(draw, hopping: bool):
    """A query (start, end, step, window) and events around and inside its windows."""
    step = PANE * draw(st.sampled_from([1, 2, 3, 6]))
    if hopping:
        # Any pane multiple >= step, so windows that are not whole steps are covered too.
        window = step + PANE * draw(st.integers(0, 12))
    else:
        window = step
    start = step * draw(st.integers(-3, 3))
    n_points = draw(st.integers(1, 12))
    end = start + step * n_points - draw(st.integers(0, step - 1))  # end need not be aligned
    lo, hi = start - 2 * window, start + n_points * step + 2 * window
    dims = st.fixed_dictionaries({}, optional={"region": st.sampled_from(["eu", "us"]), "tier": st.sampled_from(["a", "b"])})
    value = st.none() | st.integers(-1000, 1000).map(float)  # whole numbers: sums are exact in any order
    events = draw(st.lists(st.builds(Event, st.integers(lo, hi - 1), value, st.none(), dims), max_size=60))
    return start, end, step, window, events


def check_against_exact(series: Series, events: Sequence[Event], stat: str, start: int, end: int, step: int, window: int):
    assert [p.t_ms for p in series.points] == list(range(start, end, step))
    for p in series.points:
        value, count = exact(events, stat, p.t_ms, window)
        assert (p.value, p.count) == (value, count), (stat, p)
        assert p.error is None


@settings(max_examples=60, deadline=None)
@given(queries(hopping=False))
def test_tumbling_windows_equal_exact_computation(query):
    start, end, step, window, events = query
    panes = make_panes(events)
    for stat in SCALAR_STATS:
        (series,) = run(panes, stat, start=start, end=end, step=step)
        assert series.group == {}
        check_against_exact(series, events, stat, start, end, step, window)


@settings(max_examples=60, deadline=None)
@given(queries(hopping=True))
def test_hopping_windows_equal_exact_computation(query):
    start, end, step, window, events = query
    panes = make_panes(events)
    for stat in SCALAR_STATS:
        (series,) = run(panes, stat, start=start, end=end, step=step, window=window)
        check_against_exact(series, events, stat, start, end, step, window)


def test_hopping_window_of_three_steps():
    events = [Event(t, value=float(t // 1000)) for t in range(0, 120_000, 5_000)]
    (series,) = run(make_panes(events), "sum", start=0, end=120_000, step=20_000, window=60_000)
    for p in series.points:
        assert p.value == sum(float(t // 1000) for t in range(p.t_ms, p.t_ms + 60_000, 5_000) if t < 120_000)
        assert p.count == len([t for t in range(p.t_ms, p.t_ms + 60_000, 5_000) if t < 120_000])


@settings(max_examples=40, deadline=None)
@given(queries(hopping=True), st.sampled_from([None, "eu", "us", ""]))
def test_group_by_and_filters(query, region_filter):
    start, end, step, window, events = query
    panes = make_panes(events)
    filters = {"region": region_filter} if region_filter is not None else None
    kept = [e for e in events if region_filter is None or e.dims.get("region", "") == region_filter]
    in_range = [e for e in kept if start <= e.t_ms < start + (len(range(start, end, step)) - 1) * step + window]
    expected_groups = sorted({e.dims.get("tier", "") for e in in_range})
    for stat in ("count", "sum", "max"):
        out = run(panes, stat, start=start, end=end, step=step, window=window, group_by=["tier"], filters=filters)
        assert [s.group for s in out] == [{"tier": g} for g in expected_groups]
        for series in out:
            mine = [e for e in kept if e.dims.get("tier", "") == series.group["tier"]]
            check_against_exact(series, mine, stat, start, end, step, window)


def test_group_by_two_dims_sorted_and_missing_dim_reads_empty():
    events = [
        Event(1_000, 1.0, dims={"region": "us", "tier": "b"}),
        Event(2_000, 2.0, dims={"region": "eu", "tier": "b"}),
        Event(3_000, 3.0, dims={"region": "eu"}),
        Event(4_000, 4.0, dims={"tier": "a"}),
    ]
    out = run(make_panes(events), "sum", end=10_000, group_by=("region", "tier"))
    assert [s.group for s in out] == [
        {"region": "", "tier": "a"},
        {"region": "eu", "tier": ""},
        {"region": "eu", "tier": "b"},
        {"region": "us", "tier": "b"},
    ]
    assert [s.points[0].value for s in out] == [4.0, 3.0, 2.0, 1.0]
    # Filtering on a missing dimension matches the empty string.
    (only,) = run(make_panes(events), "sum", end=10_000, filters={"region": ""})
    assert only.points[0].value == 4.0


def test_empty_windows_still_produce_points():
    events = [Event(5_000, 7.0, user="u1")]
    panes = make_panes(events)
    expected_empty = {"count": 0.0, "rate": 0.0, "sum": 0.0, "distinct": 0.0, "avg": None, "min": None, "max": None, "p50": None}
    for stat, empty in expected_empty.items():
        (series,) = run(panes, stat, end=40_000, quantile=0.5 if stat == "p50" else None)
        assert len(series.points) == 4
        first, *rest = series.points
        assert first.count == 1 and first.value is not None and first.value > 0
        for p in rest:
            assert (p.count, p.value, p.revision, p.error) == (0, empty, 0, None)


def test_no_panes_ungrouped_gives_one_empty_series_grouped_gives_none():
    (series,) = run([], "avg", end=30_000)
    assert series.group == {}
    assert [(p.t_ms, p.value, p.count) for p in series.points] == [(0, None, 0), (10_000, None, 0), (20_000, None, 0)]
    assert run([], "avg", end=30_000, group_by=["region"]) == []
    # A filter that matches nothing is the same as no panes.
    (series,) = run(make_panes([Event(1, 1.0)]), "count", end=10_000, filters={"region": "mars"})
    assert series.points[0].count == 0


def test_panes_outside_the_windows_are_ignored():
    events = [Event(t, 1.0) for t in (-10_000, -1, 0, 29_999, 30_000, 45_000)]
    (series,) = run(make_panes(events), "count", end=30_000)
    assert [p.count for p in series.points] == [1, 0, 1]
    # The last sliding window reaches past end: it covers [20 s, 50 s).
    (series,) = run(make_panes(events), "count", end=30_000, window=30_000)
    assert [p.count for p in series.points] == [2, 2, 3]


def test_groups_and_sketches_only_from_panes_inside_the_windows():
    events = [Event(5_000, 1.0, dims={"tier": "a"}), Event(40_000, 1.0, dims={"tier": "late"})]
    out = run(make_panes(events), "count", end=20_000, group_by=["tier"])
    assert [s.group for s in out] == [{"tier": "a"}]
    # A pane past the last window is never deserialized, even for a sketch stat.
    garbage = PaneData(count=1, distincts={"user": b"not a sketch"})
    panes = make_panes([Event(5_000, user="u")]) + [Pane(PaneKey("s", 20_000, dims_key({})), 30_000, garbage, 1, 0, 0)]
    (series,) = run(panes, "distinct", end=20_000)
    assert [p.value for p in series.points] == [pytest.approx(1.0), 0.0]


def test_sum_is_exactly_rounded_per_bucket_whatever_the_pane_order():
    # Cancelling magnitudes: naive summation gives a different answer for each order.
    sums = [1e16, 1.0, -1e16, 3.0, 1e16, -1e16, 0.5, 2.0**-30] * 3
    panes = [
        Pane(PaneKey("s", 0, dims_key({"k": str(i)})), PANE, PaneData(1, {"v": ValueStats(1, x, x, x)}), 1, 0, 0)
        for i, x in enumerate(sums)
    ]
    rng = random.Random(3)
    for _ in range(20):
        rng.shuffle(panes)
        (series,) = run(panes, "sum", end=PANE)
        assert series.points[0].value == math.fsum(sums)


def test_final_flag_follows_the_watermark():
    panes = make_panes([Event(1_000, 1.0)])
    (series,) = run(panes, end=40_000, watermark_ms=20_000)
    assert [p.final for p in series.points] == [True, True, False, False]
    (series,) = run(panes, end=40_000, window=20_000, watermark_ms=20_000)
    assert [p.final for p in series.points] == [True, False, False, False]
    (series,) = run(panes, end=40_000, watermark_ms=None)
    assert not any(p.final for p in series.points)


def test_revision_is_the_max_over_the_window():
    panes = make_panes([Event(1_000, 1.0)], revision=3) + make_panes([Event(11_000, 1.0)], revision=7)
    panes += make_panes([Event(12_000, 1.0, dims={"tier": "a"})], revision=2)
    (series,) = run(panes, end=40_000)
    assert [p.revision for p in series.points] == [3, 7, 0, 0]
    (series,) = run(panes, end=40_000, window=20_000)
    assert [p.revision for p in series.points] == [7, 7, 0, 0]


def test_percentiles_within_kll_rank_error():
    rng = random.Random(7)
    values = [rng.lognormvariate(3.0, 1.0) for _ in range(20_000)]
    # Spread over 10 min of 10 s panes and two dims, so the query merges many sketches.
    events = [Event(rng.randrange(0, 600_000), v, dims={"tier": rng.choice("ab")}) for v in values]
    panes = make_panes(events)
    exact_sorted = sorted(values)
    for q in (0.01, 0.25, 0.5, 0.9, 0.99):
        (series,) = run(panes, f"p{q * 100:g}", quantile=q, end=600_000, step=600_000)
        (p,) = series.points
        rank = bisect.bisect_right(exact_sorted, p.value) / len(exact_sorted)
        assert abs(rank - q) <= 0.0133, (q, rank)
        assert p.count == 20_000
        assert isinstance(p.error, ErrorBound) and p.error.kind == "kll"
        assert p.error.lower <= p.value <= p.error.upper
        assert 0 < p.error.rank_error <= 0.0133 + 1e-4
        assert p.error.relative_error is None
    # Hopping windows merge bucket sketches per point; check them against exact data too.
    (series,) = run(panes, "p90", quantile=0.9, end=600_000, step=60_000, window=180_000)
    for p in series.points:
        inside = sorted(e.value for e in events if p.t_ms <= e.t_ms < p.t_ms + 180_000)
        rank = bisect.bisect_right(inside, p.value) / len(inside)
        assert abs(rank - 0.9) <= 0.0133, (p.t_ms, rank)


def test_distinct_within_three_hll_standard_errors():
    rng = random.Random(11)
    # 30k users, each seen in several panes: the merge must not double count.
    events = [Event(rng.randrange(0, 600_000), user=f"user-{rng.randrange(30_000)}") for _ in range(90_000)]
    panes = make_panes(events)
    for step, window in ((600_000, None), (60_000, None), (60_000, 180_000)):
        (series,) = run(panes, "distinct", end=600_000, step=step, window=window)
        for p in series.points:
            w = window or step
            truth = len({e.user for e in events if p.t_ms <= e.t_ms < p.t_ms + w})
            assert abs(p.value - truth) <= 3 * 0.0162 * truth, (p.t_ms, p.value, truth)
            assert p.error is not None and p.error.kind == "hll"
            assert p.error.lower <= p.value <= p.error.upper
            assert p.error.relative_error == pytest.approx(0.0162, abs=0.001)
            assert p.error.rank_error is None


@settings(max_examples=40, deadline=None)
@given(
    queries(hopping=True),
    st.lists(st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False), min_size=60, max_size=60),
    st.randoms(use_true_random=False),
)
def test_pane_order_does_not_change_results(query, floats, rnd):
    start, end, step, window, events = query
    # Arbitrary floats this time: sums must not depend on the order panes arrive in.
    events = [Event(e.t_ms, floats[i] if e.value is not None else None, dims=e.dims) for i, e in enumerate(events)]
    panes = make_panes(events)
    shuffled = list(panes)
    rnd.shuffle(shuffled)
    for stat in ("count", "sum", "min", "max", "avg"):
        kw = dict(start=start, end=end, step=step, window=window, group_by=["tier"])
        assert run(panes, stat, **kw) == run(shuffled, stat, **kw)
        assert run(panes, stat, **kw) == run(iter(reversed(panes)), stat, **kw)


def test_unneeded_sketches_are_not_deserialized():
    garbage = PaneData(count=2, values={"v": ValueStats(2, 3.0, 1.0, 2.0, kll=b"not a sketch")}, distincts={"user": b"nope"})
    panes = [Pane(PaneKey("s", 0, dims_key({})), PANE, garbage, 1, 0, 0)]
    for stat in SCALAR_STATS:
        (series,) = run(panes, stat, end=PANE)
        assert series.points[0].count == 2
    with pytest.raises(Exception):
        run(panes, "distinct", end=PANE)


def test_point_and_series_shapes():
    (series,) = run(make_panes([Event(0, 2.0)]), "rate", end=10_000)
    assert series == Series(group={}, points=[Point(t_ms=0, value=0.1, count=1, final=False, revision=1, error=None)])


def test_window_points_and_align_range():
    assert window_points(0, 30_000, 10_000) == range(0, 30_000, 10_000)
    assert list(window_points(-20_000, 1, 10_000)) == [-20_000, -10_000, 0]
    assert align_range(12_345, 67_890, 10_000) == (10_000, 70_000)
    assert align_range(10_000, 70_000, 10_000) == (10_000, 70_000)
    assert align_range(-1, 1, 10_000) == (-10_000, 10_000)
    with pytest.raises(RollupError, match="step_ms"):
        align_range(0, 10, 0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pane_ms": 0}, "pane_ms must be positive"),
        ({"step": 0}, "step_ms must be a positive multiple of the pane size"),
        ({"step": -10_000}, "step_ms must be a positive multiple"),
        ({"step": 15_000}, "step_ms must be a positive multiple of the pane size 10000 ms, got 15000"),
        ({"window": 25_000}, "window_ms must be a positive multiple of the pane size 10000 ms, got 25000"),
        ({"window": 0}, "window_ms must be a positive multiple"),
        ({"step": 20_000, "window": 10_000}, "window_ms must be at least step_ms"),
        ({"start": 5_000}, "start_ms must be a multiple of step_ms"),
        ({"start": 10_000, "step": 20_000}, "start_ms must be a multiple of step_ms \\(20000\\), got 10000"),
        ({"end": 0}, "end_ms must be after start_ms"),
        ({"end": 110_001, "max_points": 11}, "asks for 12 points, more than the limit of 11"),
        ({"stat": "median"}, "unknown stat 'median'"),
        ({"stat": "p99"}, "needs a quantile within \\[0, 1\\], got None"),
        ({"stat": "p99", "quantile": 99.0}, "needs a quantile within \\[0, 1\\], got 99.0"),
        ({"stat": "p99", "quantile": 0.99, "value_field": None}, "stat 'p99' needs a value field"),
        ({"stat": "avg", "value_field": None}, "stat 'avg' needs a value field"),
        ({"stat": "distinct", "distinct_field": None}, "stat 'distinct' needs a distinct field"),
    ],
)
def test_rollup_errors(overrides, message):
    kw = dict(overrides)
    stat = kw.pop("stat", "count")
    with pytest.raises(RollupError, match=message) as info:
        run([], stat, **kw)
    assert isinstance(info.value, ValueError)


def test_max_points_boundary_is_inclusive():
    (series,) = run([], "count", end=110_000, max_points=11)
    assert len(series.points) == 11


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 119), st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False)),
                          st.integers(1, 3)), max_size=150),
       st.sampled_from([(PANE, 3 * PANE), (2 * PANE, 6 * PANE), (PANE, 7 * PANE), (3 * PANE, 4 * PANE)]),
       st.integers(0, 20), st.integers(1, 60))
def test_sliding_percentiles_equal_the_merge_of_each_windows_panes(events, step_window, first, points):
    """A sliding KLL window (store.rollup._slide_kll: two stacks of bare sketches, counts and
    revisions apart) answers what merging its panes' sketches answers: under k items a merge is
    exact, so value and bounds are equal; panes without values count but hold no sketch."""
    step, window = step_window
    panes = []
    for revision in (1, 2, 3):
        evs = [Event(i * PANE + 1, value=v) for i, v, r in events if r == revision]
        panes += make_panes(evs, revision=revision)
    by_start: dict[int, list[Pane]] = defaultdict(list)
    for p in panes:
        by_start[p.key.start_ms].append(p)
    start = first * step
    end = start + points * step
    (series,) = rollup(panes, stat="p90", quantile=0.9, value_field="v", distinct_field=None, start_ms=start,
                       end_ms=end, step_ms=step, window_ms=window, pane_ms=PANE)
    for p in series.points:
        inside = [pane for t in range(p.t_ms, p.t_ms + window, PANE) for pane in by_start.get(t, [])]
        blobs = [pane.data.values["v"].kll for pane in inside if "v" in pane.data.values]
        want = KllSketch.merge_all(blobs).quantile(0.9) if blobs else None
        assert p.count == sum(pane.data.count for pane in inside)
        assert p.revision == max((pane.revision for pane in inside), default=0)
        assert p.value == (want.value if want else None)
        assert p.error == (ErrorBound("kll", lower=want.lower, upper=want.upper, rank_error=want.rank_error)
                           if want else None)


@pytest.fixture
def frozen_heap():
    """The objects that exist before the test, none of them one it counts, in the collector's
    permanent generation while it runs: a gc.collect() per point walked the whole heap of a
    pytest-xdist worker, grown by the tests before it (80 s for the p99 case's 60 points in
    `make test`'s JVM-free run, under a second alone). What it finds collectable is the same."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("stat, kind", [("p99", KllSketch), ("distinct", HllSketch)])
def test_a_sketch_rollup_holds_the_sketches_of_a_window_not_of_the_whole_range(stat, kind, monkeypatch, frozen_heap):
    """A cold day at 1-minute steps is 1 440 rows, each its bucket's sketch: made, asked for its
    point and let go one after the other, not all held at once with the sorted views their
    quantiles build (~25 MB a query faulted in and gave back). The points are the same."""
    import gc
    import weakref

    import store.rollup as rollup_module
    from store.rollup import SketchRow, rollup_sketch_rows

    t0 = 1_700_000_040_000
    rows = []
    for i in range(30):
        sketch = kind()
        for v in range(30):  # a window of 5 rows holds 150 items: under k, no (random) compaction
            sketch.update(float(i * 100 + v) if kind is KllSketch else f"u{i}-{v}")
        rows.append(SketchRow(t0 + i * 60_000, "{}", 30, 1, sketch.to_bytes(), 1))
    ask = dict(stat=stat, quantile=0.99 if stat == "p99" else None, value_field="v" if stat == "p99" else None,
               distinct_field="u" if stat == "distinct" else None, start_ms=t0, end_ms=t0 + 30 * 60_000,
               step_ms=60_000, window_ms=None, pane_ms=10_000)
    alive: list[weakref.ref] = []
    most = 0

    def tracking(make):
        def made(*args):
            sketch = make(*args)
            alive.append(weakref.ref(sketch))
            return sketch
        return made

    def counting(point):
        def counted(*args):
            nonlocal most
            gc.collect()  # of what came after the freeze (frozen_heap): the sketches this test makes
            most = max(most, sum(ref() is not None for ref in alive))
            return point(*args)
        return counted

    expected = rollup_sketch_rows(rows, **ask)
    monkeypatch.setattr(kind, "merge_all", tracking(kind.merge_all))
    monkeypatch.setattr(kind, "from_bytes", tracking(kind.from_bytes))
    monkeypatch.setattr(rollup_module, "_point", counting(rollup_module._point))
    [series] = rollup_sketch_rows(rows, **ask)
    assert [series] == expected and len(series.points) == 30 and all(p.value for p in series.points)
    assert len(alive) == 30 and most == 1
    if kind is KllSketch:  # a sliding window of 5 buckets: its buckets' sketches, not the day's, at a point
        alive.clear()
        most = 0
        sliding = {**ask, "window_ms": 5 * 60_000}
        monkeypatch.undo()
        expected = rollup_sketch_rows(rows, **sliding)
        monkeypatch.setattr(kind, "from_bytes", tracking(kind.from_bytes))
        monkeypatch.setattr(rollup_module, "_point", counting(rollup_module._point))
        assert rollup_sketch_rows(rows, **sliding) == expected
        assert len(alive) == 30 and most <= 2 * 5


@pytest.mark.parametrize("stat", ["sum", "avg"])
def test_a_sliding_windows_sum_is_exact_whatever_the_ranges_start(stat):
    """A window's sum of its buckets does not depend on the order the sliding stacks meet them,
    so the same window asked in two ranges (a dashboard's moving range, a kept chunk of final
    windows: store/series.py) is the same number, and it is the exact sum even where values
    cancel (1e16 + 1 - 1e16 is 1.0)."""
    from store.rollup import BucketStats, rollup_buckets

    minute = 60_000
    values = [(1e16, 1.0, -1e16, 0.1, 0.2, 0.3)[m % 6] for m in range(80)]
    for start in range(6):  # the range starting 0-5 minutes later: other stacks
        rows = [BucketStats((), m - start, 1, 1, 1, values[m], values[m], values[m], 1, 1) for m in range(start, 80)]
        [series] = rollup_buckets(rows, stat=stat, value_field="v", start_ms=start * minute, end_ms=70 * minute,
                                  step_ms=minute, window_ms=4 * minute, pane_ms=10_000)
        for p in series.points:
            m = p.t_ms // minute
            exact = math.fsum(values[m:m + 4])
            assert p.value == (exact if stat == "sum" else exact / 4), (start, m)
