"""When a stream's open sessions move between the two layouts of store/sessions.py (rows, buckets). Pure.

Each layout's cost for a batch is estimated from what it touches and what the stream holds; a
move costs a rewrite of every session held. A batch's own verdict is not enough: at 20 000
events/s the micro-batches range from ~1 000 to ~8 000 events, and a rule on one batch's share
of keys (as before session 90: buckets past 1/12 of the sessions touched, rows again under 1/48)
moved 50 000 sessions one way on a large batch and back on the next small one, ~200-230 ms
each, and the slow batch made the next one large again.

So a stream keeps, per process, what the other layout would have saved it so far (`savings`:
each batch adds its layout's cost less the other's, never below zero), and moves once that pays
for the move, as in a ski rental: a move is made only once staying has already cost as much as
it. A batch touching most of many sessions (a backfill's) saves more than a move at
once; a stream whose batches straddle the edge stays where it is; a rate that changes for good
moves it within a few batches. Nothing depends on the choice but time: both layouts hold the
same sessions, and a restart begins again from zero.

The costs are microseconds measured on the 2-core development machine, per backend
(docs/benchmarks.md, session 90: 50 000 and 200 000 sessions held, 100 to 20 000 keys a batch,
`python -m bench.session_layout --costs [--store postgres]`): each store keeps a chooser with its
own backend's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LayoutCosts:
    """A backend's costs in microseconds, measured by `python -m bench.session_layout --costs [--store postgres]`."""

    row_us: float  # rows: a touched key's delete and upsert (B-tree work in the table and its index)
    bucket_session_us: float  # buckets: a session held in a touched bucket, decoded, merged and encoded again
    bucket_key_us: float  # buckets: a touched key's own share (its bucket, the merge, the sort)
    move_session_us: float  # a move: every session held read in one layout and written in the other

    def rows(self, touched: int) -> float:
        return touched * self.row_us

    def buckets(self, touched: int, held: int, buckets: int) -> float:
        """A batch's keys fall in ~buckets * (1 - e^(-touched / buckets)) buckets, each rewritten whole."""
        if buckets <= 0 or held <= 0:
            return touched * self.bucket_key_us
        share = -math.expm1(-touched / buckets)
        return held * share * self.bucket_session_us + touched * self.bucket_key_us

    def move(self, held: int) -> float:
        return held * self.move_session_us


SQLITE = LayoutCosts(row_us=20.0, bucket_session_us=0.35, bucket_key_us=3.0, move_session_us=4.5)
# PostgreSQL writes a bucket's bytes (out of line, in its own pages) at ~3x SQLite's cost a session,
# a row at ~1.5x, and a move (~450-500 ms for 50 000 sessions) at ~2x.
POSTGRES = LayoutCosts(row_us=30.0, bucket_session_us=1.0, bucket_key_us=3.0, move_session_us=10.0)


@dataclass
class LayoutChooser:
    """Per stream, what the other layout would have saved since the stream's last move (us)."""

    costs: LayoutCosts = SQLITE
    savings: dict[str, float] = field(default_factory=dict)

    def should_move(self, stream: str, *, in_buckets: bool, touched: int, held: int, buckets: int) -> bool:
        """After a batch touching `touched` keys of a stream holding `held` sessions (in `buckets`
        buckets, or as many as it would get): True when the stream should move to the other
        layout now (its savings then start again from zero)."""
        rows, spread = self.costs.rows(touched), self.costs.buckets(touched, held, buckets)
        here, there = (spread, rows) if in_buckets else (rows, spread)
        saved = max(0.0, self.savings.get(stream, 0.0) + here - there)
        if saved > self.costs.move(held):
            self.savings.pop(stream, None)
            return True
        self.savings[stream] = saved
        return False
