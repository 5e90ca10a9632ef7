"""sketches.kll_exact.exact_bytes_per_group, which writes the exact-mode KLL bytes of many groups
at once: each group of at most k items gets the bytes DataSketches writes for a sketch fed its
items in order, a group past k none (its sketch compacts: the caller asks DataSketches), whatever
mix of empty, one-item, exact and compacting groups sits around it."""

from __future__ import annotations

import numpy as np
from datasketches import kll_doubles_sketch
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.kll_exact import exact_bytes_per_group

K = 8
groups = st.lists(st.lists(st.floats(-1e12, 1e12).map(lambda f: f + 0.0), max_size=K + 3), max_size=12)


@settings(max_examples=150, deadline=None)
@given(groups)
def test_each_group_of_at_most_k_items_is_what_datasketches_writes(members):
    counts = np.array([len(m) for m in members], np.int64)
    items = np.array([x for m in members for x in m], np.float64)
    lo = np.array([min(m, default=np.inf) for m in members])
    hi = np.array([max(m, default=-np.inf) for m in members])
    got = exact_bytes_per_group(items, counts, lo, hi, K).to_pylist()
    assert len(got) == len(members)
    for blob, m in zip(got, members, strict=True):
        if len(m) > K:
            assert blob == b""
            continue
        sketch = kll_doubles_sketch(K)
        for x in m:
            sketch.update(x)
        assert blob == sketch.serialize()
