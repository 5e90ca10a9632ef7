"""One pattern over one micro-batch: buffer, release in event-time order, match. Pure: the stored
state the batch touches, the batch's events and the watermark are passed in; the matches and
the state changes come out. No I/O, no clock (aggregates/patterns.py reads and writes).

The matcher (patterns/) must see each key's events in event-time order. Events arrive in any
order, so each key's events wait in a buffer until the pattern's watermark passes them; then the
released ones are fed sorted (time, stream, partition, offset) and the matcher is advanced to
the watermark (absences due are decided, partial matches past `within` dropped).

The pattern's watermark is the lowest of its streams' watermarks as the store holds them before
the batch (the watermark that decides which panes are final), never going back: every event of
every stream the pattern reads up to it has been seen, whatever the order of arrival. A stream
that has no watermark yet (no event ever) does not hold it back. An event at or behind the
watermark the pattern already advanced to is late for the pattern: the moments it belongs to
are decided. It is not fed (the matcher would run it out of order); it is recorded and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from patterns.events import Match, PatternEvent
from patterns.matcher import PatternMatcher
from patterns.plan import Plan
from store.patterns import KeyState, LateEvent, NewMatch, PatternCommit, PatternLoad


@dataclass(frozen=True)
class PatternBatch:
    commit: PatternCommit
    matches: list[Match]
    released: int  # events fed to the matcher in this batch


def pattern_watermark(before_ms: int | None, stream_watermarks: Mapping[str, int | None],
                      streams: Iterable[str]) -> int | None:
    """The pattern's watermark for this batch: the lowest of its streams' (those that have one),
    never below the one it advanced to before."""
    marks = [w for s in streams if (w := stream_watermarks.get(s)) is not None]
    if not marks:
        return before_ms
    low = min(marks)
    return low if before_ms is None else max(before_ms, low)


def encode(event: PatternEvent) -> list:
    return [event.stream, event.partition, event.offset, event.time, event.fields]


def decode(key: str, data: Sequence) -> PatternEvent:
    stream, partition, offset, time, fields = data
    return PatternEvent(stream, partition, offset, time, key, fields)


def due_ms(plan: Plan, state: Mapping | None, buffered: Sequence[PatternEvent]) -> int | None:
    """The lowest watermark at which this key has work: a buffered event to release, an absence
    deadline to decide, a partial match that `within` drops (its start + within)."""
    times = [e.time for e in buffered]
    if state:
        times += [w["deadline"] for w in state.get("waiting", ()) if w.get("deadline") is not None]
        if plan.within is not None:
            times += [r["taken"][0][4] + plan.within for r in state.get("runs", ()) if r.get("taken")]
    return min(times, default=None)


def run_pattern_batch(plan: Plan, load: PatternLoad, events: Sequence[PatternEvent],
                      watermark_ms: int | None) -> PatternBatch:
    """Buffer the batch's events per key, release and feed those at or before `watermark_ms` (the
    pattern's watermark for this batch: pattern_watermark), then advance the matcher to it.
    `load` holds the pattern's watermark before the batch and the stored keys the batch's events
    touch or that are due by `watermark_ms` (the other keys have nothing to do)."""
    before = load.watermark_ms
    now = before if watermark_ms is None or (before is not None and watermark_ms < before) else watermark_ms
    late = [LateEvent(e.stream, e.partition, e.offset, e.time, before)
            for e in events if before is not None and e.time <= before]
    buffers: dict[str, dict[tuple, PatternEvent]] = {}
    for key, stored in load.keys.items():
        buffers[key] = {(e.stream, e.partition, e.offset): e for e in (decode(key, d) for d in stored.buffered)}
    for e in events:
        if before is None or e.time > before:
            buffers.setdefault(e.key, {})[(e.stream, e.partition, e.offset)] = e
    matcher = PatternMatcher.from_state(plan, {
        "watermark": before, "late_events": 0,
        "keys": {key: stored.state for key, stored in load.keys.items() if stored.state}})
    by_key: dict[str, list[Match]] = {}
    kept: dict[str, list[PatternEvent]] = {}
    released = 0
    for key in sorted(buffers):
        pending = sorted(buffers[key].values(), key=lambda e: e.order)
        ready = [e for e in pending if now is not None and e.time <= now]
        kept[key] = pending[len(ready):]
        for event in ready:
            by_key.setdefault(key, []).extend(matcher.feed(event).matches)
        released += len(ready)
    if now is not None and now != before:
        for match in matcher.advance(now):
            by_key.setdefault(match.key, []).append(match)
    # Per key in the order decided; across keys by decided_at (a stable sort keeps each key's order).
    matches = sorted((m for key in sorted(by_key) for m in by_key[key]), key=lambda m: m.decided_at)
    states = matcher.state()["keys"]
    keys: dict[str, KeyState] = {}
    for key in sorted(set(buffers) | set(load.keys) | set(states)):
        state, buffered = states.get(key), kept.get(key, [])
        partial = len(state["runs"]) + len(state["waiting"]) if state else 0
        keys[key] = KeyState(state, tuple(encode(e) for e in buffered), due_ms(plan, state, buffered), partial)
    new = [NewMatch(m.key, m.decided_at, [e.to_json() for e in m.events], dict(m.measures)) for m in matches]
    return PatternBatch(PatternCommit(plan.name, now, keys, new, late), matches, released)
