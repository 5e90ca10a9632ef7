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
from dataclasses import dataclass

from patterns.events import Match, PatternEvent
from patterns.matcher import PatternMatcher
from patterns.plan import Plan


@dataclass(frozen=True)
class Correction:
    added: list[Match]  # found with the late events, not published: to publish, flagged late
    retracted: list[Match]  # published, not found with the late events: to withdraw


def replay(plan: Plan, events: Iterable[PatternEvent], watermark: int) -> list[Match]:
    """The in-order run over `events` (any order of arrival; an event twice by its place in the
    log counts once), from an empty state, advanced to `watermark`."""
    unique = {(e.stream, e.partition, e.offset): e for e in events}
    matcher = PatternMatcher(plan)
    out: list[Match] = []
    for event in sorted(unique.values(), key=lambda e: e.order):
        out += matcher.feed(event).matches
    return out + matcher.advance(watermark)


def _identity(match: Match) -> tuple:
    return match.key, match.decided_at, match.events


def correct(plan: Plan, history: Sequence[PatternEvent], late: Sequence[PatternEvent], watermark: int) -> Correction:
    """The correction the late events bring to the matches of the in-order run over `history`:
    the events fed since a point where their keys' state was empty, up to `watermark` (the
    watermark the late events arrived behind). Late events before that point cannot be
    corrected this way (the run before it is not kept) and stay only counted."""
    published = replay(plan, history, watermark)
    corrected = replay(plan, [*history, *late], watermark)
    before = {_identity(m) for m in published}
    after = {_identity(m) for m in corrected}
    return Correction([m for m in corrected if _identity(m) not in before],
                      [m for m in published if _identity(m) not in after])
