"""The window join's rule, per micro-batch (catalog/joins.py declares a join). Pure: the state
before the batch, the batch's events and the join's clock after the batch are passed in; the
derived rows and the state changes come out. No I/O. The join's clock is the lower of its two
streams' watermarks after the batch (`join_clock`), each by the store's per-partition rule
(store/watermarks.py): a partition of either side that lags, with unread records, holds the clock
back, so the events it still has find their partners instead of a state that expired without
them; and a batch of one side only (clicks, say) cannot move the clock past the other's progress.

A right event r matches a left event l when their keys are equal and l.time <= r.time <=
l.time + within. Every event stays in the join's state until the clock passes its time + within
+ late_horizon (the clock never goes back); two events pair when they are in the same batch or
when the one that came first is still in the state when the other comes, whatever their order
of arrival: a click that comes before its search waits for it, a click later than the allowed
lateness still finds its search within the late horizon. So while nothing has expired the
result is the exact join, however the events are split into batches (the property tests check
it against a brute-force join).

Derived rows (catalog.joins.JOIN_VALUES): one `searches` row per left event at its own time;
one `pairs` row per pair at the LEFT time, with its latency and `clicked` = 1 on the left
event's first pair; one `unmatched_right` row at the right event's own time (no dimensions)
when a right event leaves the state without having matched any left. Nothing is dropped: a
right event is either in a pair or counted unmatched (or still in the state).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from store.joins import JoinCommit, JoinEvent, JoinState


@dataclass(frozen=True)
class JoinRule:
    name: str
    within_ms: int
    late_horizon_ms: int

    @property
    def keep_ms(self) -> int:
        return self.within_ms + self.late_horizon_ms


@dataclass(frozen=True)
class DerivedRow:
    time_ms: int
    dims: tuple[str | None, ...]  # the left event's dimension values; () on unmatched_right rows
    values: Mapping[str, int]  # the JOIN_VALUES this row carries


@dataclass(frozen=True)
class JoinOutcome:
    rows: list[DerivedRow]
    commit: JoinCommit


def join_clock(clock_ms: int | None, left_watermark_ms: int | None, right_watermark_ms: int | None) -> int | None:
    """The join's clock after a batch: the lower of the two streams' watermarks (None while
    either has none: nothing expires yet); never goes back."""
    if left_watermark_ms is None or right_watermark_ms is None:
        return clock_ms
    candidate = min(left_watermark_ms, right_watermark_ms)
    return candidate if clock_ms is None else max(clock_ms, candidate)


def expire_through(clock_ms: int | None, keep_ms: int) -> int | None:
    """Events with time <= this have left the state (the clock passed their time + keep)."""
    return None if clock_ms is None else clock_ms - keep_ms


def in_window(left_ms: int, right_ms: int, within_ms: int) -> bool:
    return left_ms <= right_ms <= left_ms + within_ms


def _order(e: JoinEvent) -> tuple[int, int, int]:
    """The order a batch takes events in: time, partition, offset (a replay takes the same)."""
    return e.time_ms, e.partition, e.offset


def join_batch(rule: JoinRule, state: JoinState, lefts: Sequence[JoinEvent], rights: Sequence[JoinEvent],
               clock_ms: int | None) -> JoinOutcome:
    """One batch of a join; `clock_ms` is the join's clock after it (join_clock). `state` holds
    the stored events with the batch's keys, and every stored right event that expires at that
    clock (store.joins.lookup reads that): those are judged here, the others are dropped by time
    in the store."""
    clock = state.clock_ms if clock_ms is None or (state.clock_ms is not None and clock_ms < state.clock_ms) else clock_ms
    through = expire_through(clock, rule.keep_ms)
    stored_left: dict[str, list[JoinEvent]] = defaultdict(list)
    for e in state.lefts:
        stored_left[e.key].append(e)
    stored_right: dict[str, list[JoinEvent]] = defaultdict(list)
    for e in state.rights:
        stored_right[e.key].append(e)
    # Matched flags as the batch leaves them, by (side, partition, offset).
    matched: dict[tuple[str, int, int], bool] = {}
    for side, events in (("l", state.lefts), ("r", state.rights)):
        for e in events:
            matched[(side, e.partition, e.offset)] = e.matched
    rows: list[DerivedRow] = []
    pairs = 0

    def pair(left: JoinEvent, right: JoinEvent) -> None:
        nonlocal pairs
        first = not matched[("l", left.partition, left.offset)]
        matched[("l", left.partition, left.offset)] = True
        matched[("r", right.partition, right.offset)] = True
        rows.append(DerivedRow(left.time_ms, left.dims, {"pairs": 1, "clicked": int(first),
                                                         "latency_ms": right.time_ms - left.time_ms}))
        pairs += 1

    new_lefts, new_rights = sorted(lefts, key=_order), sorted(rights, key=_order)
    # New left events meet the stored right events (the new right events meet them below).
    for left in new_lefts:
        matched[("l", left.partition, left.offset)] = False
        rows.append(DerivedRow(left.time_ms, left.dims, {"searches": 1}))
        for right in stored_right.get(left.key, ()):
            if in_window(left.time_ms, right.time_ms, rule.within_ms):
                pair(left, right)
        stored_left[left.key].append(left)
    # New right events meet every left event: stored and new.
    for right in new_rights:
        matched.setdefault(("r", right.partition, right.offset), False)
        candidates = stored_left.get(right.key, ())
        for left in (sorted(candidates, key=_order) if len(candidates) > 1 else candidates):
            if in_window(left.time_ms, right.time_ms, rule.within_ms):
                pair(left, right)
    unmatched = 0
    keep_lefts, keep_rights = [], []
    for side, before, new, out in (("l", state.lefts, new_lefts, keep_lefts), ("r", state.rights, new_rights, keep_rights)):
        for is_new, events in ((False, before), (True, new)):
            for e in events:
                now_matched = matched[(side, e.partition, e.offset)]
                if through is not None and e.time_ms <= through:  # leaves the state
                    if side == "r" and not now_matched:
                        rows.append(DerivedRow(e.time_ms, (), {"unmatched_right": 1}))
                        unmatched += 1
                    continue
                if now_matched != e.matched:
                    out.append(JoinEvent(e.time_ms, e.partition, e.offset, e.key, e.dims, now_matched))
                elif is_new:
                    out.append(e)
    commit = JoinCommit(rule.name, clock, through, keep_lefts, keep_rights, pairs, unmatched)
    return JoinOutcome(rows, commit)
