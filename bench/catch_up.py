"""Corrections published when a backlog is read in small batches, by watermark rule and
admission policy, side by side with the same events read as they arrive. Prints figures;
asserts nothing.

    python -m bench.catch_up                              # issue 19's case: 60 000 events
    python -m bench.catch_up --events 200000 --batch 4000 --partitions 8

A sensor stream with Zipf-skewed device keys over `--partitions` partitions (partition =
the log's own crc32 rule), 3 % of events 3..30 minutes late. Batches are planned by the
source's real admission function (`plan_end_offsets`, fair by record count) or, for
comparison, oldest-first across partitions (the partition whose next record is oldest is read
first: what an event-time-aware source could do). Watermarks come from the real rules:
stream-wide (newest event - lateness) and per partition (`store.watermarks.advance_stream`).
A correction is one merge of a batch into a pane (10 s x site) that was final before it, as
the store counts them. No Spark and no store: the rule, not the engine, decides corrections.
"""

from __future__ import annotations

import argparse
import heapq
from dataclasses import dataclass

import numpy as np

from ingest.partitioner import partition_for
from ingest.spark_source import plan_end_offsets
from store.panes import advance_watermark, is_final, pane_start
from store.watermarks import advance_stream

PANE_MS = 10_000
LATENESS_MS = 30_000


@dataclass(frozen=True)
class Record:
    time: int
    site: str


def make_log(events: int, partitions: int, seed: int) -> tuple[dict[int, list[Record]], list[tuple[int, int]]]:
    """Per partition, its records in arrival order; and the arrival order as (partition, index)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 201) ** 1.2
    devices = rng.choice(200, events, p=weights / weights.sum())
    duration = max(600_000, events * 20)  # ~50 events/s
    times = rng.integers(0, duration, events)
    late = rng.random(events) < 0.03
    delay = np.where(late, rng.integers(180_000, 1_800_000, events), rng.exponential(500.0, events).astype(np.int64))
    order = np.argsort(times + delay, kind="stable")
    log: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    arrival = []
    for i in order:
        p = partition_for(f"d{devices[i]}", partitions)
        arrival.append((p, len(log[p])))
        log[p].append(Record(int(times[i]), f"s{devices[i] % 5}"))
    return log, arrival


def fair_batches(log: dict[int, list[Record]], batch: int) -> list[dict[int, int]]:
    """End offsets per batch, planned by the source's own admission function."""
    ends = {"s": {str(p): len(r) for p, r in log.items()}}
    start = {"s": {str(p): 0 for p in log}}
    out = []
    while start != ends:
        start = plan_end_offsets(start, ends, batch)
        out.append({int(p): o for p, o in start["s"].items()})
    return out


def oldest_first_batches(log: dict[int, list[Record]], batch: int) -> list[dict[int, int]]:
    """End offsets per batch when each batch takes the oldest next records across partitions."""
    pos = dict.fromkeys(log, 0)
    heads = [(r[0].time, p) for p, r in log.items() if r]
    heapq.heapify(heads)
    out = []
    while heads:
        for _ in range(batch):
            if not heads:
                break
            _, p = heapq.heappop(heads)
            pos[p] += 1
            if pos[p] < len(log[p]):
                heapq.heappush(heads, (log[p][pos[p]].time, p))
        out.append(dict(pos))
    return out


def steady_batches(log: dict[int, list[Record]], arrival: list[tuple[int, int]], per_batch: int) -> list[dict[int, int]]:
    """End offsets per batch when every batch reads all that arrived since the last one."""
    pos = dict.fromkeys(log, 0)
    out = []
    for i in range(0, len(arrival), per_batch):
        for p, idx in arrival[i:i + per_batch]:
            pos[p] = max(pos[p], idx + 1)
        out.append(dict(pos))
    return out


def corrections(log: dict[int, list[Record]], batches: list[dict[int, int]], rule: str, *, steady: bool) -> int:
    """Corrections published over the batches under a watermark rule. `steady`: the log grows as
    the batches read, each batch reading all that had arrived (its end is the log's end then);
    else the whole log was there before the first batch (a backlog)."""
    read = dict.fromkeys(log, 0)
    wm = None
    marks: dict = {}
    published = 0
    for n, end in enumerate(batches):
        final_panes: set[tuple[int, str]] = set()
        newest_by_partition: dict[int, int] = {}
        for p, hi in end.items():
            for r in log[p][read[p]:hi]:
                key = (pane_start(r.time, PANE_MS), r.site)
                if is_final(wm, key[0] + PANE_MS):
                    final_panes.add(key)
                newest_by_partition[p] = max(newest_by_partition.get(p, r.time), r.time)
        published += len(final_panes)
        log_end = dict(end) if steady else {p: len(r) for p, r in log.items()}
        if rule == "stream-wide":
            wm = advance_watermark(wm, max(newest_by_partition.values(), default=None), LATENESS_MS)
        else:
            marks, result = advance_stream(wm, marks, batch_max_event_ms=newest_by_partition, read_offsets=end,
                                           log_end_offsets=log_end, lateness_ms=LATENESS_MS, now_ms=n,
                                           idle_timeout_ms=10**9)
            wm = result.watermark_ms
        read = dict(end)
    return published


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4_000, help="max records per catch-up batch")
    parser.add_argument("--steady-batch", type=int, default=50, help="events per batch when read as they arrive")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    log, arrival = make_log(args.events, args.partitions, args.seed)
    sizes = ", ".join(f"{p}: {len(r)}" for p, r in log.items())
    print(f"{args.events} events over {args.partitions} partitions ({sizes}), catch-up batches of {args.batch}")
    as_arrived = steady_batches(log, arrival, args.steady_batch)
    rows = [("steady (as they arrive)", "per partition", corrections(log, as_arrived, "per-partition", steady=True)),
            ("steady (as they arrive)", "stream-wide", corrections(log, as_arrived, "stream-wide", steady=True))]
    for name, plan in (("catch-up, fair admission", fair_batches), ("catch-up, oldest-first", oldest_first_batches)):
        batches = plan(log, args.batch)
        for rule in ("stream-wide", "per partition"):
            rows.append((f"{name} ({len(batches)} batches)", rule, corrections(log, batches, rule, steady=False)))
    print(f"{'run':<40} {'watermark':<14} {'corrections':>11}")
    for run, rule, n in rows:
        print(f"{run:<40} {rule:<14} {n:>11}")


if __name__ == "__main__":
    main()
