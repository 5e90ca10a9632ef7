"""Late events as corrections of a key's matches (docs/patterns.md, "Late events"): pure, no I/O.

The pipeline feeds each key's events in event-time order up to the pattern's watermark; an
event that comes behind it is late and is not fed, so the published matches are those of the
in-order run without it. What the in-order run over every event would have found differs in
two ways: matches the late event completes or makes possible (added, published flagged `late`)
and matches it breaks (an absence it fills, a `next` run it interrupts, a match it displaces
under skip_past_last: retracted). Both come from replaying the key's events from a point where
its state was empty (nothing pending: the in-order run from there depends on nothing before),
with and without the late events, to the watermark, and comparing the two runs' matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from patterns.events import Match, PatternEvent
from patterns.matcher import PatternMatcher
from patterns.plan import Plan


@dataclass(frozen=True)
class Correction:
    added: list[Match]  # found with the late events, not published: to publish, flagged late
    retracted: list[Match]  # published, not found with the late events: to withdraw
    # The corrected run at the watermark: per key still holding something, the matcher's JSON
    # state of the key (a key absent holds nothing), and the places (stream, partition, offset)
    # of the events fed while their key held nothing that could still matter at their time
    # (PatternMatcher.holds_at: where a later replay may start).
    states: dict[str, dict] = field(default_factory=dict)
    restarts: frozenset[tuple[str, int, int]] = frozenset()


@dataclass(frozen=True)
class Replay:
    matches: list[Match]
    states: dict[str, dict]
    restarts: frozenset[tuple[str, int, int]]


def replay_run(plan: Plan, events: Iterable[PatternEvent], watermark: int) -> Replay:
    """The in-order run over `events` (any order of arrival; an event twice by its place in the
    log counts once), from an empty state, advanced to `watermark`: its matches, the keys' states
    after it, and the events fed while their key held nothing that could still matter at their
    time (restarts: PatternMatcher.holds_at, so marked as the pipeline marks them, whatever the
    watermark's advances between its batches)."""
    unique = {(e.stream, e.partition, e.offset): e for e in events}
    matcher = PatternMatcher(plan)
    out: list[Match] = []
    restarts = set()
    for place, event in sorted(unique.items(), key=lambda kv: kv[1].order):
        if not matcher.holds_at(event.key, event.time):
            restarts.add(place)
        out += matcher.feed(event).matches
    out += matcher.advance(watermark)
    return Replay(out, matcher.state()["keys"], frozenset(restarts))


def replay(plan: Plan, events: Iterable[PatternEvent], watermark: int) -> list[Match]:
    """The matches of the in-order run over `events` from an empty state (replay_run)."""
    return replay_run(plan, events, watermark).matches


def _identity(match: Match) -> tuple:
    return match.key, match.decided_at, match.events


def correct(plan: Plan, history: Sequence[PatternEvent], late: Sequence[PatternEvent], watermark: int) -> Correction:
    """The correction the late events bring to the matches of the in-order run over `history`:
    the events fed since a point where their keys' state was empty, up to `watermark` (the
    watermark the late events arrived behind). Late events before that point cannot be
    corrected this way (the run before it is not kept) and stay only counted. The corrected
    run's states are those an in-order run over every event would hold at `watermark`."""
    published = replay(plan, history, watermark)
    corrected = replay_run(plan, [*history, *late], watermark)
    before = {_identity(m) for m in published}
    after = {_identity(m) for m in corrected.matches}
    return Correction([m for m in corrected.matches if _identity(m) not in before],
                      [m for m in published if _identity(m) not in after], corrected.states, corrected.restarts)
