"""rollup_buckets' tumbling points made straight from one BucketStats per group and bucket
(store/rollup.py `_tumbling_points`) are _finish's, point for point."""

import math

import pytest
from hypothesis import given, settings, strategies as st

import store.rollup as rollup_module
from store.rollup import BucketStats, rollup_buckets

STEP = 60_000
START = 1_700_000_040_000  # a multiple of the step

values = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=64),
                   st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324]))


@st.composite
def bucket_rows(draw, unique: bool):
    groups = draw(st.lists(st.sampled_from([("a",), ("b",), ("",), ("c",)]), min_size=0, max_size=3, unique=True))
    rows, seen = [], set()
    for group in groups:
        for bucket in draw(st.lists(st.integers(-2, 9), max_size=8)):
            if unique and (group, bucket) in seen:
                continue
            seen.add((group, bucket))
            n = draw(st.integers(0, 3))
            lo, hi = sorted([draw(values), draw(values)]) if n else (None, None)
            rows.append(BucketStats(group, bucket, draw(st.integers(0, 10**6)), draw(st.integers(0, 5)), n,
                                    draw(values) if n else 0.0, lo, hi, draw(st.integers(0, 100)), 1))
    return rows


def both(rows, stat, points, watermark_ms, group_by, monkeypatch):
    def ask():
        return rollup_buckets(list(rows), stat=stat, value_field=None if stat in ("count", "rate") else "v",
                              start_ms=START, end_ms=START + points * STEP, step_ms=STEP, window_ms=None,
                              pane_ms=10_000, group_by=group_by, watermark_ms=watermark_ms)

    made = []
    real = rollup_module._tumbling_points
    with monkeypatch.context() as m:
        m.setattr(rollup_module, "_tumbling_points", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
        fast = ask()
    assert made and made[-1] is not None  # the tumbling points answered, not _finish
    with monkeypatch.context() as m:
        m.setattr(rollup_module, "_tumbling_points", lambda *a, **k: None)
        slow = ask()
    return fast, slow


def same(a, b) -> bool:
    """Equal, a float's sign of zero included (it shows in the JSON)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(rows=bucket_rows(unique=True), stat=st.sampled_from(["count", "rate", "sum", "avg", "min", "max"]),
       points=st.integers(1, 8), watermark=st.one_of(st.none(), st.integers(-3, 10)), grouped=st.booleans())
def test_tumbling_points_are_finishs(rows, stat, points, watermark, grouped):
    monkeypatch = pytest.MonkeyPatch()
    if not grouped:
        rows = [r._replace(group=()) for r in {r.bucket: r for r in rows}.values()]
    watermark_ms = None if watermark is None else START + watermark * STEP + (watermark % 2) * 7_000
    fast, slow = both(rows, stat, points, watermark_ms, ("endpoint",) if grouped else (), monkeypatch)
    assert [s.group for s in fast] == [s.group for s in slow]
    for f, s in zip(fast, slow):
        assert len(f.points) == len(s.points)
        for p, q in zip(f.points, s.points):
            assert all(same(x, y) for x, y in zip(p, q)), (p, q)


def test_several_rows_in_a_bucket_are_added_up_by_finish():
    rows = [BucketStats(("a",), 0, 3, 1, 1, 2.0, 2.0, 2.0, 5, 1), BucketStats(("a",), 0, 4, 2, 1, 5.0, 5.0, 5.0, 6, 1)]
    series = rollup_buckets(rows, stat="sum", value_field="v", start_ms=START, end_ms=START + STEP, step_ms=STEP,
                            window_ms=None, pane_ms=10_000, group_by=("endpoint",))
    assert [(p.value, p.count, p.revision) for p in series[0].points] == [(7.0, 7, 2)]
