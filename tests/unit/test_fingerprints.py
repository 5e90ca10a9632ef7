"""A window's fingerprint (store/series.py `_fingerprints`): per group and window, the sums over
the window's buckets of events, rows, newest batch and highest revision, which decide whether a
kept point is reused (store/point_cache.py). Computed with prefix sums over all groups at once;
checked here against summing each window's buckets one by one."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from store.rollup import BucketStats, window_points
from store.series import _fingerprints


def naive(sums, start_ms, end_ms, step_ms, window_ms):
    points = list(window_points(start_ms, end_ms, step_ms))
    bucket_ms = math.gcd(step_ms, window_ms)
    out = {}
    for group in {b.group for b in sums}:
        windows = []
        for i, _ in enumerate(points):
            if len(points) == 1:
                inside = [b for b in sums if b.group == group]  # one window: every bucket lands in it
            else:
                first = i * step_ms // bucket_ms
                inside = [b for b in sums if b.group == group and first <= b.bucket < first + window_ms // bucket_ms]
            windows.append(tuple(sum(getattr(b, f) for b in inside) for f in ("count", "rows", "last_batch", "revision")))
        out[group] = windows
    return out


@st.composite
def cases(draw):
    step = draw(st.sampled_from([10, 20, 60]))
    window = step * draw(st.integers(1, 4))
    points = draw(st.integers(1, 8))
    bucket = math.gcd(step, window)
    buckets = 1 if points == 1 else ((points - 1) * step + window) // bucket
    sums = draw(st.lists(st.builds(
        BucketStats, st.sampled_from([(), ("a",), ("b",), ("a", "x")]), st.integers(0, buckets - 1),
        st.integers(0, 10**6), st.integers(0, 50), last_batch=st.integers(0, 10**4), rows=st.integers(1, 9)),
        max_size=40))  # a bucket may come twice (two tiers' segments at a ragged edge): both add
    return sums, 0, points * step, step, window


@settings(max_examples=300, deadline=None)
@given(cases())
def test_fingerprints_are_each_windows_sums(case):
    assert _fingerprints(*case) == naive(*case)
