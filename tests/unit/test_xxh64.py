"""XXH64 over many strings at once (sketches/xxh64.py) gives the library's hash of each, whatever
the strings' lengths (the stripe, 8-, 4- and 1-byte steps), characters, slicing and seeds."""

from __future__ import annotations

import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.bloom import derived_seeds, hashes
from sketches.xxh64 import FEW_PER_LENGTH, LONG_KEY, xxh64_of_strings

seeds = st.integers(min_value=-(2**63), max_value=2**64 - 1)
# No lone surrogates: the keys are UTF-8 text (Arrow strings).
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=LONG_KEY + 20)


def library(strings: pa.Array, seed: int) -> list[int]:
    return [xxhash.xxh64_intdigest(s.encode("utf-8"), seed & (2**64 - 1)) for s in strings.to_pylist()]


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(texts, max_size=60), seed_a=seeds, seed_b=seeds, cut=st.integers(0, 3))
def test_every_hash_is_the_librarys(keys, seed_a, seed_b, cut):
    strings = pa.array(keys, pa.string())
    strings = strings.slice(min(cut, len(keys)), max(0, len(keys) - 2 * cut))  # offsets that do not start at 0
    got = xxh64_of_strings(strings, (seed_a, seed_b))
    assert [g.tolist() for g in got] == [library(strings, seed_a), library(strings, seed_b)]


@settings(max_examples=100, deadline=None)
@given(length=st.integers(0, LONG_KEY + 3), seed=seeds, data=st.data())
def test_strings_of_one_length_take_the_array_steps(length, seed, data):
    """Enough strings of one byte length to go through the array steps (rarer lengths go to the
    library, so the test above alone seldom reaches them), ASCII and two-byte characters, mixed
    with a few strings of other lengths."""
    ascii_ = st.text(st.sampled_from("ab0"), min_size=length, max_size=length)
    two_byte = st.text(st.sampled_from("éß"), min_size=length // 2, max_size=length // 2).map(lambda t: t + "a" * (length % 2))
    same = data.draw(st.lists(st.one_of(ascii_, two_byte), min_size=FEW_PER_LENGTH, max_size=3 * FEW_PER_LENGTH))
    keys = data.draw(st.permutations(same + data.draw(st.lists(texts, max_size=5))))
    strings = pa.array(keys, pa.string())
    assert xxh64_of_strings(strings, (seed,))[0].tolist() == library(strings, seed)


def test_spark_bloom_hashes_of_arrow_keys_and_of_python_keys_agree():
    keys = [f"user-{i}" for i in range(500)] + ["", "é" * 40, "x" * 200]
    s1, s2 = derived_seeds(7)
    h1, h2 = hashes(pa.chunked_array([keys[:100], keys[100:]]), 7)
    assert h1.view("uint64").tolist() == [xxhash.xxh64_intdigest(k.encode(), s1) for k in keys]
    assert h2.view("uint64").tolist() == [xxhash.xxh64_intdigest(k.encode(), s2) for k in keys]
    p1, p2 = hashes(keys, 7)
    assert p1.tolist() == h1.tolist() and p2.tolist() == h2.tolist()


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="strings"):
        xxh64_of_strings(pa.array([1, 2]), (0,))
    with pytest.raises(ValueError, match="null"):
        xxh64_of_strings(pa.array(["a", None]), (0,))
    assert [a.tolist() for a in xxh64_of_strings(pa.array([], pa.string()), (0, 1))] == [[], []]
