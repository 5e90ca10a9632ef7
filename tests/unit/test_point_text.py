"""The text GET /api/v1/query writes of a point is written once while a point cache holds the
point (store/point_text.py): the same bytes as writing it again, never another point's text, and
nothing kept of points no cache holds."""

from __future__ import annotations

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


def test_a_held_points_text_is_written_at_its_first_answer_only(formatted):
    cache = PointCache()
    p = percentile(0, 1.5)
    cache.put(("shape", (), 0), FP, p)
    assert point_text(p) == point_text(p) == format_point(p)
    assert formatted == [p]


def test_points_no_cache_holds_are_written_every_time_and_not_kept(formatted):
    before = len(point_text_module._TEXTS)
    exact = Point(0, 5.0, 5, True, 1, None)  # an exact stat's point: computed for each answer
    provisional = percentile(60_000, 2.0)._replace(final=False)
    PointCache().put(("shape", (), 60_000), FP, provisional)  # provisional points are not kept
    for p in (exact, exact, provisional, provisional):
        assert point_text(p) == format_point(p)
    assert formatted == [exact, exact, provisional, provisional]
    assert len(point_text_module._TEXTS) == before


def test_texts_go_with_the_points_the_cache_lets_go():
    cache = PointCache(max_points=2)
    points = [percentile(i * 60_000, float(i)) for i in range(3)]
    for p in points:
        cache.put(("shape", (), p.t_ms), FP, p)
        point_text(p)
    assert id(points[0]) not in point_text_module._TEXTS  # evicted
    cache.put(("shape", (), points[1].t_ms), FP, percentile(points[1].t_ms, 9.0))  # a corrected window
    assert id(points[1]) not in point_text_module._TEXTS
    cache.clear()
    assert id(points[2]) not in point_text_module._TEXTS


def test_a_point_made_where_a_let_go_one_was_is_written_with_its_own_numbers():
    """CPython gives a new object the id of one freed: a text kept by id must leave with its point."""
    cache = PointCache(max_points=1)
    for i in range(300):
        p = percentile(0, float(i))
        cache.put(("shape", (), i), FP, p)  # evicts the one before, which is then freed
        assert point_text(p) == format_point(p)


def test_a_kept_chunk_holds_its_points_texts_with_the_windows_that_hold_them(formatted):
    """A point kept by window and in a chunk (store/series.py reuses a view's final windows) keeps
    its text while either holds it; an exact stat's points, kept in a chunk only, too."""
    cache = PointCache(max_points=400)  # chunks: 100 points at most
    by_window = percentile(0, 1.5)
    exact = Point(60_000, 7.0, 7, True, 1, None)
    cache.put(("shape", (), 0), FP, by_window)
    cache.keep_chunks("view", {0: ("v", {0: by_window, 60_000: exact})})
    assert point_text(exact) == point_text(exact) and formatted == [exact]
    cache.keep_chunks("other", {0: ("v", {t: percentile(t, 2.0) for t in range(100)})})  # "view" let go
    assert id(exact) not in point_text_module._TEXTS
    assert point_text(by_window) == point_text(by_window) and formatted == [exact, by_window]
    cache.clear()
    assert id(by_window) not in point_text_module._TEXTS
