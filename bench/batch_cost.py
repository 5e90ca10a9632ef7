"""A micro-batch's fixed cost: the same events drained by the shipped pipeline in batches of
several sizes, and what a batch costs beyond its events (issue 28's end to end and freshness).

    python -m bench.batch_cost [--events 2000000] [--sizes 100000,250000,1000000] [--repeat 2]
                               [--baseline PATH ...]

The side by side's `http_requests` events (bench.side_by_side: generated once, seeded) are
appended to an embedded log as the ingest API appends a 10 000-event request (its columnar path),
once. Then, for each size, a fresh process builds the pipeline of the shipped configuration
(sketchboard.wiring, a fresh store) on a copy of that log, drains it in batches of at most that
many records, and reports its process CPU (every thread: the batch's and the side step's) and,
apart, its read-ahead worker's (a process that reads a catch-up's next batch, aggregates/read_ahead.py).
With the events fixed, CPU = batches x (a batch's fixed cost) + events x (an event's cost): the two
are fitted by least squares over the sizes and printed with each drain's figures.

`--baseline PATH` (another checkout, e.g. a `git worktree` of an earlier commit) drains the same
log with that checkout's code, alternating with this one (each size, each repeat), so both are
measured under the same load swings. A demo batch touches ~50 000 users (sessions, Bloom keys,
enrichment lookups) and ~150-300 panes and their tier rows, whatever its size: that is most of
the fixed cost. Figures are printed, never asserted; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent

# Run in a fresh process with the checkout under test first on the path: only modules every
# checkout since session 50 has (the settings, the wiring), so a baseline needs nothing new.
CHILD = """
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline

log_path, size = Path(sys.argv[1]), int(sys.argv[2])
root = Path(tempfile.mkdtemp(prefix="sketchboard-batch-cost-"))
try:
    shutil.copy(log_path, root / "log.db")
    settings = Settings(data_dir=root, log_backend="embedded", store_backend="sqlite", max_records_per_batch=size)
    pipeline = build_pipeline(settings)
    batches = []
    process = pipeline.process_batch

    def counted(batch, batch_id):
        batches.append(batch_id)
        return process(batch, batch_id)

    pipeline.process_batch = counted
    def children():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    cpu, wall, worker = time.process_time(), time.perf_counter(), children()
    pipeline.run_until_drained()
    cpu, wall, worker = time.process_time() - cpu, time.perf_counter() - wall, children() - worker
    events = pipeline.store.progress(settings.pipeline_name).events_read
    pipeline.store.close()
    pipeline.log.close()
    print(json.dumps({"batches": len(batches), "events": events, "cpu_s": cpu, "wall_s": wall, "worker_cpu_s": worker}))
finally:
    shutil.rmtree(root, ignore_errors=True)
"""


def append_as_api(path: Path, events: int, request: int = 10_000) -> None:
    """The side by side's events appended as the API's columnar path appends a request's."""
    from bench.side_by_side import STREAM, generate
    from catalog import load_catalog
    from demo import DEFAULT_CONFIG
    from ingest.columnar import columnar_events
    from ingest.log import SqliteEventLog

    catalog = load_catalog(DEFAULT_CONFIG)
    stream = catalog.stream(STREAM)
    log = SqliteEventLog(path)
    try:
        for s in catalog.streams.values():
            log.ensure_topic(s)
        now = int(time.time() * 1000)
        for chunk in generate(events, request):
            columns = columnar_events(stream, json.dumps(chunk).encode(), ndjson=False)
            if columns is None:
                raise SystemExit("the columnar ingest path declined the generated events")
            log.append_columns(stream, columns, now)
    finally:
        log.close()


def drain(checkout: Path, log_path: Path, size: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(log_path), str(size)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the drain with {checkout} in batches of {size:,} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit(runs: list[dict]) -> tuple[float, float] | None:
    """(a batch's fixed CPU seconds, an event's CPU microseconds) by least squares over drains of
    the same events in different numbers of batches; None with fewer than two batch counts."""
    if len({r["batches"] for r in runs}) < 2:
        return None
    batches = np.array([r["batches"] for r in runs], float)
    cpu = np.array([r["cpu_s"] for r in runs], float)
    per_batch, rest = np.polyfit(batches, cpu, 1)
    return float(per_batch), float(rest / runs[0]["events"] * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--sizes", default="100000,250000,1000000", help="records per batch, comma-separated")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--baseline", type=Path, action="append", default=[],
                        help="another checkout to drain the same log with, alternating")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    checkouts = [("this", HERE)] + [(str(p), p.resolve()) for p in args.baseline]
    for _, path in checkouts[1:]:
        if not (path / "sketchboard" / "wiring.py").exists():
            raise SystemExit(f"{path} is not a checkout of this project")
    with tempfile.TemporaryDirectory(prefix="sketchboard-batch-cost-") as tmp:
        log_path = Path(tmp) / "log.db"
        print(f"appending {args.events:,} http_requests events to an embedded log ...", flush=True)
        append_as_api(log_path, args.events)
        runs: dict[str, list[dict]] = {name: [] for name, _ in checkouts}
        for repeat in range(args.repeat):
            for size in sizes:
                for name, path in checkouts:
                    r = drain(path, log_path, size)
                    runs[name].append(r)
                    print(f"  [{repeat + 1}] {name}: batches of {size:,}: {r['batches']} batches, process CPU"
                          f" {r['cpu_s']:.2f} s ({r['cpu_s'] / r['events'] * 1e6:.2f} us an event; its read-ahead worker"
                          f" {r['worker_cpu_s']:.2f} s), wall {r['wall_s']:.2f} s", flush=True)
    print("\nFitted over the drains' process CPU (the read-ahead worker's apart):\n"
          "\n| checkout | a batch's fixed CPU | an event's CPU |\n| --- | --- | --- |")
    for name, _ in checkouts:
        fitted = fit(runs[name])
        print(f"| {name} | " + ("(one batch count only) | |" if fitted is None else
                                f"{fitted[0] * 1000:.0f} ms | {fitted[1]:.2f} us |"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
