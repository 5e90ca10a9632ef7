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
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from store.joins import JoinCommit, JoinEvent, JoinState


@dataclass(frozen=True)
class JoinRule:
    name: str
    within_ms: int
    late_horizon_ms: int

    @property
    def keep_ms(self) -> int:
        return self.within_ms + self.late_horizon_ms


class DerivedRow(NamedTuple):
    """A row of a derived stream (a pattern's match; a join's rows come as DerivedColumns)."""

    time_ms: int
    dims: tuple[str | None, ...]  # the left event's dimension values; () on unmatched_right rows
    values: Mapping[str, int]  # the JOIN_VALUES this row carries


@dataclass
class DerivedColumns:
    """A batch's derived rows by kind, as columns: one per search (its time and dims), one per
    pair (the left's time and dims, `clicked` on the left's first pair, the latency) in the order
    the join made them (each latency goes into its pane's KLL in that order), one per right event
    that left the state unmatched (its time). No object per row: a batch has one per event."""

    search_ms: list[int] = field(default_factory=list)
    search_dims: list[tuple] = field(default_factory=list)
    pair_ms: list[int] = field(default_factory=list)
    pair_dims: list[tuple] = field(default_factory=list)
    pair_clicked: list[int] = field(default_factory=list)
    pair_latency: list[int] = field(default_factory=list)
    unmatched_ms: list[int] = field(default_factory=list)

    @property
    def rows(self) -> list[DerivedRow]:
        """The same rows as DerivedRows (for tests and reading; the pipeline rolls up the columns)."""
        return ([DerivedRow(t, d, {"searches": 1}) for t, d in zip(self.search_ms, self.search_dims, strict=True)]
                + [DerivedRow(t, d, {"pairs": 1, "clicked": c, "latency_ms": v}) for t, d, c, v
                   in zip(self.pair_ms, self.pair_dims, self.pair_clicked, self.pair_latency, strict=True)]
                + [DerivedRow(t, (), {"unmatched_right": 1}) for t in self.unmatched_ms])


@dataclass(frozen=True)
class JoinOutcome:
    columns: DerivedColumns
    commit: JoinCommit

    @property
    def rows(self) -> list[DerivedRow]:
        return self.columns.rows


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


_ORDER = itemgetter(0, 1, 2)  # time, partition, offset: the order a batch takes events in (a replay takes the same)


def _slots(stored: Sequence[JoinEvent], new: Sequence[JoinEvent], flags: list[bool]) -> list[int]:
    """Each new event's slot in `flags` (the matched flags, the stored events' first): a new slot,
    False, or the stored event's at the same place (partition, offset): the store keeps one row
    per place, and they share it."""
    first = len(flags)
    flags.extend([False] * len(new))
    if not stored:
        return list(range(first, first + len(new)))
    at = {(e.partition, e.offset): i for i, e in enumerate(stored)}
    return [at.get((e.partition, e.offset), first + i) for i, e in enumerate(new)]


def join_batch(rule: JoinRule, state: JoinState, lefts: Sequence[JoinEvent], rights: Sequence[JoinEvent],
               clock_ms: int | None) -> JoinOutcome:
    """One batch of a join; `clock_ms` is the join's clock after it (join_clock). `state` holds
    the stored events with the batch's keys, and every stored right event that expires at that
    clock (store.joins.lookup reads that): those are judged here, the others are dropped by time
    in the store."""
    clock = state.clock_ms if clock_ms is None or (state.clock_ms is not None and clock_ms < state.clock_ms) else clock_ms
    through = expire_through(clock, rule.keep_ms)
    within = rule.within_ms
    new_lefts, new_rights = sorted(lefts, key=_ORDER), sorted(rights, key=_ORDER)
    # Matched flags as the batch leaves them, one slot per event (and place: _slots).
    left_flags, right_flags = [e.matched for e in state.lefts], [e.matched for e in state.rights]
    left_slots, right_slots = _slots(state.lefts, new_lefts, left_flags), _slots(state.rights, new_rights, right_flags)
    stored_right: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(state.rights):
        stored_right[e.key].append(i)
    # The left events each new right event can meet, by key: stored ones, then new ones (only the
    # keys of new right events: most new left events have none).
    right_keys = {e.key for e in new_rights}
    candidates: dict[str, list[tuple[JoinEvent, int]]] = defaultdict(list)
    for i, e in enumerate(state.lefts):
        if e.key in right_keys:
            candidates[e.key].append((e, i))
    out = DerivedColumns()
    pair_ms, pair_dims, pair_clicked, pair_latency = out.pair_ms, out.pair_dims, out.pair_clicked, out.pair_latency
    pairs = 0
    # New left events meet the stored right events (the new right events meet them below).
    stored_rights = state.rights
    for left, slot in zip(new_lefts, left_slots, strict=True):
        t, key = left.time_ms, left.key
        first = True
        for j in stored_right.get(key, ()):
            r_time = stored_rights[j].time_ms
            if t <= r_time <= t + within:
                right_flags[j] = True
                pair_ms.append(t)
                pair_dims.append(left.dims)
                pair_clicked.append(int(first))
                pair_latency.append(r_time - t)
                first = False
                pairs += 1
        left_flags[slot] = not first
        if key in right_keys:
            candidates[key].append((left, slot))
    # New right events meet every left event: stored and new.
    for right, slot in zip(new_rights, right_slots, strict=True):
        r_time = right.time_ms
        found = candidates.get(right.key, ())
        if len(found) > 1:
            found = sorted(found, key=lambda c: _ORDER(c[0]))
        for left, at in found:
            t = left.time_ms
            if t <= r_time <= t + within:
                first = not left_flags[at]
                left_flags[at] = True
                right_flags[slot] = True
                pair_ms.append(t)
                pair_dims.append(left.dims)
                pair_clicked.append(int(first))
                pair_latency.append(r_time - t)
                pairs += 1
    out.search_ms = [e.time_ms for e in new_lefts]
    out.search_dims = [e.dims for e in new_lefts]
    unmatched = 0
    keep_lefts, keep_rights = [], []
    for before, new, slots, flags, keep, side_right in (
            (state.lefts, new_lefts, left_slots, left_flags, keep_lefts, False),
            (state.rights, new_rights, right_slots, right_flags, keep_rights, True)):
        for is_new, events, places in ((False, before, range(len(before))), (True, new, slots)):
            for e, slot in zip(events, places, strict=True):
                now_matched = flags[slot]
                if through is not None and e.time_ms <= through:  # leaves the state
                    if side_right and not now_matched:
                        out.unmatched_ms.append(e.time_ms)
                        unmatched += 1
                    continue
                if now_matched != e.matched:
                    keep.append(e._replace(matched=now_matched))
                elif is_new:
                    keep.append(e)
    commit = JoinCommit(rule.name, clock, through, keep_lefts, keep_rights, pairs, unmatched)
    return JoinOutcome(out, commit)
