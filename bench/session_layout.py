"""A stream's open sessions through a steady rate's batches: their moves between rows and buckets (issue 28).

    python -m bench.session_layout [--held 50000] [--busy 400] [--quiet 60] [--repeat 2]

A SQLite store holds `--held` open sessions of one stream (the demo's http_requests at 20 000
events/s holds ~50 000: a session per user active in the last 5.5 minutes). Then `--busy`
batches as the 20 000 events/s freshness run makes them: micro-batches of ~1 000 to ~8 000
events touching 900 to 5 000 keys, the sizes cycling as a slow batch is followed by a large one;
then `--quiet` batches of 100 keys (the demo's rate). Each batch's open-session changes are
committed with the store's commit (store/sessions.py), the commit timed. Side by side, each
on a fresh store with the same sessions and batches:

- `per batch`: the rule before session 90, each batch deciding alone (into buckets when it
  touches more than a twelfth of the sessions and 2 000 keys, back to rows below a 48th);
- `reckoned`: store/session_layout.py's, the other layout's savings summed until they pay for a move.

Prints, per phase, the commits' median / p90 / max and total, and the moves. Run it with nothing
else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import time
from pathlib import Path

from store import BatchCommit, SqlitePaneStore
from store.session_layout import LayoutChooser
from store.sessions import Session, SessionCommit

T0 = 1_700_000_000_000
BUSY_KEYS = [2_500, 2_500, 900, 4_700, 2_500, 2_500, 2_500, 900, 5_000, 2_500]  # touched keys, cycled
QUIET_KEYS = 100


class PerBatchRule(LayoutChooser):
    """The rule before session 90, kept only to measure against: each batch decides alone."""

    def should_move(self, stream: str, *, in_buckets: bool, touched: int, held: int, buckets: int) -> bool:
        if in_buckets:
            return touched * 48 < held
        return touched >= 2_000 and touched * 12 > held


def run(chooser: LayoutChooser, held: int, phases: list[tuple[str, list[int]]], seed: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    with tempfile.TemporaryDirectory(prefix="sketchboard-session-layout-") as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db", synchronous="OFF")
        store._session_layouts = chooser
        sessions = {f"user-{i:06d}": Session(f"user-{i:06d}", T0, T0 + 1, 1) for i in range(held)}
        keys = list(sessions)
        first = BatchCommit("main", 0, [], 0, sessions=[SessionCommit("http", kept=list(sessions.values()))])
        store.commit_batch(first, lateness_ms={}, now_ms=T0)
        batch_id, now = 0, T0
        for name, sizes in phases:
            times, moves = [], 0
            was = _in_buckets(store)
            for n in sizes:
                batch_id += 1
                now += 150
                touched = rng.sample(keys, n)
                removed = [sessions[k] for k in touched]
                kept = [Session(k, s.first_ms, now, s.events + 1) for k, s in zip(touched, removed)]
                sessions.update((s.key, s) for s in kept)
                started = time.perf_counter()
                store.commit_batch(BatchCommit("main", batch_id, [], n,
                                               sessions=[SessionCommit("http", removed=removed, kept=kept)]),
                                   lateness_ms={}, now_ms=now)
                times.append((time.perf_counter() - started) * 1000)
                now_in = _in_buckets(store)
                moves += now_in != was
                was = now_in
            out.append((name, times, moves, "buckets" if was else "rows"))
        store.close()
    return out


def _in_buckets(store: SqlitePaneStore) -> bool:
    return store._conn.execute("SELECT 1 FROM session_streams WHERE stream = 'http'").fetchone() is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, default=50_000)
    parser.add_argument("--busy", type=int, default=400, help="batches at 20 000 events/s")
    parser.add_argument("--quiet", type=int, default=60, help="batches at the demo's rate after them")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    phases = [(f"20 000 events/s ({args.busy} batches of 900-5 000 keys)",
               list(itertools.islice(itertools.cycle(BUSY_KEYS), args.busy))),
              (f"the demo's rate ({args.quiet} batches of {QUIET_KEYS} keys)", [QUIET_KEYS] * args.quiet)]
    print(f"{args.held:,} open sessions held", flush=True)
    for repeat in range(args.repeat):
        for label, chooser in (("per batch", PerBatchRule()), ("reckoned", LayoutChooser())):
            for name, times, moves, ends in run(chooser, args.held, phases, seed=repeat):
                ordered = sorted(times)
                print(f"  {label:<9} {name}: median {statistics.median(times):.1f} ms, p90"
                      f" {ordered[int(len(ordered) * 0.9)]:.1f} ms, max {ordered[-1]:.1f} ms, total"
                      f" {sum(times) / 1000:.2f} s; {moves} moves, in {ends} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
