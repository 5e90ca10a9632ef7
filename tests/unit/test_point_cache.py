"""The point cache's batched calls (store/point_cache.py get_many / put_many, one hold of its
lock for a query's points) keep and answer exactly what the one-at-a-time calls do: final points
only, a point only for its window's fingerprint, hits and misses counted, least recent evicted,
and the same points handed to the store to keep, in the same order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from store.point_cache import PointCache
from store.point_text import format_point
from store.rollup import Point

keys = st.sampled_from([("shape", (), t) for t in range(6)])
fingerprints = st.sampled_from([(1, 1, 1, 0), (2, 1, 3, 1)])
points = st.builds(Point, st.integers(0, 5), st.floats(allow_nan=False), st.integers(0, 9), st.booleans(),
                   st.integers(0, 3), st.none())
puts = st.lists(st.tuples(keys, fingerprints, points), max_size=12)
gets = st.lists(st.tuples(keys, fingerprints), max_size=12)


class Backing:
    """What the cache hands the store to keep (store/final_points.py), in order."""

    def __init__(self):
        self.saved: list = []

    def save_soon(self, entries) -> None:
        self.saved.extend(entries)

    def clear(self) -> None:
        self.saved.clear()


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(puts, gets), max_size=4), size=st.integers(1, 5))
def test_batched_calls_do_what_one_at_a_time_calls_do(steps, size):
    one, many = PointCache(max_points=size, backing=Backing()), PointCache(max_points=size, backing=Backing())
    for put, get in steps:
        for key, fingerprint, point in put:
            one.put(key, fingerprint, point)
        many.put_many(put)
        one.save(), many.save()
        assert many.backing.saved == one.backing.saved
        assert many.get_many(get) == [one.get(*item) for item in get]
        assert list(many._entries.items()) == list(one._entries.items())  # same points, same recency
        assert (many.hits, many.misses, len(many)) == (one.hits, one.misses, len(one))
    # What reaches the store: the final points only, each as it was put, in the order put, with its text.
    assert many.backing.saved == [(*key, fp, p, None, format_point(p)) for put, _ in steps for key, fp, p in put
                                  if p.final]


def test_chunks_of_final_windows_are_kept_within_a_quarter_of_the_caches_points():
    """A chunk holds points the cache may have let go (store/series.py reuses them while the rows
    under them are unchanged): they count against a budget of their own, the oldest asked go first."""
    from store.rollup import Point

    cache = PointCache(max_points=400)  # a budget of 100 points of chunks

    def chunk(n: int) -> dict[tuple, dict[int, Point]]:  # an ungrouped view's: one group, ()
        return {(): {t: Point(t, 1.0, 1, True, 1, None) for t in range(n)}}

    def kept(c: int, validity: str = "v") -> bool:
        return c in cache.final_chunks("view", {c: validity})

    cache.keep_chunks("view", {1: ("v", chunk(60)), 2: ("v", chunk(30))})
    assert kept(1)  # asked: now the most recent
    cache.keep_chunks("view", {3: ("v", chunk(30))})  # 120 points: 2, the least recently asked, goes
    assert not kept(2) and kept(3)
    cache.keep_chunks("view", {1: ("v", chunk(10))})  # kept again: counted once
    cache.keep_chunks("view", {4: ("v", chunk(60))})
    assert [kept(c) for c in (1, 3, 4)] == [True, True, True]  # 100 points
    cache.keep_chunks("view", {5: ("v", chunk(101))})  # more than the whole budget: not kept
    assert not kept(5) and kept(1)
    assert not kept(1, "other validity") and not cache.final_chunks("other view", {1: "v"})
    assert cache.chunk_hits == 6 and cache.hits == 60 + 30 + (10 + 30 + 60) + 10  # the points reused
    cache.clear()
    assert not kept(1)


def test_a_chunk_without_a_group_counts_in_the_budget():
    """A group-by's chunk whose groups were all empty there holds no point (store/series.py); it is
    still an entry, counted as one, so such chunks cannot pile up past the budget."""
    cache = PointCache(max_points=40)  # a budget of 10
    for c in range(11):
        cache.keep_chunks("view", {c: ("v", {})})
    assert not cache.final_chunks("view", {0: "v"}) and cache.final_chunks("view", {10: "v"}) == {10: {}}
    assert len(cache._chunks) == 10


def test_a_provisional_point_is_reused_only_under_its_fingerprint_and_watermark():
    """Windows the watermark has not passed are kept in memory only, each for the fingerprint and
    the watermark it was computed under: the same rows and the same watermark give the same point,
    anything else is computed again. Never handed to the store; a final point of the window
    replaces it; clear() forgets it; at most an eighth of max_points, the least recent going."""
    cache = PointCache(max_points=16, backing=Backing())
    live = Point(5, 2.0, 3, False, 1, None)
    cache.put_many([(("view", (), 5), (3, 1, 7, 1), live)], watermark_ms=100)
    cache.save()
    assert cache.backing.saved == []
    assert cache.holds("view") and not cache.holds("other view")  # a view of provisional windows only is held
    assert cache.get_many([(("view", (), 5), (3, 1, 7, 1))], watermark_ms=100) == [live]
    assert cache.get_many([(("view", (), 5), (3, 1, 7, 1))], watermark_ms=100)[0].text == format_point(live)
    assert cache.get_many([(("view", (), 5), (3, 1, 7, 1))], watermark_ms=110) == [None]  # the watermark moved
    assert cache.get_many([(("view", (), 5), (4, 1, 8, 1))], watermark_ms=100) == [None]  # a batch reached it
    assert cache.get_many([(("view", (), 5), (3, 1, 7, 1))]) == [None]  # a caller without a watermark
    assert (cache.hits, cache.misses, cache.provisional_hits, len(cache)) == (0, 5, 2, 0)
    cache.put_many([(("view", (), 5), (3, 1, 7, 1), live)])  # no watermark given: not kept
    final = live._replace(final=True)
    cache.put_many([(("view", (), 5), (4, 1, 8, 1), final)], watermark_ms=120)
    assert not cache._provisional
    assert cache.get_many([(("view", (), 5), (4, 1, 8, 1))], watermark_ms=120) == [final]
    cache.put_many([(("other view", (), t), (1, 1, 1, 0), live._replace(t_ms=t)) for t in range(3)],
                   watermark_ms=100)
    assert [t for _, _, t in cache._provisional] == [1, 2]  # 16 // 8
    assert cache._provisional_per_shape == {"other view": 2}
    cache.put_many([(("other view", (), 1), (1, 1, 1, 0), final._replace(t_ms=1))])  # final now: not provisional
    assert cache._provisional_per_shape == {"other view": 1}
    cache.clear()
    assert not cache._provisional and not cache.holds("other view")
