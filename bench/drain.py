"""Draining a log with a pipeline (`Trigger.AvailableNow`), timed per batch: the figures
bench.throughput and bench.scale_out report for log -> store."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Drained:
    events: int          # events the store says the pipeline read
    wall_s: float        # the pipeline's start (its query's, or its own batches') to drained
    sustained_per_s: float  # from the end of the first batch to the end of the last
    batches: int


def drain_timed(pipeline, store, *, out: TextIO = sys.stdout) -> Drained:
    """Run the pipeline until the log is drained, saying each batch's progress on `out`.

    Sustained counts from the end of the first batch, so the query's start-up and the first
    batch's JIT warm-up do not (with fewer than two timed batches it is the wall rate). The wall
    counts from `run_until_drained`: a Spark query's start, or (a backlog of the embedded log held
    on the driver) the pipeline's own batches, which start no query (aggregates/bounded_batches.py)."""
    name = pipeline.config.name
    marks: list[tuple[float, int]] = []
    process = pipeline.process_batch

    def timed(batch, batch_id):
        if not marks:
            marks.append((time.perf_counter(), 0))  # first batch handed to us: planned (by Spark's query, or our own)
            print(f"  start to its first batch: {marks[0][0] - started:.1f} s", file=out, flush=True)
        handed = time.perf_counter()
        result = process(batch, batch_id)
        marks.append((time.perf_counter(), store.progress(name).events_read))
        print(f"  batch {batch_id}: {marks[-1][1]:,} events committed so far ({marks[-1][0] - handed:.1f} s in the batch)",
              file=out, flush=True)
        return result

    pipeline.process_batch = timed
    started = time.perf_counter()
    pipeline.run_until_drained()
    wall = time.perf_counter() - started
    done = store.progress(name).events_read
    if len(marks) >= 3:
        (t1, n1), (t2, n2) = marks[1], marks[-1]
        sustained = (n2 - n1) / (t2 - t1)
    else:
        sustained = done / wall
    return Drained(done, wall, sustained, max(0, len(marks) - 1))
