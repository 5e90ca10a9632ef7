"""XXH64 of many strings at once: the Bloom filters' key hashes (sketches/bloom.py), equal to
`xxhash.xxh64_intdigest` of each string's UTF-8 bytes, computed by numpy over all the strings of
one length together instead of one library call per key from Python.

A batch of the demo holds ~50 000 distinct users, each hashed with two seeds per Bloom feature:
listing, encoding and hashing them one by one took ~20 ms a feature and batch (py-spy of a drain
in batches of 100 000 events), ~2 ms this way. The steps are XXH64's
(github.com/Cyan4973/xxHash, doc/xxhash_spec.md): 32-byte stripes into four accumulators for a
string of 32 bytes or more, then its tail in 8-, 4- and 1-byte steps, then the avalanche. Strings
of one length take the same steps, so each step is one array operation over all of them (ids
come in a few lengths). Strings of more than LONG_KEY bytes are hashed by the library one by one.
tests/unit/test_xxh64.py checks every answer against the library.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from sketches.by_length import by_length

LONG_KEY = 64  # bytes; longer strings (few: keys are ids) are hashed by the library
FEW_PER_LENGTH = 16  # a length this rare is hashed by the library: the array steps cost more

_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                                   0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))
_MASK = (1 << 64) - 1
_ZERO = np.uint64(0)  # an accumulator of 0 (XXH64's round of a lane alone), broadcast


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    return _rotl(acc + lane * _P2, 31) * _P1


def xxh64_of_strings(strings: pa.Array, seeds: tuple[int, ...]) -> list[np.ndarray]:
    """XXH64 of each string's UTF-8 bytes, per seed (uint64, one per string; no nulls)."""
    # A row is `length` rounded up to 8 bytes wide (so it reads as 64-bit lanes).
    found = by_length(strings, LONG_KEY + 8, "keys")
    out = [np.zeros(len(found.lengths), np.uint64) for _ in seeds]
    for length, rows, matrix in found.groups(LONG_KEY, FEW_PER_LENGTH, 8):  # past `length`: bytes no step reads
        for out_, seed in zip(out, seeds, strict=True):
            out_[rows] = _of_length(matrix, length, seed & _MASK)
    for rows in found.one_by_one:
        for i in rows.tolist():
            key = found.key(i)
            for out_, seed in zip(out, seeds, strict=True):
                out_[i] = xxhash.xxh64_intdigest(key, seed & _MASK)
    return out


def _of_length(matrix: np.ndarray, length: int, seed: int) -> np.ndarray:
    """XXH64 of the rows of `matrix`, each a string's `length` bytes then whatever follows them up to
    a multiple of 8 (the next string's bytes, zeros after the last): no step reads past `length`."""
    n = len(matrix)
    lanes = matrix.view("<u8").astype(np.uint64, copy=False)
    at = 0  # the next byte to read
    if length >= 32:
        v = [np.full(n, (seed + a) & _MASK, np.uint64) for a in (int(_P1) + int(_P2), int(_P2), 0, -int(_P1))]
        while at + 32 <= length:
            for i in range(4):
                v[i] = _round(v[i], lanes[:, at // 8 + i])
            at += 32
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for i in range(4):
            h = (h ^ _round(_ZERO, v[i])) * _P1 + _P4
    else:
        h = np.full(n, (seed + int(_P5)) & _MASK, np.uint64)
    h = h + np.uint64(length)
    while at + 8 <= length:
        h = _rotl(h ^ _round(_ZERO, lanes[:, at // 8]), 27) * _P1 + _P4
        at += 8
    if at + 4 <= length:
        word = matrix[:, at:at + 4].copy().view("<u4")[:, 0].astype(np.uint64)
        h = _rotl(h ^ (word * _P1), 23) * _P2 + _P3
        at += 4
    while at < length:
        h = _rotl(h ^ (matrix[:, at].astype(np.uint64) * _P5), 11) * _P1
        at += 1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h
