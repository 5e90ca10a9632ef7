"""assign_partitions_columnar gives assign_partitions' answers for a column of keys."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.partitioner import assign_partitions, assign_partitions_columnar


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
