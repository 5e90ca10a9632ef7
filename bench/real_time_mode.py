"""Does Spark 4.3's real-time mode fit Sketchboard's pipeline? (issue 28's freshness part)

Real-time mode (`writeStream.trigger(realTime="...")`, Spark 4.1+; streaming aggregations since
4.3) runs long batches whose records stream through without waiting for a batch boundary. This
script tries, on a real Kafka broker (jars/kafka-broker) and Spark's Kafka connector
(jars/spark-kafka), the query shapes the pipeline would need, and prints for each one whether
Spark accepts it (and the reason when it does not), and, for the accepted ones, the latency from
"record produced" to "its output seen":

1. the pipeline's shape: the pane aggregation (10 s windows x endpoint: count, sum,
   `hll_sketch_agg`, `kll_sketch_agg_double`) written with `foreachBatch` (how the pipeline
   commits a batch to the store exactly once, by batch id);
2. the same aggregation with a `foreach` writer (the row-at-a-time sink real-time mode allows);
3. the same aggregation to a Kafka topic;
4. the aggregation with the built-in functions only (count, sum, min, max), to a Kafka topic;
5. a stateless projection to a Kafka topic, the shape real-time mode is built for;
6. the Kafka source beside the project's own Python data source (the embedded log).

    python -m bench.real_time_mode [--events 20000] [--rate 2000]

Prints figures and verdicts; asserts nothing. Needs `make jars` (the broker and the connector).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from aggregates.spark import build_spark, kafka_connector_conf
from sketchboard.settings import Settings

PANE_SCHEMA = "endpoint STRING, latency_ms DOUBLE, user_id STRING, sent_ms LONG"


def produce(bootstrap: str, topic: str, events: int, rate: float, stop: threading.Event) -> None:
    """`events` records at about `rate` records/s, each carrying its own send time (ms)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    began = time.monotonic()
    for i in range(events):
        if stop.is_set():
            break
        wait = began + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        value = {"endpoint": f"/e{i % 8}", "latency_ms": float(i % 997), "user_id": f"u{i % 5000}",
                 "sent_ms": int(time.time() * 1000)}
        producer.produce(topic, json.dumps(value).encode(), key=value["user_id"].encode())
        producer.poll(0)
    producer.flush(30)


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)


def source(spark, bootstrap: str, topic: str):
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "latest").load())
    return (raw.select(F.from_json(F.col("value").cast("string"), PANE_SCHEMA).alias("e"), "timestamp")
            .select("e.*", F.col("timestamp").alias("event_time")))


def panes(events, sketches: bool):
    from pyspark.sql import functions as F

    aggs = [F.count("*").alias("count"), F.sum("latency_ms").alias("sum"),
            F.min("latency_ms").alias("min"), F.max("latency_ms").alias("max"),
            F.max("sent_ms").alias("newest_sent_ms")]
    if sketches:
        aggs += [F.hll_sketch_agg("user_id").alias("hll"), F.kll_sketch_agg_double("latency_ms").alias("kll")]
    return (events.withWatermark("event_time", "30 seconds")
            .groupBy(F.window("event_time", "10 seconds"), "endpoint").agg(*aggs))


def to_kafka(frame, bootstrap: str, topic: str, checkpoint: Path):
    from pyspark.sql import functions as F

    out = frame.select(F.to_json(F.struct(*[c for c in frame.columns if c not in ("hll", "kll")])).alias("value"))
    return (out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic).option("checkpointLocation", str(checkpoint)))


def output_latencies(bootstrap: str, topic: str, seconds: float) -> list[float]:
    """Read the output topic for `seconds`: per output record, now - the newest send time it
    carries (for a pane: the newest event it counts), in ms."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rtm-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        row = json.loads(message.value())
        sent = row.get("newest_sent_ms", row.get("sent_ms"))
        if sent is not None:
            latencies.append(time.time() * 1000 - sent)
    consumer.close()
    return latencies


def attempt(name: str, start_query, bootstrap: str, topic_in: str, out_topic: str | None, args) -> None:
    """Start the query; if Spark accepts it, feed it records at the given rate and measure."""
    try:
        query = start_query()
    except Exception as error:  # noqa: BLE001 - the point is to print Spark's reason
        print(f"- {name}: refused: {first_line(error)}", flush=True)
        return
    stop = threading.Event()
    feeder = threading.Thread(target=produce, args=(bootstrap, topic_in, args.events, args.rate, stop), daemon=True)
    time.sleep(5)  # the query subscribes at "latest": let it start reading first
    feeder.start()
    seconds = args.events / args.rate + 10
    latencies = output_latencies(bootstrap, out_topic, seconds) if out_topic else []
    if not out_topic:
        time.sleep(seconds)
    stop.set()
    error = query.exception()
    query.stop()
    if error is not None:
        print(f"- {name}: accepted, then failed: {first_line(error)}", flush=True)
    elif latencies:
        q = statistics.quantiles(latencies, n=100)
        print(f"- {name}: accepted; {len(latencies):,} output records, produced -> output p50 {q[49]:.0f} ms,"
              f" p99 {q[98]:.0f} ms", flush=True)
    else:
        print(f"- {name}: accepted; no output records measured", flush=True)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return " ".join(text[:3])[:400] if text else type(error).__name__


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="records fed to each accepted query")
    parser.add_argument("--rate", type=float, default=2_000, help="records/s fed to each accepted query")
    parser.add_argument("--trigger", default="5 seconds", help="real-time mode's batch duration (checkpoint interval)")
    args = parser.parse_args(argv)

    from tests.kafka_broker import KafkaBroker

    with tempfile.TemporaryDirectory(prefix="rtm-") as tmp:
        root = Path(tmp)
        broker = KafkaBroker(root / "broker", heap="1g")
        broker.start()
        jars = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default)
        # Real-time mode runs a query's stages at once (a pipelined shuffle): it needs a task slot
        # per source partition plus one per shuffle partition, free together. On the 2 cores here:
        # one input partition and one shuffle partition (3 + 2 failed with "needs 5 slots").
        spark = build_spark("local[2]", extra_conf={**jars, "spark.sql.shuffle.partitions": "1"})
        print(f"Spark {spark.version}, Kafka broker {broker.bootstrap}, real-time trigger {args.trigger!r},"
              f" {args.events:,} records at {args.rate:,.0f}/s per accepted query", flush=True)
        try:
            run_all(spark, broker.bootstrap, root, args)
        finally:
            spark.stop()
            broker.stop()


def run_all(spark, bootstrap: str, root: Path, args) -> None:
    def topics(name: str) -> tuple[str, str]:
        topic_in, topic_out = f"{name}.in", f"{name}.out"
        create_topic(bootstrap, topic_in)
        create_topic(bootstrap, topic_out, partitions=1)
        return topic_in, topic_out

    def checkpoint(name: str) -> Path:
        return root / "checkpoints" / name

    t_in, _ = topics("foreach-batch")
    attempt("1. pane aggregation with sketches, foreachBatch (the pipeline's commit)",
            lambda: (panes(source(spark, bootstrap, t_in), sketches=True).writeStream.outputMode("update")
                     .foreachBatch(lambda frame, batch_id: frame.count())
                     .option("checkpointLocation", str(checkpoint("fb"))).trigger(realTime=args.trigger).start()),
            bootstrap, t_in, None, args)

    t_in, _ = topics("foreach")

    class Discard:
        def open(self, partition_id, epoch_id):
            return True

        def process(self, row):
            pass

        def close(self, error):
            pass

    attempt("2. pane aggregation with sketches, foreach writer",
            lambda: (panes(source(spark, bootstrap, t_in), sketches=True).writeStream.outputMode("update")
                     .foreach(Discard()).option("checkpointLocation", str(checkpoint("fe")))
                     .trigger(realTime=args.trigger).start()),
            bootstrap, t_in, None, args)

    t_in, t_out = topics("sketch-kafka")
    attempt("3. pane aggregation with sketches, Kafka sink",
            lambda: (to_kafka(panes(source(spark, bootstrap, t_in), sketches=True), bootstrap, t_out,
                              checkpoint("sk")).outputMode("update").trigger(realTime=args.trigger).start()),
            bootstrap, t_in, t_out, args)

    t_in, t_out = topics("builtin-kafka")
    attempt("4. pane aggregation, built-in functions only, Kafka sink",
            lambda: (to_kafka(panes(source(spark, bootstrap, t_in), sketches=False), bootstrap, t_out,
                              checkpoint("bk")).outputMode("update").trigger(realTime=args.trigger).start()),
            bootstrap, t_in, t_out, args)

    t_in, t_out = topics("stateless")
    attempt("5. stateless projection, Kafka sink",
            lambda: (to_kafka(source(spark, bootstrap, t_in).select("endpoint", "sent_ms"), bootstrap, t_out,
                              checkpoint("sl")).outputMode("update").trigger(realTime=args.trigger).start()),
            bootstrap, t_in, t_out, args)

    t_in, t_out = topics("micro-batch")
    attempt("5b. the same stateless projection in micro-batch mode (default trigger), for comparison",
            lambda: (to_kafka(source(spark, bootstrap, t_in).select("endpoint", "sent_ms"), bootstrap, t_out,
                              checkpoint("mb")).outputMode("append").start()),
            bootstrap, t_in, t_out, args)

    attempt_embedded_source(spark, root, args)


def attempt_embedded_source(spark, root: Path, args) -> None:
    """6. The embedded log's Python data source under a real-time trigger."""
    from catalog import load_catalog
    from ingest.spark_source import SOURCE_NAME, source_options
    from sketchboard.settings import DEFAULT_STREAMS
    from sketchboard.wiring import open_log

    settings = Settings(data_dir=root / "embedded", streams_config=DEFAULT_STREAMS, alerts_config=None)
    catalog = load_catalog(settings.streams_config)
    open_log(settings, catalog).close()  # create the log's file
    options = source_options(str(settings.log_path), catalog, 10_000, 10_000,
                             checkpoint_dir=str(root / "checkpoints" / "embedded"))
    reader = spark.readStream.format(SOURCE_NAME).options(**options).load()
    class Discard:
        def process(self, row):
            pass

    try:
        query = (reader.writeStream.foreach(Discard()).outputMode("update")
                 .option("checkpointLocation", str(root / "checkpoints" / "embedded"))
                 .trigger(realTime=args.trigger).start())
    except Exception as error:  # noqa: BLE001 - Spark's reason is the result
        print(f"- 6. the embedded log's Python data source: refused: {first_line(error)}", flush=True)
        return
    time.sleep(10)
    error = query.exception()
    query.stop()
    verdict = f"accepted, then failed: {first_line(error)}" if error else "accepted"
    print(f"- 6. the embedded log's Python data source: {verdict}", flush=True)


if __name__ == "__main__":
    main()
