"""The Bloom filter: no false negatives, merge = union, measured false-positive rate, bytes, shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.bloom import (
    CHUNK_BYTES,
    BloomFilter,
    BloomFormatError,
    BloomShapeError,
    CHUNK_BITS,
    optimal_shape,
    positions,
    undercount_bound,
)
from aggregates.firstseen import chunks_of

keys = st.lists(st.text(max_size=40), max_size=300)
seeds = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(added=keys, seed=seeds, capacity=st.integers(1, 500), fpp=st.floats(0.001, 0.5))
def test_never_answers_no_for_an_added_key(added, seed, capacity, fpp):
    bloom = BloomFilter.for_capacity(capacity, fpp, seed)
    bloom.add_many(added)
    assert bloom.contains_many(added).all()
    for key in added[:20]:
        assert key in bloom


@settings(max_examples=60, deadline=None)
@given(a=keys, b=keys, probes=keys, seed=seeds)
def test_merge_answers_like_one_filter_that_saw_both_sets(a, b, probes, seed):
    left, right, both = (BloomFilter.for_capacity(200, 0.05, seed) for _ in range(3))
    left.add_many(a)
    right.add_many(b)
    both.add_many(a + b)
    merged = left.merge(right)
    assert merged == both
    everything = a + b + probes
    if everything:
        assert (merged.contains_many(everything) == both.contains_many(everything)).all()
    # Merging is commutative and leaves its inputs alone.
    assert right.merge(left) == merged
    assert left.merge(BloomFilter.for_capacity(200, 0.05, seed)) == left


@pytest.mark.parametrize("capacity, fpp", [(100_000, 0.01), (20_000, 0.05), (50_000, 0.001)])
def test_false_positive_rate_over_a_million_held_out_keys_is_at_most_1_5_times_the_target(capacity, fpp):
    bloom = BloomFilter.for_capacity(capacity, fpp, seed=7)
    bloom.add_many([f"user-{i}" for i in range(capacity)])  # filled to capacity: the worst configured case
    held_out = [f"other-{i}" for i in range(1_000_000)]
    measured = bloom.contains_many(held_out).mean()
    assert measured <= 1.5 * fpp, (measured, fpp)
    # The filter's own estimate of its false-positive probability is close to what it measures.
    assert bloom.false_positive_probability() == pytest.approx(measured, rel=0.25)
    assert bloom.approx_count() == pytest.approx(capacity, rel=0.02)


@settings(max_examples=30, deadline=None)
@given(added=keys, seed=seeds)
def test_bytes_round_trip(added, seed):
    bloom = BloomFilter.for_capacity(300, 0.02, seed)
    bloom.add_many(added)
    back = BloomFilter.from_bytes(bloom.to_bytes())
    assert back == bloom and back.shape == bloom.shape


def test_merge_of_different_shapes_is_a_clear_error():
    with pytest.raises(BloomShapeError, match="different shapes.*seed=1.*seed=2"):
        BloomFilter.for_capacity(100, 0.01, 1).merge(BloomFilter.for_capacity(100, 0.01, 2))
    with pytest.raises(BloomShapeError, match="m="):
        BloomFilter.for_capacity(100, 0.01, 1).merge(BloomFilter.for_capacity(1000, 0.01, 1))


def test_bad_bytes_are_clear_errors():
    good = BloomFilter.for_capacity(100, 0.01).to_bytes()
    with pytest.raises(BloomFormatError, match="header"):
        BloomFilter.from_bytes(b"abc")
    with pytest.raises(BloomFormatError, match="magic"):
        BloomFilter.from_bytes(b"XXXX" + good[4:])
    with pytest.raises(BloomFormatError, match="bytes of bits"):
        BloomFilter.from_bytes(good[:-1])
    with pytest.raises(BloomFormatError, match="version"):
        BloomFilter.from_bytes(good[:4] + b"\x09\x00" + good[6:])


def test_shape_validation():
    assert optimal_shape(1000, 0.01) == (9592, 7)
    with pytest.raises(ValueError, match="capacity"):
        optimal_shape(0, 0.01)
    with pytest.raises(ValueError, match="fpp"):
        optimal_shape(10, 1.0)
    with pytest.raises(ValueError, match="limit"):
        optimal_shape(10**12, 1e-9)


def test_fill_and_chunks():
    bloom = BloomFilter.for_capacity(10_000, 0.01, seed=3)
    assert bloom.fill_ratio == 0 and bloom.false_positive_probability() == 0
    other = BloomFilter(bloom.m, bloom.k, bloom.seed)
    other.add_many([f"k{i}" for i in range(500)])
    for i in range(other.chunks):
        bloom.or_chunk(i, other.chunk(i))
    assert bloom == other
    assert 0 < bloom.fill_ratio < 0.1
    assert len(bloom.chunk(0)) == min(CHUNK_BYTES, bloom.m // 8)
    with pytest.raises(ValueError, match="out of range"):
        bloom.or_chunk(bloom.chunks, b"\x00")


def test_undercount_bound():
    assert undercount_bound(1000, 0, 0.01) == 0  # nothing answered "seen": nothing can be false
    assert undercount_bound(1000, 5, 0.0) == 0
    assert undercount_bound(1000, 3, 0.5) == 3  # never more than the positives
    bound = undercount_bound(10_000, 10_000, 0.01)  # lambda = 100
    assert 130 < bound < 160
    # The bound holds for simulated false positives far more often than 1 - 1e-6 would need.
    rng = np.random.default_rng(1)
    draws = rng.binomial(10_000, 0.01, 100_000)
    assert (draws <= bound).all()
    with pytest.raises(ValueError):
        undercount_bound(1, 2, 0.1)


@pytest.mark.parametrize(("lam", "expected"), [(700, 829), (744, 877), (746, 879), (800, 938), (999, 1153)])
def test_undercount_bound_of_a_large_batch_is_the_poisson_tail(lam, expected):
    """~75 000 keys of a batch tested against filters at 1 %: lambda ~750, where the recurrence
    from exp(-lambda) lost precision (744 gave 765) and then underflowed (past 745 the bound was
    all the positives). The expected figures: the smallest c with P(Poisson(lam) > c) <= 1e-6,
    summed in log space."""
    assert undercount_bound(1_000_000, 500_000, lam / 1e6) == expected


int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(h=st.lists(st.tuples(int64s, int64s), max_size=60), m=st.integers(8, 2**32).map(lambda m: m * 8),
       k=st.integers(1, 32))
def test_positions_are_the_double_hashing_formula(h, m, k):
    """(pmod(h1, m) + i * (1 + pmod(h2, m - 1))) mod m for i < k, as the module doc (and Spark's side)
    says, whichever way `positions` computes it; extreme hashes and filter sizes included."""
    h1 = np.array([a for a, _ in h], np.int64)
    h2 = np.array([b for _, b in h], np.int64)
    got = positions(h1, h2, m, k)
    assert got.shape == (len(h), k) and got.dtype == np.int64
    for row, (a, b) in zip(got.tolist(), h, strict=True):
        assert row == [(a % m + i * (1 + b % (m - 1))) % m for i in range(k)]


@settings(max_examples=60, deadline=None)
@given(added=keys, seed=seeds, capacity=st.integers(1, 200_000))
def test_chunks_of_are_the_chunks_a_filter_of_those_keys_changes(added, seed, capacity):
    """The chunks a batch's positions touch, each as that chunk's bits: or-ed into an empty filter,
    they make the filter that added the keys one by one; untouched chunks are left out."""
    bloom = BloomFilter.for_capacity(capacity, 0.01, seed=seed)
    bloom.add_many(added)
    chunks = chunks_of(bloom.positions(added), bloom.m) if added else {}
    rebuilt = BloomFilter(bloom.m, bloom.k, bloom.seed)
    for i, bits in chunks.items():
        rebuilt.or_chunk(i, bits[:len(bloom.chunk(i))])
    assert rebuilt == bloom
    assert sorted(chunks) == [i for i in range(bloom.chunks) if any(bloom.chunk(i))]
    assert list(chunks) == sorted(chunks) and all(len(b) == CHUNK_BITS // 8 for b in chunks.values())
