"""A Bloom filter whose key hashes Spark's executors compute natively (no Python per event).

Hashing: XXH64 with two seeds derived from the filter's seed, exactly as Spark's built-in
`xxhash64(seed_as_bigint, key)` computes it (Spark chains: the hash of the first argument,
seeded with 42, seeds the hash of the UTF-8 key). So `xxhash64(lit(seed), key)` on the
executors and XXH64 of the key with the derived seed here (`hashes`: sketches/xxh64.py over a
batch's keys, the `xxhash` library for the seeds and long keys) give the same 64-bit values,
and the k positions follow by double hashing (Kirsch-Mitzenmacher):

    a = pmod(h1, m), b = 1 + pmod(h2, m - 1), position_i = (a + i * b) mod m,  i = 0..k-1

(all in signed 64-bit, no overflow since m < 2^36 and k <= 32; Spark's `pmod` and numpy's
`%` agree on negative operands). `aggregates/firstseen.py` computes the two hashes on the
executors (Spark's `xxhash64`) and the positions with `positions` below on the driver; a Spark
test checks the executors' hashes agree with `hashes`.

Bit layout: bit p is bit (p mod 8) of byte p div 8 (least significant first), the layout
of Spark's `bitmap_construct_agg`, whose 32768-bit (4 KiB) buckets are therefore whole
chunks of this filter: the executors build the bits to add, the driver ORs chunks.

Serialized form: a 24-byte header (magic b"SKBF", version, k, m, seed; little-endian)
followed by the m/8 bytes of bits.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from sketches.xxh64 import xxh64_of_strings

__all__ = [
    "BloomFilter", "BloomFormatError", "BloomShapeError", "CHUNK_BITS", "CHUNK_BYTES", "SALT2", "derived_seeds",
    "hashes", "optimal_shape", "positions", "undercount_bound",
]

MAGIC = b"SKBF"
VERSION = 1
_HEADER = struct.Struct("<4sHHQq")  # magic, version, k, m (bits), seed
CHUNK_BITS = 32_768  # Spark's bitmap_construct_agg bucket: 4 KiB
CHUNK_BYTES = CHUNK_BITS // 8
SALT2 = 0x2545F4914F6CDD1D  # xor-ed into the seed for the second hash (fits a signed bigint)
MAX_BITS = 1 << 35  # 4 GiB of bits: far past any sane filter, keeps (a + i*b) well inside int64
MAX_K = 32
_SPARK_HASH_SEED = 42  # the fixed seed of Spark's xxhash64


class BloomShapeError(ValueError):
    """Two filters of different shapes (m, k, seed) cannot be merged: their bits mean different keys."""


class BloomFormatError(ValueError):
    """Bytes that are not a serialized filter of a version this code reads."""


def optimal_shape(capacity: int, fpp: float) -> tuple[int, int]:
    """(m bits, k hashes) for `capacity` keys at false-positive rate `fpp`; m is a multiple of 8."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    if not 0.0 < fpp < 1.0:
        raise ValueError(f"fpp must be within (0, 1), got {fpp}")
    m = math.ceil(-capacity * math.log(fpp) / (math.log(2) ** 2))
    m = max(64, m + (-m) % 8)
    if m > MAX_BITS:
        raise ValueError(f"capacity {capacity} at fpp {fpp} needs {m} bits, over the limit of {MAX_BITS}")
    k = max(1, min(MAX_K, round(m / capacity * math.log(2))))
    return m, k


def derived_seeds(seed: int) -> tuple[int, int]:
    """The XXH64 seeds Spark's xxhash64(lit(seed), key) and xxhash64(lit(seed ^ SALT2), key) use for the key."""
    s1 = xxhash.xxh64_intdigest(struct.pack("<q", seed), _SPARK_HASH_SEED)
    s2 = xxhash.xxh64_intdigest(struct.pack("<q", seed ^ SALT2), _SPARK_HASH_SEED)
    return s1, s2


def hashes(keys: Sequence[str] | pa.Array | pa.ChunkedArray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(h1, h2) as signed int64 arrays, equal to Spark's xxhash64 of the keys with the two seeds
    (a batch's keys as Arrow strings are hashed without a Python string each: sketches/xxh64.py)."""
    s1, s2 = derived_seeds(seed)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    strings = keys if isinstance(keys, pa.Array) else pa.array(list(keys), pa.string())
    h1, h2 = xxh64_of_strings(strings.cast(pa.string()), (s1, s2))
    return h1.view(np.int64), h2.view(np.int64)


def positions(h1: np.ndarray, h2: np.ndarray, m: int, k: int) -> np.ndarray:
    """Bit positions, shape (n, k), from the two hashes by double hashing."""
    a = np.mod(np.asarray(h1, dtype=np.int64), m)
    b = 1 + np.mod(np.asarray(h2, dtype=np.int64), m - 1)
    # (a + i*b) mod m step by step: 0 <= a < m and 1 <= b < m, so each step adds b and takes m
    # off at most once; no division per position (a batch's 350 000 took 9 ms by np.mod).
    out = np.empty((len(a), k), np.int64)
    at = a.copy()
    for i in range(k):
        out[:, i] = at
        if i + 1 < k:
            at += b
            at -= m * (at >= m)
    return out


@dataclass(frozen=True)
class BloomStats:
    bits_set: int
    fill_ratio: float
    false_positive_probability: float
    approx_count: float


class BloomFilter:
    """m bits, k positions per key, a fixed seed. Mutable: add() and or_chunk() set bits."""

    def __init__(self, m: int, k: int, seed: int = 0, bits: np.ndarray | bytes | None = None):
        if m < 64 or m % 8 or m > MAX_BITS:
            raise ValueError(f"m must be a multiple of 8 within [64, {MAX_BITS}], got {m}")
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be within [1, {MAX_K}], got {k}")
        if not -(1 << 63) <= seed < (1 << 63):
            raise ValueError(f"seed must fit a signed 64-bit integer, got {seed}")
        self.m, self.k, self.seed = int(m), int(k), int(seed)
        if bits is None:
            self.bits = np.zeros(m // 8, dtype=np.uint8)
        else:
            array = np.frombuffer(bits, dtype=np.uint8) if isinstance(bits, (bytes, bytearray, memoryview)) else bits
            if array.dtype != np.uint8 or array.shape != (m // 8,):
                raise ValueError(f"bits must be {m // 8} bytes, got {array.shape}")
            self.bits = array.copy()

    @classmethod
    def for_capacity(cls, capacity: int, fpp: float, seed: int = 0) -> BloomFilter:
        m, k = optimal_shape(capacity, fpp)
        return cls(m, k, seed)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.m, self.k, self.seed

    @property
    def chunks(self) -> int:
        return -(-self.m // CHUNK_BITS)

    # -- keys ---------------------------------------------------------------------------

    def positions(self, keys: Sequence[str]) -> np.ndarray:
        h1, h2 = hashes(keys, self.seed)
        return positions(h1, h2, self.m, self.k)

    def add_positions(self, pos: np.ndarray) -> None:
        pos = np.asarray(pos, dtype=np.int64).ravel()
        np.bitwise_or.at(self.bits, pos >> 3, (1 << (pos & 7)).astype(np.uint8))

    def test_positions(self, pos: np.ndarray) -> np.ndarray:
        """Per row of positions (n, k): are all its bits set?"""
        pos = np.asarray(pos, dtype=np.int64)
        return np.all((self.bits[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1 == 1, axis=-1)

    def add(self, key: str) -> None:
        self.add_many([key])

    def add_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self.add_positions(self.positions(keys))

    def __contains__(self, key: str) -> bool:
        return bool(self.contains_many([key])[0])

    def contains_many(self, keys: Sequence[str]) -> np.ndarray:
        """False means certainly never added; True means probably added."""
        if not len(keys):
            return np.zeros(0, dtype=bool)
        return self.test_positions(self.positions(keys))

    # -- whole filters ------------------------------------------------------------------

    def check_same_shape(self, other: BloomFilter) -> None:
        if self.shape != other.shape:
            raise BloomShapeError(
                f"cannot merge Bloom filters of different shapes: (m={self.m}, k={self.k}, seed={self.seed})"
                f" vs (m={other.m}, k={other.k}, seed={other.seed})"
            )

    def merge(self, other: BloomFilter) -> BloomFilter:
        """A new filter answering like one that saw both filters' keys (bitwise OR)."""
        self.check_same_shape(other)
        return BloomFilter(self.m, self.k, self.seed, np.bitwise_or(self.bits, other.bits))

    def merge_in(self, other: BloomFilter) -> None:
        self.check_same_shape(other)
        np.bitwise_or(self.bits, other.bits, out=self.bits)

    def chunk(self, index: int) -> bytes:
        return self.bits[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES].tobytes()

    def or_chunk(self, index: int, data: bytes) -> None:
        """OR a 32768-bit chunk (as Spark's bitmap_construct_agg makes) into chunk `index`."""
        if not 0 <= index < self.chunks:
            raise ValueError(f"chunk {index} out of range for a filter of {self.chunks} chunks")
        lo = index * CHUNK_BYTES
        hi = min(lo + CHUNK_BYTES, len(self.bits))
        incoming = np.frombuffer(data, dtype=np.uint8)[: hi - lo]
        if len(incoming) < hi - lo:
            incoming = np.pad(incoming, (0, hi - lo - len(incoming)))
        np.bitwise_or(self.bits[lo:hi], incoming, out=self.bits[lo:hi])

    @property
    def bits_set(self) -> int:
        return int(np.bitwise_count(self.bits).sum(dtype=np.int64))

    def stats(self) -> BloomStats:
        set_ = self.bits_set
        fill = set_ / self.m
        approx = float("inf") if set_ == self.m else -self.m / self.k * math.log1p(-fill)
        return BloomStats(set_, fill, fill ** self.k, approx)

    @property
    def fill_ratio(self) -> float:
        return self.bits_set / self.m

    def false_positive_probability(self) -> float:
        """The probability that a key never added answers "probably yes" now: fill^k."""
        return self.fill_ratio ** self.k

    def approx_count(self) -> float:
        """Estimated keys added (Swamidass & Baldi): -m/k * ln(1 - fill)."""
        return self.stats().approx_count

    # -- bytes --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return _HEADER.pack(MAGIC, VERSION, self.k, self.m, self.seed) + self.bits.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise BloomFormatError(f"a serialized Bloom filter has a {_HEADER.size}-byte header; got {len(data)} bytes")
        magic, version, k, m, seed = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise BloomFormatError(f"not a Sketchboard Bloom filter (magic {magic!r})")
        if version != VERSION:
            raise BloomFormatError(f"Bloom filter format version {version} is not supported (this code reads {VERSION})")
        if len(data) != _HEADER.size + m // 8:
            raise BloomFormatError(f"a filter of {m} bits has {m // 8} bytes of bits; got {len(data) - _HEADER.size}")
        return cls(m, k, seed, data[_HEADER.size:])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BloomFilter) and self.shape == other.shape and np.array_equal(self.bits, other.bits)

    def __repr__(self) -> str:
        return f"BloomFilter(m={self.m}, k={self.k}, seed={self.seed}, fill={self.fill_ratio:.4f})"


def undercount_bound(tested: int, positives: int, fpp: float, *, delta: float = 1e-6) -> int:
    """How many of `positives` keys (answered "seen before" among `tested`) may be false positives.

    Each key tested that was in fact new is a false positive independently with probability
    `fpp` (fill^k of the filter it was tested against), so the false positives are at most
    Binomial(tested, fpp), which Poisson(tested * fpp) dominates in the upper tail. The bound
    is the smallest c with P(Poisson > c) <= delta, and never more than `positives`.
    """
    if tested < 0 or positives < 0 or positives > tested:
        raise ValueError(f"need 0 <= positives <= tested, got tested={tested}, positives={positives}")
    lam = tested * fpp
    if positives == 0 or lam <= 0.0:
        return 0
    if lam > 1000.0:  # normal approximation with a wide margin (z = 5 covers delta = 1e-6)
        return min(positives, math.ceil(lam + 5.0 * math.sqrt(lam) + 1.0))
    # Each P(X = c) from its logarithm: the recurrence from P(X = 0) = exp(-lam) lost precision
    # near lam = 730 and was 0 past 745 (a bound too small, then none at all).
    log_lam = math.log(lam)
    cdf, c = math.exp(-lam), 0
    while 1.0 - cdf > delta and c < positives:
        c += 1
        cdf += math.exp(c * log_lam - lam - math.lgamma(c + 1))
    return min(positives, c)
