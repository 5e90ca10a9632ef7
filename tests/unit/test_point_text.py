"""The text GET /api/v1/query writes of a point is written once, when a point cache keeps the
point, and handed with it to every query of its window (store/point_text.py, store/kept_point.py):
the same bytes as writing it again, never another point's text; and the kept points are out of
the cyclic garbage collector's reach (a full pass over a cache of Points took 230-310 ms)."""

from __future__ import annotations

import gc

import pytest

import store.point_text as point_text_module
from store.point_cache import PointCache
from store.point_text import format_point, point_text
from store.rollup import ErrorBound, Point

FP = (1, 1, 1, 1)


def percentile(t: int, value: float) -> Point:
    return Point(t, value, 3, True, 1, ErrorBound("kll", value - 1, value + 1, 0.01, 0.0133, None))


@pytest.fixture
def formatted(monkeypatch) -> list[Point]:
    """The points format_point wrote, in order."""
    seen: list[Point] = []

    def counting(p: Point) -> str:
        seen.append(p)
        return format_point(p)

    monkeypatch.setattr(point_text_module, "format_point", counting)
    return seen


def test_a_kept_points_text_is_written_when_kept_only(formatted):
    cache = PointCache()
    p = percentile(0, 1.5)
    cache.put(("shape", (), 0), FP, p)
    first, again = cache.get(("shape", (), 0), FP), cache.get(("shape", (), 0), FP)
    assert first == again == p and point_text(first) == point_text(again) == format_point(p)
    assert formatted == [p]
    corrected = percentile(0, 9.0)  # a straggler revised the window
    cache.put(("shape", (), 0), (2, 1, 2, 2), corrected)
    assert point_text(cache.get(("shape", (), 0), (2, 1, 2, 2))) == format_point(corrected) != format_point(p)
    assert cache.get(("shape", (), 0), FP) is None


def test_points_no_cache_keeps_are_written_every_time(formatted):
    exact = Point(0, 5.0, 5, True, 1, None)  # an exact stat's point: computed for each answer
    provisional = percentile(60_000, 2.0)._replace(final=False)
    cache = PointCache()
    cache.put(("shape", (), 60_000), FP, provisional)  # provisional points are not kept
    assert cache.get(("shape", (), 60_000), FP) is None
    for p in (exact, exact, provisional, provisional):
        assert point_text(p) == format_point(p)
    assert formatted == [exact, exact, provisional, provisional]


def test_a_copy_of_a_kept_point_is_written_with_its_own_numbers():
    cache = PointCache()
    cache.put(("shape", (), 0), FP, percentile(0, 1.5))
    changed = cache.get(("shape", (), 0), FP)._replace(value=7.0, final=False)
    assert point_text(changed) == format_point(percentile(0, 1.5)._replace(value=7.0, final=False))


def test_a_kept_chunks_points_carry_their_texts_written_once(formatted):
    """A chunk of a view's final windows (store/series.py) keeps its points' texts beside them: an
    exact stat's points, kept in chunks only, are written once too."""
    cache = PointCache(max_points=400)
    exact = {t: Point(t, 7.0 + t, 7, True, 1, None) for t in range(0, 600_000, 60_000)}
    cache.keep_chunks("view", {0: ("v", {(): exact})})
    for _ in range(3):
        (chunk,) = cache.final_chunks("view", {0: "v"})[0].values()
        assert chunk == exact and [point_text(p) for p in chunk.values()] == [format_point(p) for p in exact.values()]
    assert formatted == [*exact.values()]  # when kept (format_point here is the module's own)


def test_a_caches_points_are_out_of_the_collectors_reach():
    """A full collection walks every tracked object: a cache's points, their error bounds and
    entries must not be among them, however many it keeps, by window or in chunks."""
    gc.collect()
    before = len(gc.get_objects())
    cache = PointCache(max_points=40_000)
    cache.put_many([(("p99", (), t), (1, 1, t, 1), percentile(t, t / 7)) for t in range(20_000)])
    for c in range(0, 9_000, 60):
        cache.keep_chunks(("count",), {c: (f"v{c}", {(): {t: Point(t, float(t), t, True, 1, None)
                                                           for t in range(c, c + 60)}})})
    for _ in range(4):  # a tuple is untracked at the pass after the tuples in it are
        gc.collect()
    assert len(gc.get_objects()) - before < 100  # not the ~60 000 objects of 29 000 points
    assert cache.get(("p99", (), 700), (1, 1, 700, 1)) == percentile(700, 100.0)
    assert cache.final_chunks(("count",), {120: "v120"})[120][()][150] == Point(150, 150.0, 150, True, 1, None)
