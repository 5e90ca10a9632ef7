"""store/commit_plan.py: what a batch commit decides, as plain functions (no store at all).
The stores' contract tests check the same rules through both backends; these pin the rules
themselves, where a change (per-partition watermarks, say) is made once."""

from __future__ import annotations

import pytest

from store import BatchCommit, PaneData, PanePartial
from store.commit_plan import (
    StoredPane,
    StreamState,
    pane_ids,
    pane_keys,
    plan_batch,
    rebuild_chunks,
    retention_horizons,
    tier_row_after,
)
from store.panes import EMPTY_SUMMARY, dims_key
from store.tiers import TierDelta, TierLayout

PANE = 10_000
T0 = 1_700_000_000_000


def partial(start: int, count: int, stream: str = "s") -> PanePartial:
    return PanePartial(stream, start, start + PANE, {"d": "x"}, PaneData(count))


def test_two_partials_of_one_final_pane_merge_in_turn_each_a_correction():
    commit = BatchCommit("main", 4, [partial(T0, 2), partial(T0, 3)], 5)
    pane = ("s", T0, dims_key({"d": "x"}))
    assert pane_ids(commit) == [pane]
    plan = plan_batch(commit, {pane: StoredPane(PaneData(1), 1)}, {"s": StreamState(T0 + PANE, T0 + PANE)},
                      {"s": 0}, {})
    assert [(w.data.count, w.revision, w.count_added) for w in plan.panes] == [(3, 2, 2), (6, 3, 3)]
    assert [(c.revision_from, c.revision_to, c.old["count"], c.new["count"])
            for c in (w.correction for w in plan.panes)] == [(1, 2, 1, 3), (2, 3, 3, 6)]
    assert (plan.panes_new, plan.panes_updated, plan.corrections) == (0, 2, 2)


def test_keys_computed_once_by_the_backend_plan_as_keys_computed_by_the_plan():
    # A backend computes each partial's dimension text once (pane_keys) for the load and the plan;
    # the plan is the one it makes computing them itself, and keys of another batch are refused.
    partials = [PanePartial("s", T0, T0 + PANE, {"b": "2", "a": "1"}, PaneData(1)),
                PanePartial("s", T0, T0 + PANE, {"a": "1", "b": "2"}, PaneData(2)),
                PanePartial("s", T0, T0 + PANE, {"a": 1}, PaneData(3)),  # not text: another pane, not cached as "1"
                PanePartial("s", T0 + PANE, T0 + 2 * PANE, {}, PaneData(4))]
    commit = BatchCommit("main", 0, partials, 10)
    keys = pane_keys(commit)
    assert keys == ['{"a":"1","b":"2"}', '{"a":"1","b":"2"}', '{"a":1}', "{}"]
    assert pane_ids(commit, keys) == pane_ids(commit) == [("s", T0, keys[0]), ("s", T0, keys[2]), ("s", T0 + PANE, "{}")]
    layouts = {"s": TierLayout(PANE, 86_400_000, ((60_000, 86_400_000),))}
    assert plan_batch(commit, {}, {}, {}, layouts, keys=keys) == plan_batch(commit, {}, {}, {}, layouts)
    with pytest.raises(ValueError):
        plan_batch(commit, {}, {}, {}, layouts, keys=keys[:2])


def test_a_provisional_new_pane_is_revision_1_and_no_correction():
    plan = plan_batch(BatchCommit("main", 0, [partial(T0, 2)], 2), {}, {}, {}, {})
    [write] = plan.panes
    assert (write.revision, write.correction, plan.panes_new) == (1, None, 1)


def test_a_pane_born_final_records_a_correction_from_empty():
    plan = plan_batch(BatchCommit("main", 0, [partial(T0, 2)], 2), {}, {"s": StreamState(T0 + PANE)}, {}, {})
    [write] = plan.panes
    assert write.revision == 2 and write.correction.old == EMPTY_SUMMARY


def test_the_watermark_and_newest_event_never_go_back():
    before = {"s": StreamState(watermark_ms=T0, max_event_ms=T0 + 30_000)}
    older = BatchCommit("main", 1, [partial(T0 - PANE, 1)], 1, max_event_ms={"s": T0 - 5_000})
    [update] = plan_batch(older, {}, before, {"s": 30_000}, {}).streams
    assert (update.watermark_ms, update.max_event_ms, update.aggregated, update.read) == (T0, T0 + 30_000, 1, 1)
    newer = BatchCommit("main", 2, [], 0, max_event_ms={"s": T0 + 90_000})
    [update] = plan_batch(newer, {}, before, {"s": 30_000}, {}).streams
    assert (update.watermark_ms, update.max_event_ms) == (T0 + 60_000, T0 + 90_000)


def test_dead_letters_count_toward_read_and_a_broken_invariant_is_refused():
    commit = BatchCommit("main", 0, [partial(T0, 2)], 5, read_by_stream={"s": 5},
                         dead_by_stream={"s": {"future_skew": 3, "unparseable": 0}})
    plan = plan_batch(commit, {}, {}, {}, {})
    assert plan.dead_counts == {("s", "future_skew"): 3}
    [update] = plan.streams
    assert (update.aggregated, update.dead_lettered, update.read, update.watermark_ms) == (2, 3, 5, None)
    with pytest.raises(ValueError, match="6 records read but 2 aggregated"):
        plan_batch(BatchCommit("main", 0, [partial(T0, 2)], 6, read_by_stream={"s": 6}), {}, {}, {}, {})


def test_tier_deltas_only_for_streams_that_keep_tiers_and_rows_keep_their_highest_revision():
    layout = TierLayout(PANE, 86_400_000, ((60_000, 86_400_000),), ("",))
    commit = BatchCommit("main", 0, [partial(T0, 2), partial(T0, 1, stream="t")], 3)
    plan = plan_batch(commit, {}, {}, {}, {"s": layout})
    assert set(plan.tier_deltas) == {"s"} and plan.tier_deltas["s"]
    after = tier_row_after(StoredPane(PaneData(4), 3), TierDelta({}, PaneData(2), 1))
    assert (after.data.count, after.revision) == (6, 3)
    assert tier_row_after(None, TierDelta({}, PaneData(2), 1)) == StoredPane(PaneData(2), 1)


def test_retention_and_rebuild_spans():
    assert retention_horizons(None, {"s": 5}) == {}
    assert retention_horizons(100, {"s": 30, "t": 200}) == {"s": 70, "t": -100}
    layout = TierLayout(PANE, 86_400_000, ((60_000, 86_400_000), (3_600_000, 86_400_000)))
    chunks = rebuild_chunks(T0 + 5 * 3_600_000 + 7, T0 + 20 * 3_600_000, layout, chunk_ms=5 * 3_600_000 + 1)
    assert all((hi - lo) % 3_600_000 == 0 and lo % 3_600_000 == 0 for lo, hi in chunks)
    assert chunks[0][0] <= T0 + 5 * 3_600_000 + 7 and chunks[-1][1] > T0 + 20 * 3_600_000
