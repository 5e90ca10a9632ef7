"""A stream's open sessions through a steady rate's batches: their moves between rows and buckets (issue 28).

    python -m bench.session_layout [--held 50000] [--busy 400] [--quiet 60] [--repeat 2] [--store postgres]
    python -m bench.session_layout --costs [--store postgres]    # each layout's own cost, forced

A SQLite store holds `--held` open sessions of one stream (the demo's http_requests at 20 000
events/s holds ~50 000: a session per user active in the last 5.5 minutes). Then `--busy`
batches as the 20 000 events/s freshness run makes them: micro-batches of ~1 000 to ~8 000
events touching 900 to 5 000 keys, the sizes cycling as a slow batch is followed by a large one;
then `--quiet` batches of 100 keys (the demo's rate). Each batch's open-session changes are
committed with the store's commit (store/sessions.py), the commit timed. Side by side, each
on a fresh store with the same sessions and batches:

- `per batch`: the rule before session 90, each batch deciding alone (into buckets when it
  touches more than a twelfth of the sessions and 2 000 keys, back to rows below a 48th);
- `reckoned`: store/session_layout.py's, the other layout's savings summed until they pay for a move
  (the backend's costs, as its store takes them).

Prints, per phase, the commits' median / p90 / max and total, and the moves. `--costs` instead
forces each layout on 50 000 and 200 000 sessions held and prints the median commit by keys a
batch: the measurements store/session_layout.py's costs come from. `--store postgres` runs either
on a throwaway local PostgreSQL server. Run it with nothing else on the machine; figures are
printed, never asserted.
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
from store import session_layout
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


class Forced(LayoutChooser):
    """One layout whatever the batches (--costs): each layout's own cost, measured."""

    def __init__(self, buckets: bool):
        super().__init__()
        self.buckets = buckets

    def should_move(self, stream: str, *, in_buckets: bool, touched: int, held: int, buckets: int) -> bool:
        return in_buckets != self.buckets


class Stores:
    """Fresh stores of one backend, each with a way to tell the stream's layout."""

    def __init__(self, backend: str, root: Path):
        self.backend, self.root, self.server, self.made = backend, root, None, 0
        if backend == "postgres":
            from tests.postgres_server import PostgresServer

            self.server = PostgresServer()
            self.server.start()

    def open(self):
        """(a fresh store, a function: is the stream in buckets now?, a close function)."""
        self.made += 1
        if self.server is None:
            store = SqlitePaneStore(self.root / f"store{self.made}.db", synchronous="OFF")
            conn = store._conn
        else:
            import psycopg

            from store.postgres import PostgresPaneStore

            dsn = self.server.fresh_dsn()
            store, conn = PostgresPaneStore(dsn), psycopg.connect(dsn, autocommit=True)

        def in_buckets() -> bool:
            return conn.execute("SELECT 1 FROM session_streams WHERE stream = 'http'").fetchone() is not None

        def close() -> None:
            if self.server is not None:
                conn.close()
            store.close()

        return store, in_buckets, close

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def run(stores: Stores, chooser: LayoutChooser, held: int, phases: list[tuple[str, list[int]]],
        seed: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    store, in_buckets, close = stores.open()
    try:
        store._session_layouts = chooser
        sessions = {f"user-{i:06d}": Session(f"user-{i:06d}", T0, T0 + 1, 1) for i in range(held)}
        keys = list(sessions)
        first = BatchCommit("main", 0, [], 0, sessions=[SessionCommit("http", kept=list(sessions.values()))])
        store.commit_batch(first, lateness_ms={}, now_ms=T0)
        batch_id, now = 0, T0
        for name, sizes in phases:
            times, moves = [], 0
            was = in_buckets()
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
                now_in = in_buckets()
                moves += now_in != was
                was = now_in
            out.append((name, times, moves, "buckets" if was else "rows"))
    finally:
        close()
    return out


def costs(stores: Stores, repeat: int) -> None:
    """Each layout forced, the median of `repeat` commits per batch size: what session_layout's costs come from."""
    sizes = [100, 900, 2_500, 5_000, 20_000]
    print(f"{stores.backend}: a commit's open-session changes, median of {repeat} (ms), by keys a batch: "
          + ", ".join(f"{n:,}" for n in sizes), flush=True)
    for held in (50_000, 200_000):
        for label, forced in (("rows", Forced(False)), ("buckets", Forced(True))):
            phases = [(f"{n}", [n] * repeat) for n in sizes]
            cells = [f"{statistics.median(times):.1f}" for _, times, _, _ in run(stores, forced, held, phases, 1)]
            print(f"  {held:,} held, {label}: {' | '.join(cells)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, default=50_000)
    parser.add_argument("--busy", type=int, default=400, help="batches at 20 000 events/s")
    parser.add_argument("--quiet", type=int, default=60, help="batches at the demo's rate after them")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="postgres: a throwaway local server, as the tests start theirs (tests/postgres_server.py)")
    parser.add_argument("--costs", action="store_true",
                        help="instead: each layout forced, its commits' cost by batch size (50 000 and 200 000 held)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sketchboard-session-layout-") as tmp:
        stores = Stores(args.store, Path(tmp))
        try:
            if args.costs:
                costs(stores, max(args.repeat, 5))
            else:
                side_by_side(stores, args)
        finally:
            stores.stop()
    return 0


def side_by_side(stores: Stores, args) -> None:
    phases = [(f"20 000 events/s ({args.busy} batches of 900-5 000 keys)",
               list(itertools.islice(itertools.cycle(BUSY_KEYS), args.busy))),
              (f"the demo's rate ({args.quiet} batches of {QUIET_KEYS} keys)", [QUIET_KEYS] * args.quiet)]
    print(f"{args.held:,} open sessions held", flush=True)
    for repeat in range(args.repeat):
        costs = session_layout.POSTGRES if stores.backend == "postgres" else session_layout.SQLITE
        for label, chooser in (("per batch", PerBatchRule()), ("reckoned", LayoutChooser(costs))):
            for name, times, moves, ends in run(stores, chooser, args.held, phases, seed=repeat):
                ordered = sorted(times)
                print(f"  {label:<9} {name}: median {statistics.median(times):.1f} ms, p90"
                      f" {ordered[int(len(ordered) * 0.9)]:.1f} ms, max {ordered[-1]:.1f} ms, total"
                      f" {sum(times) / 1000:.2f} s; {moves} moves, in {ends} at the end", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
