"""Benchmark: fan-out, several named pipelines reading one log. Prints figures; asserts nothing.

    python -m bench.fanout [--events 300000] [--batch-records 100000] [--log embedded|kafka]
                           [--kafka-bootstrap HOST:PORT] [--group-commit]

1. Fills a fresh log with N demo events (bench.throughput.fill_log).
2. The serving pipeline drains it alone (Trigger.AvailableNow): events/s, query start included.
3. A named pipeline (`replay`, --from earliest) replays the same log alone into its own store
   namespace: events/s, and the cost per batch of the copies it makes after each commit
   (consumer registry; with --group-commit on Kafka, the consumer-group copy too).
4. N more events, then both pipelines drain them at once on the one Spark session: the
   events/s of the two together (each read every event), against 2 and 3.
Wired as `sketchboard pipeline [--name replay --from earliest]` wires them (sketchboard.wiring).
With `--log kafka` and no --kafka-bootstrap, a local broker from jars/kafka-broker is started.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.throughput import fill_log
from catalog import load_catalog
from sketchboard.settings import DEFAULT_STREAMS, Settings


class Timed:
    """A commit listener wrapped to time each call (keeps its `what` for the pipeline's log)."""

    def __init__(self, listener):
        self.listener, self.what, self.ms = listener, getattr(listener, "what", type(listener).__name__), []

    def __call__(self, *args) -> None:
        started = time.perf_counter()
        try:
            self.listener(*args)
        finally:
            self.ms.append((time.perf_counter() - started) * 1000)


def drain(pipelines) -> float:
    """Run the pipelines' AvailableNow queries at once; seconds until the last one finished."""
    started = time.perf_counter()
    errors: list[BaseException] = []

    def run(p):
        try:
            p.run_until_drained()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in pipelines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def read(pipeline) -> int:
    return pipeline.store.progress(pipeline.config.name).events_read


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--batch-records", type=int, default=100_000)
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--kafka-bootstrap")
    parser.add_argument("--group-commit", action="store_true", help="kafka_commit_offsets on (Kafka only)")
    args = parser.parse_args(argv)

    from aggregates.spark import build_spark, kafka_connector_conf
    from sketchboard.wiring import build_pipeline, open_log

    catalog = load_catalog(DEFAULT_STREAMS)
    with tempfile.TemporaryDirectory(prefix="sketchboard-bench-fanout-") as tmp:
        root = Path(tmp)
        broker, extra, settings_kw = None, {}, {}
        if args.log == "kafka":
            bootstrap = args.kafka_bootstrap
            if bootstrap is None:
                from tests.kafka_broker import KafkaBroker

                broker = KafkaBroker(root / "broker", heap="1g")
                broker.start()
                bootstrap = broker.bootstrap
            settings_kw = {"log_backend": "kafka", "kafka_bootstrap_servers": bootstrap, "kafka_replication_factor": 1,
                           "kafka_topic_prefix": f"fanout{int(time.time())}.",
                           "kafka_commit_offsets": args.group_commit}
            extra = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default)
        settings = Settings(data_dir=root / "data", streams_config=DEFAULT_STREAMS, alerts_config=None,
                            max_records_per_batch=args.batch_records, **settings_kw)
        spark = build_spark("local[2]", extra_conf=extra)
        try:
            log = open_log(settings, catalog)
            print(f"[{args.log}] filling the log with {args.events:,} demo events ...", flush=True)
            fill_log(log, catalog, args.events)
            serving = build_pipeline(settings, spark)
            alone = drain([serving])
            print(f"serving pipeline alone:   {read(serving):,} events in {alone:.1f} s = {read(serving) / alone:,.0f}"
                  " events/s (query start included)", flush=True)
            replay = build_pipeline(settings, spark, name="replay", starting_offsets="earliest")
            replay.commit_listeners[:] = [Timed(listener) for listener in replay.commit_listeners]
            replayed = drain([replay])
            print(f"named pipeline, replay:   {read(replay):,} events in {replayed:.1f} s ="
                  f" {read(replay) / replayed:,.0f} events/s", flush=True)
            for timed in replay.commit_listeners:
                print(f"  after-commit copy, {timed.what}: median {statistics.median(timed.ms):.1f} ms,"
                      f" max {max(timed.ms):.1f} ms over {len(timed.ms)} batches", flush=True)

            fill_log(log, catalog, args.events)
            before = read(serving) + read(replay)
            both = drain([serving, replay])
            total = read(serving) + read(replay) - before
            print(f"both at once, {args.events:,} new events each: {total:,} events read in {both:.1f} s ="
                  f" {total / both:,.0f} events/s together ({total / 2 / both:,.0f} per pipeline)", flush=True)
            if serving.listener_failures or replay.listener_failures:
                print(f"listener failures: serving {serving.listener_failures}, replay {replay.listener_failures}")
            for handle in (log, serving.log, replay.log):  # before the broker goes: no reconnect noise
                handle.close()
        finally:
            spark.stop()
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    main()
