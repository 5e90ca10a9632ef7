"""A check shared by the store and pipeline tests: every tier row a store keeps equals the
roll-up of the panes it covers (exact stats, revision), and no tier row is missing or extra. The
rows of the folded tiers cover the panes before their shard's fold point (store/tier_folds.py)."""

from __future__ import annotations

import pytest

from store import PaneStore, tier_folds
from store.panes import dims_key
from store.tiers import tier_deltas


def assert_tiers_match_panes(store: PaneStore, stream: str) -> int:
    """Returns the number of tier rows checked (the caller can insist on some)."""
    layout = store.tier_layout(stream)
    assert layout is not None, f"the store keeps no tiers for {stream!r}"
    panes = [(p.key.start_ms, p.key.dims_dict(), p.data, p.revision) for p in store.read_panes(stream, -2**62, 2**62)]
    clock = store.tier_fold_clock(stream)
    if clock is None:
        expected = tier_deltas(panes, layout)
    else:
        coarse = set(layout.folded_granules())
        expected = tier_deltas(panes, layout, set(layout.granules_ms()) - coarse)
        points = tier_folds.shard_points(layout, clock)  # each pane before its shard's point
        before = [p for p in panes if p[0] < points[tier_folds.shard(dims_key(p[1]))]]
        if before:
            expected.update(tier_deltas(before, layout, coarse))
    stored = {}
    for tier in layout.tiers():
        for row in store.read_tier(stream, tier.granule_ms, tier.proj, -2**62, 2**62, pane_ms=layout.pane_ms):
            stored[(tier.granule_ms, tier.proj, row.key.start_ms, row.key.dims)] = row
    assert set(stored) == {(k.granule_ms, k.proj, k.start_ms, k.dims) for k in expected}
    for key, delta in expected.items():
        row = stored[(key.granule_ms, key.proj, key.start_ms, key.dims)]
        assert (row.data.count, row.revision) == (delta.data.count, delta.revision), key
        for name, want in delta.data.values.items():
            got = row.data.values[name]
            assert (got.n, got.min, got.max) == (want.n, want.min, want.max), (key, name)
            assert got.sum == pytest.approx(want.sum, rel=1e-9, abs=1e-9), (key, name)
    return len(stored)
