"""Bloom filters and first-seen counts in the serving store, on every backend: the bits of a
batch are OR-ed in with the batch, exactly once, and read back through the store's own
reader (PaneStore.bloom_reader), never through a file path."""

from __future__ import annotations

from sketches.bloom import BloomFilter
from store import BatchCommit
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, FilterUpdate, FirstSeenPartial
from store.tiers import TierLayout

T0 = 1_700_000_000_000
HOUR = 3_600_000


def update(bloom: BloomFilter, kind: str, bucket_ms: int) -> FilterUpdate:
    chunks = {i: bloom.chunk(i) for i in range(bloom.chunks) if any(bloom.chunk(i))}
    return FilterUpdate("s", kind, bucket_ms, bloom.m, bloom.k, bloom.seed, chunks)


def batch(batch_id: int, bloom: BloomCommit) -> BatchCommit:
    return BatchCommit("main", batch_id, [], 0, bloom=bloom)


def test_filters_and_first_seen_counts_are_committed_once_and_read_back(store_backend):
    store = store_backend.create()
    first, second = BloomFilter.for_capacity(100_000, 0.01, seed=7), BloomFilter.for_capacity(100_000, 0.01, seed=7)
    first.add_many([f"a{i}" for i in range(300)])
    second.add_many([f"b{i}" for i in range(300)])
    counts = FirstSeenPartial("s", T0, T0 + 10_000, new_keys=300, tested=300, positives=0, expected_fp=0.5, bound=2)
    member = BloomFilter.for_capacity(1_000, 0.01, seed=1)
    member.add_many(["x", "y"])
    one = BloomCommit([update(first, FIRST_SEEN, 0), update(member, MEMBERSHIP, T0)], [counts])
    assert store.commit_batch(batch(0, one), lateness_ms={}, now_ms=1).committed
    assert not store.commit_batch(batch(0, one), lateness_ms={}, now_ms=2).committed  # a replay adds nothing
    two = BloomCommit([update(second, FIRST_SEEN, 0)], [counts])
    assert store.commit_batch(batch(1, two), lateness_ms={}, now_ms=3).committed

    reader = store.bloom_reader()
    assert reader.first_seen_filter("s") == first.merge(second)
    assert reader.first_seen_filter("other") is None
    [(bucket, stored)] = reader.membership_filters("s", T0 - HOUR, T0 + HOUR)
    assert bucket == T0 and stored == member and "x" in stored
    assert reader.membership_filters("s", T0 + 1, T0 + HOUR) == []
    [row] = reader.first_seen_rows("s", T0, T0 + 1)
    assert (row.new_keys, row.tested, row.expected_fp, row.bound, row.last_batch) == (600, 600, 1.0, 4, 1)


# Retention (issue: nothing of the Bloom features was ever dropped). Hour-aligned, so the
# horizons below fall where the tests say.
BASE = T0 - T0 % HOUR
DAY = 24 * HOUR
PANE = 10_000


def member(bucket_ms: int, stream: str = "s") -> FilterUpdate:
    bloom = BloomFilter.for_capacity(1_000, 0.01, seed=1)
    bloom.add_many(["x"])
    return FilterUpdate(stream, MEMBERSHIP, bucket_ms, bloom.m, bloom.k, bloom.seed,
                        {i: bloom.chunk(i) for i in range(bloom.chunks) if any(bloom.chunk(i))})


def pane_counts(*starts: int) -> list[FirstSeenPartial]:
    return [FirstSeenPartial("s", start, start + PANE, 1, 1, 0, 0.0, 0) for start in starts]


def retention_run(store, batch_id: int, now_ms: int, **kwargs):
    """A batch with nothing of its own whose commit runs retention at now_ms."""
    return store.commit_batch(BatchCommit("main", batch_id, [], 0, batch_now_ms=now_ms), lateness_ms={},
                              now_ms=now_ms, **kwargs)


def stored_buckets(store_backend, store) -> dict[str, set]:
    """(stream, kind, bucket start) of every filter header and chunk row left in the store."""
    tables = store_backend.tables(store, ["bloom_filters", "bloom_chunks"])
    return {name: {row[:3] for row in rows} for name, rows in tables.items()}


def test_retention_drops_membership_buckets_and_pane_counts_wholly_past_it_but_never_the_first_seen_filter(
        store_backend):
    store = store_backend.create()
    keys = BloomFilter.for_capacity(100_000, 0.01, seed=7)
    keys.add_many(["old-user"])
    horizon = BASE + 30 * 60_000  # now - retention at the retention runs below
    written = BloomCommit([update(keys, FIRST_SEEN, 0), member(BASE - HOUR), member(BASE),
                           member(BASE - HOUR, stream="t")],  # t: a stream whose bucket the store is not told
                          pane_counts(horizon - PANE, horizon))
    assert store.commit_batch(batch(0, written), lateness_ms={}, now_ms=1).committed
    retention = {"s": DAY, "t": DAY}
    assert retention_run(store, 1, horizon + DAY).committed  # no retention asked for: nothing goes
    assert len(store.bloom_reader().membership_filters("s", 0, BASE + DAY)) == 2

    assert retention_run(store, 2, horizon + DAY, retention_ms=retention, membership_bucket_ms={"s": HOUR}).committed
    reader = store.bloom_reader()
    # The bucket ending at BASE is wholly past the horizon; the one holding it is not.
    assert [bucket for bucket, _ in reader.membership_filters("s", 0, BASE + DAY)] == [BASE]
    # The pane ending at the horizon goes (like the pane itself), the next one stays.
    assert [row.start_ms for row in reader.first_seen_rows("s", 0, BASE + DAY)] == [horizon]
    # "First seen" looks back over the stream's whole life: the filter stays, bucket 0 or not.
    assert reader.first_seen_filter("s") == keys and "old-user" in reader.first_seen_filter("s")
    expected = {("s", FIRST_SEEN, 0), ("s", MEMBERSHIP, BASE), ("t", MEMBERSHIP, BASE - HOUR)}
    assert stored_buckets(store_backend, store) == {"bloom_filters": expected, "bloom_chunks": expected}


def test_pane_counts_stay_while_a_kept_tier_row_serves_their_first_seen_points(store_backend):
    """A first_seen point takes its count from the panes or a tier row and its value from the
    pane counts: they go only when no kept row covers them any more."""
    store = store_backend.create()
    store.configure_tiers({"s": TierLayout(PANE, DAY, ((HOUR, 10 * DAY),), ("",))}, now_ms=BASE)
    assert store.commit_batch(batch(0, BloomCommit([], pane_counts(BASE, BASE + HOUR // 2, BASE + HOUR))),
                              lateness_ms={}, now_ms=BASE).committed

    def kept() -> list[int]:
        return [row.start_ms for row in store.bloom_reader().first_seen_rows("s", 0, BASE + DAY)]

    # Panes long gone (kept a day); the hour tier, kept 10 days, still holds the row [BASE, BASE + 1h)
    # although its first half is past the tier's horizon: every count in that hour stays.
    assert retention_run(store, 1, BASE + 10 * DAY + HOUR // 2, retention_ms={"s": DAY}).committed
    assert kept() == [BASE, BASE + HOUR // 2, BASE + HOUR]
    # That hour's tier row is gone now, and with it its counts; the next hour's stay.
    assert retention_run(store, 2, BASE + 10 * DAY + HOUR, retention_ms={"s": DAY}).committed
    assert kept() == [BASE + HOUR]
