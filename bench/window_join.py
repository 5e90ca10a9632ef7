"""The window join's driver side, timed: searches and clicks as the pipeline collects them from a
batch (Arrow) -> the join rule with the state in a SQLite store -> derived partials -> the
state's store commit. No Spark: this is the cost a join adds to each batch of joined streams.

    python -m bench.window_join --batches 10 --searches 50000 --ctr 0.3
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from aggregates.joins import WindowJoins, with_joins
from catalog import parse_catalog
from store import BatchCommit, SqlitePaneStore

CONFIG = """
streams:
  searches: {key_field: search_id, dimensions: [query_category]}
  clicks: {key_field: search_id, dimensions: [position]}
joins:
  - {name: search_clicks, left: {stream: searches, key: search_id}, right: {stream: clicks, key: search_id},
     within: 30m}
"""
T0 = 1_795_000_000_000


def batch(rng: random.Random, b: int, n: int, ctr: float) -> pa.Table:
    """One minute of n searches and the clicks (delay ~ exponential, mean 30 s) on a share ctr of them."""
    rows = []
    for i in range(n):
        t = T0 + b * 60_000 + rng.randrange(60_000)
        rows.append(("searches", 0, b * n * 2 + i, t, [rng.choice("abc")], [f"s{b}_{i}"]))
        if rng.random() < ctr:
            rows.append(("clicks", 0, b * n * 2 + n + i, t + int(rng.expovariate(1 / 30_000)), ["1"], [f"s{b}_{i}"]))
    cols = list(zip(*rows, strict=True))
    return pa.table({"stream": cols[0], "partition": pa.array(cols[1], pa.int32()), "offset": cols[2],
                     "event_time": cols[3], "dims": pa.array(cols[4], pa.list_(pa.string())),
                     "ids": pa.array(cols[5], pa.list_(pa.string()))})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--searches", type=int, default=50_000, help="searches per batch")
    ap.add_argument("--ctr", type=float, default=0.3)
    args = ap.parse_args(argv)
    catalog = parse_catalog(CONFIG)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db")
        joins, rng = WindowJoins(catalog, store), random.Random(1)
        events = 0
        join_s = commit_s = 0.0
        for b in range(args.batches):
            records = batch(rng, b, args.searches, args.ctr)
            events += records.num_rows
            # The joined streams' progress (their newest events): the join's clock.
            newest = T0 + (b + 1) * 60_000
            base = BatchCommit("main", b, [], 0, max_event_ms={"searches": newest, "clicks": newest})
            started = time.perf_counter()
            commit = with_joins(base, joins.join(records, base, now_ms=newest), joins.names)
            joined_at = time.perf_counter()
            store.commit_batch(commit, lateness_ms={}, now_ms=T0)
            done = time.perf_counter()
            join_s += joined_at - started
            commit_s += done - joined_at
        sizes = store.join_sizes()["search_clicks"]
        store.close()
    print(f"{events} events in {args.batches} batches: join {events / join_s:,.0f} events/s,"
          f" state commit {events / commit_s:,.0f} events/s, together {events / (join_s + commit_s):,.0f} events/s;"
          f" pairs {sizes.pairs}, state {sizes.left_rows} left + {sizes.right_rows} right rows")


if __name__ == "__main__":
    main()
