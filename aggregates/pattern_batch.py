"""One pattern over one micro-batch: buffer, release in event-time order, match. Pure: the stored
state the batch touches, the batch's events and the watermark are passed in; the matches and
the state changes come out. No I/O, no clock (aggregates/patterns.py reads and writes).

The matcher (patterns/) must see each key's events in event-time order. Events arrive in any
order, so they wait in the pattern's buffer until its watermark passes them; then the released
ones are fed per key sorted (time, stream, partition, offset) and the matcher is advanced to
the watermark (absences due are decided, partial matches past `within` dropped). Buffering an
event reads nothing: a key's state is read only when its events are released or it is due.

The pattern's watermark is the lowest of its streams' watermarks as the store holds them before
the batch (the watermark that decides which panes are final), never going back: every event of
every stream the pattern reads up to it has been seen, whatever the order of arrival. A stream
that has no watermark yet (no event ever) does not hold it back. An event at or behind the
watermark the pattern already advanced to is late for the pattern: the moments it belongs to
are decided. It is not fed (the matcher would run it out of order); it is recorded and counted,
and where its key's kept history (pattern_history: the events fed, each marked when its key held
nothing that could still matter at its time: PatternMatcher.holds_at) has such a point before the
late event, the key's run is
replayed from there with and without it (patterns/corrections.py): the matches it adds are
published flagged late, those it breaks are retracted, and the key's state becomes the replay's,
the state an in-order run over every event would hold. The history is kept for the pattern's span
(within + absence window) plus LATE_HORIZON_MS behind the watermark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from patterns.corrections import correct
from patterns.events import Match, PatternEvent
from patterns.matcher import PatternMatcher, run_start_times
from patterns.plan import Plan
from store.patterns import (BufferedEvent, HistoryEvent, KeyState, LateEvent, NewMatch, PatternCommit, PatternLoad,
                            PublishedMatch)

# How far behind the pattern's watermark a late event can still be corrected (beyond the
# pattern's own span): the events fed are kept that long. A constant for now (a per-pattern
# setting is the next step).
LATE_HORIZON_MS = 60 * 60_000


@dataclass(frozen=True)
class PatternBatch:
    commit: PatternCommit
    matches: list[Match]  # decided in order by this batch's events and watermark
    released: int  # events fed to the matcher in this batch
    added: Sequence[Match] = ()  # matches late events completed (published flagged late: `late` set)
    # Published matches late events broke (withdrawn), with the dims and late flag they were stored with.
    retracted: Sequence[Match] = ()


@dataclass(frozen=True)
class LateCorrection:
    """What a batch's correctable late events change: matches added and retracted, the keys'
    states after the replay (None: the key holds nothing), their history rewritten."""

    added: list[Match]
    retracted: list[Match]
    states: dict[str, dict | None]
    history: dict[str, list[HistoryEvent]]


def may_take(plan: Plan, event: PatternEvent) -> bool:
    """Whether some step (or the absence step) might take the event: its conditions but `same_as`
    hold (aggregates/patterns.py `may_match`, by the same rule, leaves the others out of the
    buffer). One that none might take changes nothing the matcher decides, unless a step is `next`
    (then every event of a key matters)."""
    if plan.any_strict():
        return True
    steps = (*plan.steps, *((plan.absence,) if plan.absence else ()))
    return any(step.passes_unbound(event.stream, event.fields) for step in steps)


def history_span_ms(plan: Plan) -> int:
    """How long behind the pattern's watermark its keys' fed events are kept for replays."""
    return LATE_HORIZON_MS + (plan.within or 0) + (plan.absence_within or 0)


def correct_late(plan: Plan, history: Mapping[str, Sequence[HistoryEvent]], late: Sequence[PatternEvent],
                 watermark_ms: int) -> LateCorrection:
    """Per key with late events: replay its kept history from its first restart (an event fed
    while the key held nothing that could still matter: the run from there depends on nothing
    before) with and without
    the late events after that point, to the watermark they came behind. A late event before
    it (or with no history kept) cannot be corrected: it stays only recorded as late."""
    added: list[Match] = []
    retracted: list[Match] = []
    states: dict[str, dict | None] = {}
    rewritten: dict[str, list[HistoryEvent]] = {}
    by_key: dict[str, dict[tuple, PatternEvent]] = {}
    for e in late:
        by_key.setdefault(e.key, {})[(e.stream, e.partition, e.offset)] = e
    for key in sorted(by_key):
        kept = list(history.get(key, ()))
        start = next((i for i, h in enumerate(kept) if h.restart), None)
        if start is None:
            continue
        base = [PatternEvent(h.stream, h.partition, h.offset, h.time_ms, key, h.fields) for h in kept[start:]]
        seen = {(e.stream, e.partition, e.offset) for e in base}
        fixes = [e for place, e in by_key[key].items() if place not in seen and e.order > base[0].order]
        if not fixes:
            continue
        fix = correct(plan, base, fixes, watermark_ms)
        added += fix.added
        retracted += fix.retracted
        states[key] = fix.states.get(key)
        rewritten[key] = [HistoryEvent(key, e.stream, e.partition, e.offset, e.time, dict(e.fields),
                                       (e.stream, e.partition, e.offset) in fix.restarts)
                          for e in sorted([*base, *fixes], key=lambda e: e.order)]
    return LateCorrection(added, retracted, states, rewritten)


def as_published(retracted: Sequence[Match], published: Mapping[str, Sequence[PublishedMatch]]) -> list[Match]:
    """The retracted matches with the dimensions and late flag of the stored match each withdraws
    (the newest stored with its key, decided_at and events, as the store finds its id): a
    retraction takes its match back from the panes it went to (a match stored before matches
    kept dimensions: none). Not found (not expected): those the replay gives, late false."""
    out = []
    for m in retracted:
        events = [e.to_json() for e in m.events]
        stored = next((p for p in reversed(published.get(m.key, ()))
                       if p.decided_at_ms == m.decided_at and p.events == events), None)
        out.append(m if stored is None else replace(m, dims=dict(stored.dims), late=stored.late))
    return out


def pattern_watermark(before_ms: int | None, stream_watermarks: Mapping[str, int | None],
                      streams: Iterable[str]) -> int | None:
    """The pattern's watermark for this batch: the lowest of its streams' (those that have one),
    never below the one it advanced to before."""
    marks = [w for s in streams if (w := stream_watermarks.get(s)) is not None]
    if not marks:
        return before_ms
    low = min(marks)
    return low if before_ms is None else max(before_ms, low)


def decode(key: str, data: Sequence) -> PatternEvent:
    """A buffered event as a store written before pattern_buffer kept it with its key."""
    stream, partition, offset, time, fields = data
    return PatternEvent(stream, partition, offset, time, key, fields)


def due_ms(plan: Plan, state: Mapping | None) -> int | None:
    """The lowest watermark at which this key's partial matches have work: an absence deadline to
    decide, a partial match that `within` drops (its start + within). Its buffered events are
    found by their own time (store/patterns.py)."""
    if not state:
        return None
    times = [w["deadline"] for w in state.get("waiting", ()) if w.get("deadline") is not None]
    if plan.within is not None:
        times += [start + plan.within for start in run_start_times(state)]
    return min(times, default=None)


def run_pattern_batch(plan: Plan, load: PatternLoad, events: Sequence[PatternEvent],
                      watermark_ms: int | None) -> PatternBatch:
    """Buffer the batch's events, release and feed those at or before `watermark_ms` (the
    pattern's watermark for this batch: pattern_watermark) with the buffered ones it releases,
    per key in event-time order, then advance the matcher to it. `load` holds the pattern's
    watermark before the batch, the buffered events released (time at or before `watermark_ms`)
    and the stored keys that the released events touch or that are due by `watermark_ms` (the
    other keys have nothing to do). Only keys whose state changed are written back."""
    before = load.watermark_ms
    now = before if watermark_ms is None or (before is not None and watermark_ms < before) else watermark_ms
    late = [LateEvent(e.stream, e.partition, e.offset, e.time, before)
            for e in events if before is not None and e.time <= before]
    # Released per key, by place in the log (an event buffered twice is fed once); the rest buffered.
    ready: dict[str, dict[tuple, PatternEvent]] = {}
    buffer: list[BufferedEvent] = []
    for e in load.released:
        ready.setdefault(e.key, {})[(e.stream, e.partition, e.offset)] = PatternEvent(
            e.stream, e.partition, e.offset, e.time_ms, e.key, e.fields)
    legacy = [decode(key, d) for key, stored in load.keys.items() for d in stored.buffered]
    for e in (*legacy, *events):
        if before is not None and e.time <= before:
            continue
        if now is not None and e.time <= now:
            ready.setdefault(e.key, {})[(e.stream, e.partition, e.offset)] = e
        else:
            buffer.append(BufferedEvent(e.key, e.stream, e.partition, e.offset, e.time, dict(e.fields)))
    stored_states = {key: stored.state for key, stored in load.keys.items() if stored.state}
    fix = LateCorrection([], [], {}, {})
    # Replayed at the watermark they came behind; their keys' states become the replay's. A late
    # event no step might take is recorded only: it is neither fed nor kept, and replays nothing.
    fixes = [e for e in events if before is not None and e.time <= before and may_take(plan, e)]
    if fixes:
        fix = correct_late(plan, load.history, fixes, before)
        for key, state in fix.states.items():
            if state is None:
                stored_states.pop(key, None)
            else:
                stored_states[key] = state
    matcher = PatternMatcher.from_state(plan, {"watermark": before, "late_events": 0, "keys": stored_states})
    by_key: dict[str, list[Match]] = {}
    released = 0
    history = [h for rows in fix.history.values() for h in rows]
    for key in sorted(ready):
        for event in sorted(ready[key].values(), key=lambda e: e.order):
            history.append(HistoryEvent(key, event.stream, event.partition, event.offset, event.time,
                                        dict(event.fields), not matcher.holds_at(key, event.time)))
            outcome = matcher.feed(event)
            if outcome.matches:
                by_key.setdefault(key, []).extend(outcome.matches)
        released += len(ready[key])
    if now is not None and now != before:
        for match in matcher.advance(now):
            by_key.setdefault(match.key, []).append(match)
    # Per key in the order decided; across keys by decided_at (a stable sort keeps each key's order).
    matches = sorted((m for key in sorted(by_key) for m in by_key[key]), key=lambda m: m.decided_at)
    states = matcher.state()["keys"]
    keys: dict[str, KeyState] = {}
    for key in sorted(set(load.keys) | set(states)):
        state, stored = states.get(key), load.keys.get(key)
        if stored is not None and not stored.buffered and state == (stored.state or None):
            continue  # unchanged: not written
        if state is None:
            if stored is not None:
                keys[key] = KeyState()  # nothing pending any more: deleted
            continue
        keys[key] = KeyState(state, (), due_ms(plan, state), len(state["runs"]) + len(state["waiting"]))
    # The corrections first (they belong to moments before this batch's watermark), retractions
    # before additions, then the matches decided in order.
    retracted = as_published(fix.retracted, load.published)
    added = [replace(m, late=True) for m in sorted(fix.added, key=lambda m: m.decided_at)]
    new = [*(NewMatch(m.key, m.decided_at, [e.to_json() for e in m.events], dict(m.measures), True, True, dict(m.dims))
             for m in retracted),
           *(NewMatch(m.key, m.decided_at, [e.to_json() for e in m.events], dict(m.measures), True, dims=dict(m.dims))
             for m in added),
           *(NewMatch(m.key, m.decided_at, [e.to_json() for e in m.events], dict(m.measures), dims=dict(m.dims))
             for m in matches)]
    cut = None if now is None else now - history_span_ms(plan)
    commit = PatternCommit(plan.name, now, keys, new, late, buffer, matcher.dropped_runs,
                           history_rewritten=sorted(fix.history),
                           history=history, history_cut_ms=cut)
    return PatternBatch(commit, matches, released, added, retracted)
