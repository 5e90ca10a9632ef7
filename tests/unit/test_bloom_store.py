"""Bloom filters and first-seen counts in the serving store, on every backend: the bits of a
batch are OR-ed in with the batch, exactly once, and read back through the store's own
reader (PaneStore.bloom_reader), never through a file path."""

from __future__ import annotations

from sketches.bloom import BloomFilter
from store import BatchCommit
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, FilterUpdate, FirstSeenPartial

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
