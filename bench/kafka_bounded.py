"""Benchmark: a drain of a Kafka log in batches planned by Spark's Kafka source next to batches of
the pipeline's own (aggregates/bounded_batches.py: batch reads with chosen end offsets, planned as
the embedded source plans them, cut at one append time: ingest/append_cut.py), side by side in one run, on the demo catalog (its tables, view
and enriched stream).

    python -m bench.kafka_bounded [--events 100000] [--batch-records 25000] [--rounds 2]

A reprocessing run that enriches (a table's run rebuilding the streams it enriches, an enriched
stream's run) drains the log the second way on Kafka (sketchboard/reprocess.py run_end_offsets),
for exact enrichment; this shows what that costs. One broker (tests/kafka_broker.py), one log
filled once, one Spark session; each drain a fresh pipeline (its own name, checkpoint and SQLite
store) from the earliest offsets, the two ways alternated `--rounds` times so that warm-up and
the machine's load fall on both. Prints events/s (wall: query start to drained; sustained: from
the end of the first batch) and the load average; asserts nothing."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.drain import drain_timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_bounded", description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="demo events in the log")
    ap.add_argument("--batch-records", type=int, default=25_000, help="max records per batch")
    ap.add_argument("--rounds", type=int, default=2, help="drains of each way, alternated")
    args = ap.parse_args(argv)

    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark, kafka_connector_conf
    from bench.throughput import fill_log
    from catalog import load_catalog
    from ingest.kafka_source import KafkaSourceConfig
    from ingest.log.kafka import KafkaEventLog
    from sketchboard.settings import DEFAULT_STREAMS, Settings
    from store import SqlitePaneStore
    from tests.kafka_broker import KafkaBroker

    catalog = load_catalog(DEFAULT_STREAMS)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-bounded-") as tmp:
        root = Path(tmp)
        broker = KafkaBroker(root / "broker", heap="768m")
        broker.start()
        spark = None
        try:
            prefix = f"bounded{int(time.time())}."
            log = KafkaEventLog(broker.bootstrap, topic_prefix=prefix, replication_factor=1)
            for stream in catalog.streams.values():
                log.ensure_topic(stream)
            print(f"filling the log with {args.events:,} demo events ...", flush=True)
            fill_log(log, catalog, args.events)
            spark = build_spark("local[2]", extra_conf=kafka_connector_conf(
                Settings.model_fields["spark_kafka_jars"].default))
            kafka = KafkaSourceConfig(broker.bootstrap, topic_prefix=prefix)
            results: dict[str, list] = {"spark": [], "own": []}
            for round_ in range(args.rounds):
                for way in ("spark", "own"):
                    name = f"{way}{round_}"
                    store = SqlitePaneStore(root / f"{name}.db")
                    config = PipelineConfig(name, root / "log.db", root / "checkpoints" / name,
                                            max_records_per_batch=args.batch_records, kafka=kafka,
                                            end_offsets=None if way == "spark" else {})
                    drained = drain_timed(Pipeline(spark, catalog, store, config, log=log), store, out=sys.stderr)
                    store.close()
                    results[way].append(drained)
                    print(f"[{name}] {drained.events:,} events, {drained.batches} batches: wall"
                          f" {drained.events / drained.wall_s:,.0f}/s, sustained {drained.sustained_per_s:,.0f}/s",
                          flush=True)
            log.close()
        finally:
            if spark is not None:
                spark.stop()
            broker.stop()
    print(f"\n{args.events:,} demo events, batches of {args.batch_records:,}, load average"
          f" {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'batches planned by':<28}{'wall events/s':>16}{'sustained events/s':>22}")
    for way, label in (("spark", "Spark's Kafka source"), ("own", "the pipeline (batch reads)")):
        runs = results[way]
        print(f"{label:<28}{' / '.join(f'{r.events / r.wall_s:,.0f}' for r in runs):>16}"
              f"{' / '.join(f'{r.sustained_per_s:,.0f}' for r in runs):>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
