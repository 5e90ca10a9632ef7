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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.log.records import bools
from store.sessions import BODY_SCHEMA, Session, SessionColumns, SessionCommit, as_table


@dataclass(frozen=True)
class SessionOutcome:
    closed: Sequence[Session]  # emitted by this batch, in (key, first) order (SessionColumns from the columns' rule)
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


def session_batch_columns(stream: str, gap_ms: int, stored: SessionColumns, runs: SessionColumns,
                          watermark_ms: int | None) -> SessionOutcome:
    """`session_batch` over columns, numpy and Arrow doing per array what it does per key in
    Python (the same outcome, in the same order: tests/unit/test_session_window.py pins it):
    runs and stored sessions sorted by (key, first, last); a new session wherever the key changes
    or an interval starts `gap` or more after the latest last event before it of its key (a running
    maximum per key); per session its first event, latest last event and summed events. A stored
    session alone in its merged session and still open is unchanged (neither removed nor kept)."""
    n_stored = len(stored)
    both = pa.concat_tables([as_table(stored), as_table(runs)]).combine_chunks()
    keys = both.column(0).combine_chunks()
    first, last = both.column(1).to_numpy(), both.column(2).to_numpy()
    n = len(keys)
    if n == 0:
        return SessionOutcome([], SessionCommit(stream, SessionColumns(), SessionColumns()))
    # The per-key running maximum below shifts each key's times into its own range of int64;
    # beyond that range (times decades apart over a million keys) the per-key rule decides.
    span = int(last.max()) - int(first.min()) + 1
    if span * n >= 2**62:
        return session_batch(stream, gap_ms, list(stored), list(runs), watermark_ms)
    events = both.column(3).to_numpy()
    order = pc.sort_indices(pa.table({"k": keys, "f": first, "l": last}),
                            sort_keys=[("k", "ascending"), ("f", "ascending"), ("l", "ascending")]).to_numpy()
    keys, first, last, events = keys.take(order), first[order], last[order], events[order]
    from_store = order < n_stored
    new_key = np.ones(n, bool)
    if n > 1:
        new_key[1:] = bools(pc.not_equal(keys[1:], keys[:-1]))
    key_rank = np.cumsum(new_key) - 1
    base = int(first.min())
    shifted = key_rank * span + (last - base)  # a later key's values exceed every earlier key's
    latest = np.maximum.accumulate(shifted) - key_rank * span + base  # latest last event so far, per key
    starts_session = new_key.copy()
    starts_session[1:] |= first[1:] - latest[:-1] >= gap_ms
    heads = np.flatnonzero(starts_session)
    s_first, s_last = first[heads], np.maximum.reduceat(last, heads)
    s_events, size = np.add.reduceat(events, heads), np.diff(np.append(heads, n))
    s_keys = keys.take(pa.array(heads))
    closed = (s_last + gap_ms <= watermark_ms) if watermark_ms is not None else np.zeros(len(heads), bool)
    unchanged = (size == 1) & from_store[heads] & ~closed
    # stored rows that leave: every one but the unchanged (each session index per row: cumsum - 1)
    session_of = np.cumsum(starts_session) - 1
    gone = from_store & ~unchanged[session_of]

    def pick(mask_rows, at) -> SessionColumns:
        idx = np.flatnonzero(mask_rows)
        return SessionColumns.of_table(pa.table([at[0].take(pa.array(idx, pa.int64())), at[1][idx], at[2][idx],
                                                 at[3][idx]], schema=BODY_SCHEMA))

    closed_out = pick(closed, (s_keys, s_first, s_last, s_events))
    kept = pick(~closed & ~unchanged, (s_keys, s_first, s_last, s_events))
    removed = pick(gone, (keys, first, last, events))
    return SessionOutcome(closed_out, SessionCommit(stream, removed, kept))
