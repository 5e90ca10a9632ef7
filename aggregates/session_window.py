"""The session window's rule, per micro-batch (catalog/features.py declares `sessions: {key, gap}`).
Pure: the open sessions before the batch, the batch's runs and the stream's watermark after the
batch are passed in; the closed sessions and the state changes come out. No I/O.

Two events of a key belong to one session when a chain of the key's events links them with
less than `gap` between neighbours (Spark's session_window: a session ends `gap` after its last
event). A batch's events arrive already cut into runs, per key (aggregates/session_batch.py
computes them in Spark: sorted by time, cut where consecutive events are `gap` or more apart,
first/last/count per run). Runs and stored open sessions are each linked inside, so two of them
belong together exactly when their intervals come within less than `gap` of each other: the
rule sorts a key's runs and open sessions by first event and merges neighbours, which is the
sessionization of all their events (a run that bridges two open sessions merges all three).

A session closes when the watermark reaches its last event + gap (`last + gap <= watermark`,
as Spark's append mode emits a session window): it is emitted, once, and leaves the state. The
state is bounded by the watermark: it holds the sessions of the last `allowed_lateness + gap`.

Late events (behind the watermark) are not dropped: they extend or merge the open sessions they
come near, or form sessions of their own, which close at once when already behind the
watermark and are emitted into their start's pane (a correction when that pane is final). One
case differs from a sessionization of all events ever seen: an event that comes after a session
it touches had closed (it is behind the watermark by construction: its time < last + gap <=
watermark). The closed session stays as emitted (a pane holds mergeable sketches, which cannot
take a session back) and the late event starts a session of its own: one session more, split
where the exact one would be whole. Without such events the closed sessions are exactly those
of the sessionization of all events, however the events are split into batches (the property
tests check both against a brute-force sessionization).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from store.sessions import Session, SessionCommit


@dataclass(frozen=True)
class SessionOutcome:
    closed: list[Session]  # emitted by this batch, in (key, first) order
    commit: SessionCommit  # the state changes: open sessions removed and kept


def merge_runs(gap_ms: int, intervals: Sequence[Session]) -> list[Session]:
    """One key's runs and sessions merged where they come within less than `gap` of each other."""
    out: list[Session] = []
    for s in sorted(intervals, key=lambda s: (s.first_ms, s.last_ms)):
        if out and s.first_ms - out[-1].last_ms < gap_ms:
            cur = out[-1]
            out[-1] = Session(cur.key, cur.first_ms, max(cur.last_ms, s.last_ms), cur.events + s.events)
        else:
            out.append(s)
    return out


def closes(session: Session, gap_ms: int, watermark_ms: int | None) -> bool:
    return watermark_ms is not None and session.last_ms + gap_ms <= watermark_ms


def due_through(gap_ms: int, watermark_ms: int | None) -> int | None:
    """Open sessions whose last event is at or before this close at `watermark_ms`."""
    return None if watermark_ms is None else watermark_ms - gap_ms


def session_batch(stream: str, gap_ms: int, stored: Sequence[Session], runs: Sequence[Session],
                  watermark_ms: int | None) -> SessionOutcome:
    """One batch of a stream's sessions. `stored`: the open sessions with a key of the batch and
    every one due to close at `watermark_ms` (store.sessions.lookup reads that); `runs`: the
    batch's runs; `watermark_ms`: the stream's watermark once this batch is committed."""
    by_key: dict[str, list[Session]] = defaultdict(list)
    for s in (*stored, *runs):
        by_key[s.key].append(s)
    closed: list[Session] = []
    open_now: list[Session] = []
    for key in sorted(by_key):
        for session in merge_runs(gap_ms, by_key[key]):
            (closed if closes(session, gap_ms, watermark_ms) else open_now).append(session)
    before, after = set(stored), set(open_now)
    # A stored session that closed, grew or merged into another leaves its row (a grown one is
    # written again under its first event); one that came out of the merge unchanged stays as is.
    removed = sorted(s for s in before if s not in after)
    kept = [s for s in open_now if s not in before]
    return SessionOutcome(closed, SessionCommit(stream, removed, kept))
