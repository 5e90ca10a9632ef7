"""Benchmark: a reprocessing run beside the live pipeline (issue 16: a run goes "at full speed in
parallel with the live pipeline"). Prints figures; asserts nothing.

    python -m bench.reprocess_beside_live [--events 100000] [--live-events 50000] [--batch-records 50000]
                                          [--stream mobile_app]

On the embedded log, the demo catalog, one Spark session (as `sketchboard pipeline` and
`sketchboard reprocess` each have one; here they share it, as the tests do):
1. Fills a fresh log with N demo events; the serving pipeline drains them (its start-up paid).
2. Live alone: M new events, the serving pipeline drains them: its events/s.
3. Run alone: the stream's definition changes (its pane: 20 s), `sketchboard reprocess STREAM`'s
   code (sketchboard/reprocess.py `run_reprocess`) reads the stream's whole log: its events/s.
4. Both: M new events, then at once the serving pipeline drains them and a second run (another
   definition: pane 30 s) reads the stream's whole log: the events/s of each, to set beside 2
   and 3. Each run is a new version with its own output, as a second change of definition is.
The run reads one stream, the serving pipeline all of them: compare each with itself.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import threading
import time
from pathlib import Path

import yaml

from bench.throughput import fill_log
from catalog import load_catalog
from sketchboard.settings import DEFAULT_STREAMS, Settings


def events_read(store, pipeline: str) -> int:
    return store.progress(pipeline).events_read


def with_pane(config: Path, stream: str, pane: str) -> None:
    """The streams configuration with `stream`'s pane changed: a new definition version."""
    declared = yaml.safe_load(DEFAULT_STREAMS.read_text())
    declared["streams"][stream]["pane"] = pane
    config.write_text(yaml.safe_dump(declared))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="in the log before the runs")
    parser.add_argument("--live-events", type=int, default=50_000, help="appended for each live drain")
    parser.add_argument("--batch-records", type=int, default=50_000)
    parser.add_argument("--stream", default="mobile_app", help="the stream reprocessed (a plain stream)")
    args = parser.parse_args(argv)

    from aggregates.batch_gate import remove_listeners
    from aggregates.spark import build_spark
    from sketchboard.reprocess import run_reprocess
    from sketchboard.wiring import build_pipeline, open_log, open_store

    catalog = load_catalog(DEFAULT_STREAMS)
    with tempfile.TemporaryDirectory(prefix="sketchboard-bench-reprocess-") as tmp:
        root = Path(tmp)
        config = root / "streams.yaml"
        config.write_text(DEFAULT_STREAMS.read_text())
        settings = Settings(data_dir=root / "data", streams_config=config, alerts_config=None,
                            max_records_per_batch=args.batch_records)
        spark = build_spark("local[2]")
        try:
            log = open_log(settings, catalog)
            print(f"load average {os.getloadavg()[0]:.1f}; filling the log with {args.events:,} demo events ...",
                  flush=True)
            fill_log(log, catalog, args.events)
            serving = build_pipeline(settings, spark)
            serving.run_until_drained()  # the definitions are pinned, the session warm

            def live_drain() -> tuple[int, float]:
                before = events_read(serving.store, "main")
                started = time.perf_counter()
                serving.run_until_drained()
                return events_read(serving.store, "main") - before, time.perf_counter() - started

            def reprocess(pane: str) -> tuple[int, float, str]:
                with_pane(config, args.stream, pane)
                started = time.perf_counter()
                run = run_reprocess(settings, args.stream, spark=spark, out=io.StringIO(), interval_s=3600)
                took = time.perf_counter() - started
                output = open_store(settings, run.id)
                try:
                    return events_read(output, run.id), took, run.state
                finally:
                    output.close()

            fill_log(log, catalog, args.live_events)
            live_alone, live_alone_s = live_drain()
            print(f"live alone:      {live_alone:,} events in {live_alone_s:.1f} s ="
                  f" {live_alone / live_alone_s:,.0f} events/s (all streams)", flush=True)

            run_alone, run_alone_s, state = reprocess("20s")
            print(f"run alone:       {run_alone:,} {args.stream} events in {run_alone_s:.1f} s ="
                  f" {run_alone / run_alone_s:,.0f} events/s ({state}; start-up and the progress reads included)",
                  flush=True)

            fill_log(log, catalog, args.live_events)
            outcome: list = []
            beside = threading.Thread(target=lambda: outcome.append(reprocess("30s")), name="reprocess")
            beside.start()
            live_both, live_both_s = live_drain()
            beside.join()
            if len(outcome) != 1:
                raise SystemExit("the run beside the live pipeline failed (see above)")
            run_both, run_both_s, state = outcome[0]
            print(f"live beside run: {live_both:,} events in {live_both_s:.1f} s ="
                  f" {live_both / live_both_s:,.0f} events/s ({live_both / live_both_s / (live_alone / live_alone_s):.2f}"
                  " x alone)", flush=True)
            print(f"run beside live: {run_both:,} {args.stream} events in {run_both_s:.1f} s ="
                  f" {run_both / run_both_s:,.0f} events/s ({run_both / run_both_s / (run_alone / run_alone_s):.2f}"
                  f" x alone; {state})", flush=True)
            print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
            remove_listeners(spark, [serving.progress_recorder])
            serving.store.close()
            log.close()
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
