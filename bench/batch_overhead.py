"""Where a demo-rate micro-batch's wall time goes, in the real streaming query (issue 28's freshness).

    python -m bench.batch_overhead [--rate 120] [--duration 30] [--trigger "1 second"] [--only http_requests]
                                   [--conf KEY=VALUE ...]

A fresh embedded log gets the demo's tables (unless `--only` names the streams to post), the
pipeline's query starts on its processing-time trigger, and a thread appends demo events to the
log at `--rate` events/s (what the API would append: validated rows, in chunks every
`--every` seconds). Per micro-batch it records:

- Spark's own per-trigger phases from `StreamingQueryProgress.durationMs` (latestOffset: the
  Python source's offsets; queryPlanning, getBatch, walCommit: the offset log's write; addBatch:
  our foreachBatch body; commit: the commit log's write; triggerExecution: the whole trigger);
- inside our body, each step's seconds and Spark jobs (bench.small_batches' job groups), the
  store commit, and the number of calls from Python into the JVM (py4j commands sent);
- "appended -> committed": per append, the time until the store committed a batch holding it
  (what the websocket hub can push next: its own wake-up comes on top, docs/websocket.md).

`--conf` passes Spark settings to try (e.g. the checkpoint's file system). The first `--warmup`
batches are not reported. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench.enrichment import Appender
from bench.small_batches import STEPS, JobGroups
from catalog import load_catalog
from ingest.log import SqliteEventLog
from ingest.events import EventValidator
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore


class Py4jCalls:
    """Counts the commands Python sends into the JVM (every py4j call: method, field, constructor)."""

    def __init__(self, sites: bool = False):
        import sys

        from py4j.java_gateway import GatewayClient

        self.count = 0
        self.sites: Counter[str] = Counter()  # our code's line that led to the call (--sites)
        original = GatewayClient.send_command
        ours = str(Path(__file__).resolve().parent.parent)

        def counted(client, *args, **kwargs):
            self.count += 1
            if sites:
                frame = sys._getframe(1)
                while frame is not None and not (frame.f_code.co_filename.startswith(ours)
                                                 and "/.venv/" not in frame.f_code.co_filename):
                    frame = frame.f_back
                if frame is not None:
                    self.sites[f"{frame.f_code.co_filename[len(ours) + 1:]}:{frame.f_lineno}"] += 1
            return original(client, *args, **kwargs)

        GatewayClient.send_command = counted


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    parser.add_argument("--rate", type=float, default=120, help="demo events per second appended")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between appends")
    parser.add_argument("--duration", type=float, default=30, help="seconds of traffic")
    parser.add_argument("--warmup", type=int, default=3, help="batches not reported")
    parser.add_argument("--trigger", default=None, help="the query's trigger interval (default: the pipeline's)")
    parser.add_argument("--only", default=None, help="comma-separated streams to append (default: every demo "
                        "stream and the tables)")
    parser.add_argument("--sites", type=int, default=0, metavar="N",
                        help="print the N lines of our code that sent the most calls into the JVM (all batches)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting to try")
    args = parser.parse_args(argv)
    catalog = load_catalog(args.streams)

    import aggregates
    from aggregates.batch_gate import stop_between_batches
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark

    print(f"code: {Path(aggregates.__file__).parent.parent}", flush=True)
    spark = build_spark("local[2]", extra_conf=dict(c.split("=", 1) for c in args.conf))
    groups = JobGroups(spark)
    calls = Py4jCalls(sites=bool(args.sites))
    only = set(args.only.split(",")) if args.only else None
    rows: list[dict] = []
    commits: list[tuple[float, int]] = []  # (time committed, events read in all)
    appends: list[tuple[float, int]] = []  # (time appended, events appended in all)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        root = Path(tmp)
        log = SqliteEventLog(root / "log.db")
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
        appender = Appender(log, catalog, int(time.time() * 1000))
        appended = 0 if only else appender.tables()
        store = SqlitePaneStore(root / "store.db")
        defaults = PipelineConfig("overhead", root / "log.db", root / "checkpoints")
        config = PipelineConfig("overhead", root / "log.db", root / "checkpoints",
                                trigger_interval=args.trigger or defaults.trigger_interval)
        pipeline = Pipeline(spark, catalog, store, config)
        for attr, method in STEPS:
            if getattr(getattr(pipeline, attr), "enabled", True):
                groups.wrap(getattr(pipeline, attr), method, attr)
        process = pipeline.process_batch

        def measured(batch, batch_id):
            groups.batch, groups.seconds = batch_id, defaultdict(float)
            groups.groups = set()
            groups.use("rest")
            calls_before = calls.count
            started = time.perf_counter()
            try:
                return process(batch, batch_id)
            finally:
                whole = time.perf_counter() - started
                spark.sparkContext.setJobGroup("", "")
                read = store.progress("overhead").events_read
                commits.append((time.time(), read))
                row = {"batch": batch_id, "events": read - (commits[-2][1] if len(commits) > 1 else 0),
                       "body": (whole, sum(groups.jobs(g) for g in groups.groups)),
                       "py4j calls": (calls.count - calls_before, 0)}
                for label in groups.groups:
                    spent = groups.seconds.get(label, 0.0)
                    row[label] = (spent if label != "rest" else whole - sum(groups.seconds.values()),
                                  groups.jobs(label))
                rows.append(row)

        pipeline.process_batch = measured
        stop = threading.Event()
        validators = {n: EventValidator(s) for n, s in catalog.streams.items() if s.kind != "table"}

        def append_loop():
            nonlocal appended
            own = SqliteEventLog(root / "log.db")
            per_append = max(1, round(args.rate * args.every))
            next_at = time.monotonic()
            while not stop.is_set():
                next_at += args.every
                appender.now_ms = int(time.time() * 1000)
                n = 0
                for name, raws in appender.traffic.generate(per_append).items():
                    if only is not None and name not in only:
                        continue
                    if name == "http_requests" and only is not None:
                        raws = raws[:per_append]
                    own.append(catalog.streams[name], [validators[name].validate(r) for r in raws], appender.now_ms)
                    n += len(raws)
                appended += n
                appends.append((time.time(), appended))
                stop.wait(max(0.0, next_at - time.monotonic()))
            own.close()

        query = pipeline.start()
        while not commits:  # the tables' load and the JVM's warm-up
            time.sleep(0.2)
        feeder = threading.Thread(target=append_loop, daemon=True)
        feeder.start()
        time.sleep(args.duration)
        stop.set()
        feeder.join()
        time.sleep(3)
        # The triggers that ran a batch (a small batch read on the driver: Spark counts no input rows).
        progress = [p for p in query.recentProgress if "addBatch" in p["durationMs"]]
        stop_between_batches(spark, [(query, pipeline.gate)])
        store.close()
        log.close()
    spark.stop()

    reported = rows[1 + args.warmup:]
    first_reported = reported[0]["batch"] if reported else 0
    print(f"\n{len(reported)} micro-batches reported, median {statistics.median(r['events'] for r in reported):.0f} "
          f"events (medians; seconds or counts, Spark jobs):")
    print("| part | median | p90 | Spark jobs |")
    print("| --- | --- | --- | --- |")
    phases = defaultdict(list)
    for p in progress:
        if p["batchId"] >= first_reported:
            for k, v in p["durationMs"].items():
                phases[k].append(v / 1000)
    for k in ("latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets", "commit",
              "triggerExecution"):
        if k in phases:
            print(f"| Spark durationMs.{k} | {statistics.median(phases[k]):.3f} | {pct(phases[k], .9):.3f} | |")
    if phases.get("triggerExecution") and phases.get("addBatch"):
        outside = [t - a for t, a in zip(phases["triggerExecution"], phases["addBatch"], strict=True)]
        print(f"| Spark's own (triggerExecution - addBatch) | {statistics.median(outside):.3f} | {pct(outside, .9):.3f} | |")
    for label in ["body", "py4j calls"] + [a for a, _ in STEPS] + ["rest"]:
        values = [r[label] for r in reported if label in r]
        if values:
            print(f"| {label} | {statistics.median(v[0] for v in values):.3f} | {pct([v[0] for v in values], .9):.3f} "
                  f"| {statistics.median(v[1] for v in values):g} |")
    latencies = []
    j = 0
    cutoff = commits[min(len(commits) - 1, 1 + args.warmup)][0]
    for at, total in appends:
        while j < len(commits) and commits[j][1] < total:
            j += 1
        if j < len(commits) and at >= cutoff:
            latencies.append(commits[j][0] - at)
    print(f"appended -> committed: p50 {pct(latencies, .5):.2f} s, p99 {pct(latencies, .99):.2f} s, "
          f"max {max(latencies or [0]):.2f} s ({len(latencies)} appends)")
    for site, n in calls.sites.most_common(args.sites):
        print(f"{n:7d} py4j calls from {site}")
    print(f"uptime: {os.popen('uptime').read().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
