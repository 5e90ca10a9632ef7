"""DataSketches' HLL coupons of many strings at once: what `hll_sketch.update(text)` keeps of each
string, computed by numpy over all the strings of one length together.

An HLL sketch keeps of an item its coupon: MurmurHash3_x64_128 of the item's UTF-8 bytes with seed
9001 gives two 64-bit words, h1 and h2; the coupon is (min(leading zeros of h2, 62) + 1) << 26 |
(the low 26 bits of h1), and a sketch of lg_k puts it in bucket `coupon & (2^lg_k - 1)` with value
`coupon >> 26`. DataSketches ignores the empty string (coupon 0 here). The hash's steps are the
reference's (github.com/aappleby/smhasher, MurmurHash3.cpp): 16-byte blocks into two lanes, the
tail's bytes, then the finalization; strings of one length take the same steps, so each is one
array operation over all of them (ids come in a few lengths), as sketches/xxh64.py does for XXH64.
Strings longer than LONG_KEY bytes, or of a length fewer than FEW_PER_LENGTH strings have, are
hashed by DataSketches one by one. tests/unit/test_hll_coupons.py checks every coupon against a
DataSketches sketch of the string alone.

A batch of the demo holds ~50 000 distinct users; a sketch made per item to read its coupon costs
~2-3 us, numpy ~0.1 us a string."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from sketches.by_length import by_length

SEED = 9001  # DataSketches' HLL update seed
LONG_KEY = 64  # bytes; longer strings (few: keys are ids) are hashed by DataSketches
FEW_PER_LENGTH = 16  # a length this rare is hashed by DataSketches: the array steps cost more
KEY_BITS = 26  # a coupon's address bits; its value above them

_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_FIVE, _N1, _N2 = np.uint64(5), np.uint64(0x52DCE729), np.uint64(0x38495AB5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * _F1
    k = k ^ (k >> np.uint64(33))
    k = k * _F2
    return k ^ (k >> np.uint64(33))


def coupons_of_strings(strings: pa.Array) -> np.ndarray:
    """Each string's coupon (uint32; 0 for the empty string, which DataSketches ignores). No nulls."""
    found = by_length(strings, LONG_KEY + 16, "items")
    out = np.zeros(len(found.lengths), np.uint32)
    for length, rows, matrix in found.groups(LONG_KEY, FEW_PER_LENGTH, 16):
        if length:  # the empty string's coupon is 0
            matrix[:, length:] = 0  # the tail's lanes read zeros past the string, as the reference's switch does
            out[rows] = _coupons(_murmur3(matrix, length))
    for rows in found.one_by_one:
        for i in rows.tolist():
            out[i] = library_coupon(found.key(i).decode("utf-8"))
    return out


def _murmur3(matrix: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(h1, h2) of MurmurHash3_x64_128 with SEED of the rows of `matrix`: each a string's `length`
    bytes, then zeros up to a multiple of 16."""
    n = len(matrix)
    lanes = matrix.view("<u8").astype(np.uint64, copy=False)
    h1 = np.full(n, SEED, np.uint64)
    h2 = np.full(n, SEED, np.uint64)
    blocks = length // 16
    for b in range(blocks):
        k1 = _rotl(lanes[:, 2 * b] * _C1, 31) * _C2
        h1 = h1 ^ k1
        h1 = (_rotl(h1, 27) + h2) * _FIVE + _N1
        k2 = _rotl(lanes[:, 2 * b + 1] * _C2, 33) * _C1
        h2 = h2 ^ k2
        h2 = (_rotl(h2, 31) + h1) * _FIVE + _N2
    tail = length % 16
    if tail > 8:
        h2 = h2 ^ (_rotl(lanes[:, 2 * blocks + 1] * _C2, 33) * _C1)
    if tail > 0:
        h1 = h1 ^ (_rotl(lanes[:, 2 * blocks] * _C1, 31) * _C2)
    size = np.uint64(length)
    h1, h2 = h1 ^ size, h2 ^ size
    h1 = h1 + h2
    h2 = h2 + h1
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = h1 + h2
    h2 = h2 + h1
    return h1, h2


def _coupons(hashes: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    h1, h2 = hashes
    # Leading zeros of h2 from the bit length of its high 32-bit word, or of its low one where the
    # high is 0: a 32-bit word is a double exactly, whose exponent is its bit length.
    high = (h2 >> np.uint64(32)).astype(np.uint32)
    word = np.where(high != 0, high, (h2 & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    bits = np.frexp(word.astype(np.float64))[1].astype(np.int64)  # 0 for 0
    zeros = np.where(high != 0, 32 - bits, 64 - bits)
    value = (np.minimum(zeros, 62) + 1).astype(np.uint32)
    return (value << np.uint32(KEY_BITS)) | (h1 & np.uint64((1 << KEY_BITS) - 1)).astype(np.uint32)


def library_coupon(item: str) -> int:
    """The coupon DataSketches' HLL keeps for `item` (0 for an item it ignores): a sketch of it alone."""
    from datasketches import hll_sketch, tgt_hll_type

    sketch = hll_sketch(12, tgt_hll_type.HLL_8)
    sketch.update(item)
    blob = sketch.serialize_updatable()
    return struct.unpack_from("<I", blob, 8)[0] if blob[6] else 0
