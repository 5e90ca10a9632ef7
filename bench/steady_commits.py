"""Micro-batch commits at a steady rate into a store, SQLite or PostgreSQL, each step timed (issue 28's
freshness: the commit is most of a batch, and on PostgreSQL more than SQLite's).

    python -m bench.steady_commits [--rate 20000] [--batch 7000] [--seconds 60] [--stores sqlite,postgres] [--mix]

Demo `http_requests` events (demo/traffic.py, seeded) stamped in order at `--rate` events/s,
enriched as the demo's tables enrich them (each user's plan and country from demo/users.py, the
plan's tier from demo/plans.py: seven dimensions, ~1 000 combinations a batch), aggregated into
10 s pane partials as the executors would (bench/day_of_data.py), `--batch` events a micro-batch
(a batch of the 20 000 events/s freshness run with the demo's tables: ~7 000). Each store in
`--stores` (in turn, `--repeat` times) commits the same batches into fresh storage with the
shipped tiers, the pipeline's clock at each batch's newest event; PostgreSQL is a throwaway local
server started as the tests start theirs (tests/postgres_server.py: no fsync, so the figures are
the commit's work, not the disk's).

`--mix` adds, to each batch, the demo's other streams drawn for its requests as `make run` draws
them (DemoTraffic.generate: ~0.25 mobile_app screen views a request, 0.05 searches, clicks on them,
0.02 orders; a batch of the 15 000 requests/s freshness run with `--mix`: ~12 000 events). Their
events are stamped over the batch's time like the requests: their own panes and tier rows, not the
offline backlogs' corrections of older panes, nor the Bloom filters, sessions and enrichment
versions a live batch commits too.

Prints per run the commit's median / p90 / p99 / max past the first tenth of the batches (a steady
state; the p99 is where the batches that fold the coarser tiers show, store/tier_folds.py) and their
total, then the wall time of each of the commit's steps summed over the run
(the store's functions timed around their calls: a step called within another is counted in both,
so they add up to more than the total). Run it with nothing else on the machine;
figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.day_of_data import STREAM, pane_partial
from bench.step_timer import wrap_timed
from catalog import load_catalog
from demo.plans import PLANS
from demo.traffic import DemoTraffic
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit, SqlitePaneStore
from store.tiers import catalog_layouts

START_MS = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000 + 600_000  # ten minutes into an hour


def batches(rate: int, batch: int, seconds: float, seed: int = 1, mix: bool = False) -> list[tuple[list, int, int]]:
    """(pane partials, events, newest event time) per micro-batch; `rate` and `batch` count the
    requests, `mix` adds the other streams' events."""
    catalog = load_catalog(DEFAULT_STREAMS)
    stream = catalog.stream(STREAM)
    clock_s = [START_MS / 1000]
    traffic = DemoTraffic(catalog, seed=seed, clock=lambda: clock_s[0])
    users = {row["user_id"]: row for row in traffic.user_table.initial(START_MS)}
    out = []
    total = int(rate * seconds)
    for made in range(0, total, batch):
        n = min(batch, total - made)
        times = START_MS + (np.arange(made, made + n) * 1000 // rate)
        clock_s[0] = int(times[-1]) / 1000
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for event, t in zip(traffic.generate_stream(STREAM, n), times.tolist()):
            user = users.get(event.get("user_id"))
            plan = user["plan"] if user else ""
            event = {**event, "plan": plan, "country": user["country"] if user else "",
                     "tier": PLANS[plan][0] if plan else ""}
            dims = tuple(str(event.get(d, "")) for d in stream.dimensions)
            groups[(t - t % stream.pane, dims)].append(event)
        partials = [pane_partial(stream, start, dims, group) for (start, dims), group in groups.items()]
        if mix:
            for name, events in traffic.generate(n, skip={STREAM}).items():
                partials.extend(_stamped_partials(catalog.stream(name), events, times))
                n += len(events)
        out.append((partials, n, int(times[-1])))
    return out


def _stamped_partials(stream, events: list[dict], times: np.ndarray) -> list:
    """`events` of another stream stamped evenly over the batch's request times, as pane partials."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    if not events:
        return []
    for event, t in zip(events, times[np.linspace(0, len(times) - 1, len(events)).astype(int)].tolist()):
        groups[(t - t % stream.pane, tuple(str(event.get(d, "")) for d in stream.dimensions))].append(event)
    return [pane_partial(stream, start, dims, group) for (start, dims), group in groups.items()]


def timed_steps(backend: str) -> dict[str, float]:
    """Wrap the commit's steps of `backend`'s store to add up their wall time in the returned dict."""
    import store.tier_fold_store as tier_fold_store

    out: dict[str, float] = {}
    if backend == "postgres":
        import store.postgres.panes as panes
        import store.postgres.rows as rows

        steps = [(panes, "plan_batch", "the plan"), (rows, "load", "rows' load (panes and tier rows)"),
                 (rows, "save_rows", "rows' save (panes and tier rows)"),
                 (rows, "copy_rows", "COPY, in all (change records; within loads, saves)"),
                 (panes, "_apply_deltas", "tier rows' load, merge and save"),
                 (tier_fold_store, "plan_fold", "the fold: passed panes read, rolled up"),
                 (panes, "apply_bloom_commit", "Bloom bits"), (panes, "_prune", "retention, in all")]
    else:
        import store.sqlite as sqlite
        import store.sqlite_tiers as sqlite_tiers

        steps = [(sqlite, "plan_batch", "the plan"), (sqlite_tiers, "load_many", "rows' load (panes and tier rows)"),
                 (sqlite_tiers, "save_rows", "rows' save (panes and tier rows)"),
                 (sqlite_tiers, "apply_deltas", "tier rows' load, merge and save"),
                 (tier_fold_store, "plan_fold", "the fold: passed panes read, rolled up"),
                 (sqlite.SqlitePaneStore, "_prune", "retention, in all")]
    for owner, name, label in steps:
        if hasattr(owner, name):
            wrap_timed(owner, name, label, out)
    return out


def run(made: list[tuple[list, int, int]], store) -> list[float]:
    catalog = load_catalog(DEFAULT_STREAMS)
    store.configure_tiers(catalog_layouts(catalog), now_ms=START_MS)
    times = []
    for batch_id, (partials, events, newest) in enumerate(made):
        streams = [catalog.stream(name) for name in dict.fromkeys(p.stream for p in partials)]
        commit = BatchCommit("main", batch_id, partials, events, {s.name: newest for s in streams}, {},
                             batch_now_ms=newest)
        started = time.perf_counter()
        store.commit_batch(commit, lateness_ms={s.name: s.allowed_lateness for s in streams}, now_ms=newest,
                           retention_ms={s.name: s.retention for s in streams})
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000, help="events/s of event time")
    parser.add_argument("--batch", type=int, default=7_000, help="events a micro-batch")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of events")
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--mix", action="store_true", help="the demo's other streams beside the requests")
    args = parser.parse_args()
    backends = args.stores.split(",")

    started = time.perf_counter()
    made = batches(args.rate, args.batch, args.seconds, mix=args.mix)
    partials = [len(p) for p, _, _ in made]
    print(f"{len(made)} micro-batches of {args.batch:,} requests ({args.rate:,} a second, {args.seconds:.0f} s)"
          f"{f', {statistics.median(n for _, n, _ in made):,.0f} events a batch in all (median)' if args.mix else ''};"
          f" pane partials a batch median {statistics.median(partials):,.0f}"
          f" (made in {time.perf_counter() - started:.0f} s)", flush=True)
    with ExitStack() as stack:
        server = None
        if "postgres" in backends:
            from tests.postgres_server import PostgresServer

            server = PostgresServer()
            server.start()
            stack.callback(server.stop)
        steps = {backend: timed_steps(backend) for backend in dict.fromkeys(backends)}
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for k in range(args.repeat):
            for backend in backends:
                steps[backend].clear()
                if backend == "postgres":
                    from store.postgres import PostgresPaneStore

                    store = PostgresPaneStore(server.fresh_dsn(), pool_size=2)
                else:
                    store = SqlitePaneStore(folder / f"store{k}.db")
                try:
                    times = run(made, store)
                finally:
                    store.close()
                ms = sorted(t * 1000 for t in times[len(made) // 10:])
                print(f"{backend:>8}: commit median {statistics.median(ms):6.1f} ms, p90 {ms[int(len(ms) * 0.9)]:6.1f},"
                      f" p99 {ms[int(len(ms) * 0.99)]:6.1f}, max {ms[-1]:6.1f}; total {sum(times):5.1f} s", flush=True)
                # Whether the commit grows as the run's rows do (the tier rows of the hour fill up).
                quarters = [statistics.median(times[i * len(times) // 4:(i + 1) * len(times) // 4]) * 1000
                            for i in range(4)] if len(times) >= 4 else []
                if quarters:
                    by_quarter = " / ".join(f"{q:.1f}" for q in quarters)
                    print(f"          commit median by quarter of the run: {by_quarter} ms")
                for label, seconds in sorted(steps[backend].items(), key=lambda item: -item[1]):
                    print(f"          {label:<40} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
