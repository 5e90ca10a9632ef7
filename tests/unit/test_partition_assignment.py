"""assign_partitions_columnar gives assign_partitions' answers for a column of keys; its CRC-32 of
many strings at once is zlib's."""

from __future__ import annotations

import zlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.partitioner import assign_partitions, assign_partitions_columnar
from sketches.crc32 import crc32_of_strings


@settings(deadline=None)  # the first call pays for loading Arrow's kernels
@given(keys=st.lists(st.one_of(st.none(), st.text(max_size=4)), max_size=40), partitions=st.integers(1, 7),
       round_robin=st.integers(0, 10**6), keyless_stream=st.booleans())
def test_columnar_assignment_matches_the_per_event_one(keys, partitions, round_robin, keyless_stream):
    if keyless_stream:
        keys = [None] * len(keys)
    expected, after = assign_partitions(keys, partitions, round_robin)
    column = None if keyless_stream else pa.array(keys, pa.string())
    got, got_after = assign_partitions_columnar(column, len(keys), partitions, round_robin)
    assert list(got) == expected and got_after == after


@settings(deadline=None)
@given(strings=st.lists(st.one_of(st.text(max_size=8), st.text(min_size=60, max_size=200),
                                  st.text(alphabet="éü€😀", max_size=30)), max_size=30),
       cut=st.integers(0, 5))
def test_the_crc32_of_many_strings_is_zlibs_of_each(strings, cut):
    column = pa.array(["skipped"] * cut + strings, pa.string()).slice(cut)  # a slice: offsets past its start
    assert crc32_of_strings(column).tolist() == [zlib.crc32(s.encode("utf-8")) for s in strings]
