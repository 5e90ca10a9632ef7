"""A stored KLL is written with its level 0 sorted (sketches/kll_sorted.py): the same items and
weights, so the same answers, and the very bytes DataSketches writes once a quantile has sorted
that level itself; what is not a sketch in estimation mode is left as it is."""

from __future__ import annotations

import datasketches as ds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sketches import KllSketch
from sketches.kll_sorted import sorted_level_zero
from tests.unit.test_tiers import LAYOUT, MINUTE, T0, commit_all, store_at

# No signed zeros: a -0.0 and a 0.0 compare equal, so two sorts may leave them either way round.
values = st.floats(-1e9, 1e9, allow_nan=False).filter(lambda v: v != 0.0) | st.just(0.0)
RANKS = [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0]


def sketch_of(items: list[float], k: int = 200) -> ds.kll_doubles_sketch:
    s = ds.kll_doubles_sketch(k)
    for v in items:
        s.update(v)
    return s


@settings(max_examples=60, deadline=None)
@given(st.lists(values, min_size=201, max_size=3_000), st.integers(0, 2), st.sampled_from([8, 200]))
def test_level_zero_sorted_is_what_datasketches_writes_after_a_quantile(items, merges, k):
    s = sketch_of(items, k)
    for i in range(merges):  # merged sketches, as a tier row's are
        s.merge(sketch_of(items[i::3], k))
    raw = bytes(s.serialize())
    mine = sorted_level_zero(raw)
    s.get_quantiles([0.5])  # DataSketches sorts level 0 in place and flags it
    assert mine == bytes(s.serialize())
    got, want = ds.kll_doubles_sketch.deserialize(mine), ds.kll_doubles_sketch.deserialize(raw)
    assert got.get_quantiles(RANKS) == want.get_quantiles(RANKS)
    assert (got.n, got.num_retained, got.get_min_value(), got.get_max_value()) == (
        want.n, want.num_retained, want.get_min_value(), want.get_max_value())
    assert sorted_level_zero(mine) == mine  # once is enough


@given(st.lists(values, max_size=200))
def test_exact_mode_and_other_bytes_are_left_as_they_are(items):
    raw = KllSketch.merge_all([sketch_of(items).serialize()]).to_bytes()
    assert sorted_level_zero(raw) == raw  # exact mode: pinned to DataSketches' merge order (kll_exact)
    assert sorted_level_zero(b"") == b""
    assert sorted_level_zero(b"\x05\x01\x0f\x00") == b"\x05\x01\x0f\x00"


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_a_stores_tier_rows_keep_their_klls_level_zero_sorted(store_backend, seed):
    import random

    rnd = random.Random(seed)
    store = store_at(store_backend, LAYOUT)
    minute = [(T0 + rnd.randrange(MINUTE), {"a": rnd.choice("xy"), "b": "p", "c": "m"}, rnd.random(), "u1")
              for _ in range(900)]
    # A tier row made of a batch's panes (store/tier_levels.py), then merged with a later batch's (store/panes.py).
    for first_id, events in ((0, minute[:600]), (1, minute[600:])):
        commit_all(store, [events], first_id=first_id)
        rows = store.read_tier_sketch("s", MINUTE, "", T0, T0 + MINUTE, field="v", kind="kll")
        assert len(rows) == 1 and rows[0].count == (600 if first_id == 0 else 900)
        assert rows[0].sketch[3] & 2  # the flag DataSketches reads: level 0 sorted
        assert sorted_level_zero(rows[0].sketch) == rows[0].sketch
