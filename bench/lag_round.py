"""One lag sampling round with many consumers of the log registered (fan-out): the serving
pipeline plus N registry entries, a third each named pipelines, reprocessing runs (of the streams
they read only) and pipelines copying their offsets to a Kafka consumer group (a group commit
recorded), every one with committed offsets and a recorded start. Built through the API's own
wiring (sketchboard/wiring.py build_lag_monitor) on the embedded log and the SQLite store.

Prints the per-round time (median, max) in wall time and in this thread's CPU (the machine may be
shared: CPU moves less with others' load); asserts nothing. `--profile` prints the round's
cProfile, cumulative, instead.

    python -m bench.lag_round [--consumers 400] [--rounds 20] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from catalog import load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS, Settings
from sketchboard.wiring import build_lag_monitor
from store import SqlitePaneStore
from store.consumers import ConsumerRegistry
from store.definitions import DefinitionStore, ReprocessRun


def register(store, catalog, log, n: int, now_ms: int) -> None:
    registry, definitions = ConsumerRegistry(store.side_db()), DefinitionStore(store.side_db())
    streams = list(catalog.streams)
    ends = {s: {p: o.end for p, o in log.offsets(s).items()} for s in streams}
    for i in range(n):
        kind = i % 3
        stream = streams[i % len(streams)]
        name = f"reprocess-{stream}-{i:08x}" if kind == 1 else f"fanout-{i}"
        registry.register(name, name, "earliest", now_ms + i)
        read = {stream: ends[stream]} if kind == 1 else ends
        registry.record_start(name, {s: {p: 0 for p in parts} for s, parts in read.items()})
        # Half behind (a lag in seconds to look up), half caught up.
        registry.record_commit(name, i, now_ms, {s: {p: e // (1 + i % 2) for p, e in parts.items()}
                                                  for s, parts in read.items()})
        if kind == 1:  # a finished run: one per stream may be going
            definitions.start_run(ReprocessRun(id=name, stream=stream, version=f"{i:08x}" * 8, definition={},
                                               state="caught_up", error=None, started_at_ms=now_ms,
                                               updated_at_ms=now_ms, complete_from_ms=now_ms, start_offsets={},
                                               target_offsets={}))
        elif kind == 2:
            registry.record_group_commit(name, None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--consumers", type=int, default=400, help="registry entries besides the serving pipeline")
    ap.add_argument("--rounds", type=int, default=20, help="rounds timed")
    ap.add_argument("--appends", type=int, default=500, help="appends (segments) per stream in the log")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the rounds instead of times")
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = SqliteEventLog(root / "log.db", synchronous="OFF")
        now_ms = int(time.time() * 1000)
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
            v = EventValidator(stream)
            event = {stream.time_field: 1, **{k: "x" for k in stream.string_fields}}
            for i in range(args.appends):
                log.append(stream, [v.validate(event)], now_ms - 60_000 + i)
        store = SqlitePaneStore(root / "store.db")
        register(store, catalog, log, args.consumers, now_ms)
        monitor = build_lag_monitor(Settings(data_dir=root), catalog, log, store)
        sampler = monitor.sampler
        samples = sampler.sample_and_store()  # the first round (tables created, caches warm)
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(lambda: [sampler.sample_and_store() for _ in range(args.rounds)])
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
            return
        # sample_and_store in its two steps, timed apart: the reads (registry, log) and the write.
        times: dict[str, list[float]] = {f"{part} {clock}": [] for part in ("round", "read", "write")
                                         for clock in ("wall", "CPU")}
        for _ in range(args.rounds):
            w0, c0 = time.perf_counter(), time.thread_time()
            round_samples = sampler.sample()
            w1, c1 = time.perf_counter(), time.thread_time()
            sampler.sink.write(round_samples)
            w2, c2 = time.perf_counter(), time.thread_time()
            for part, (w, c) in {"round": (w2 - w0, c2 - c0), "read": (w1 - w0, c1 - c0),
                                 "write": (w2 - w1, c2 - c1)}.items():
                times[f"{part} wall"].append(w)
                times[f"{part} CPU"].append(c)
        print(f"one sampling round, {args.consumers} consumers + the serving pipeline, {len(samples)} samples,"
              f" {args.rounds} rounds, median (max) ms; CPU: this thread's")
        for name, values in times.items():
            print(f"  {name:11} {statistics.median(values) * 1000:7.1f} ({max(values) * 1000:.1f})")


if __name__ == "__main__":
    main()
