"""Spike, not a test: does Spark's own Kafka source (the 4.2.0 connector jars from `make jars`,
as spark.jars) read our topics under pyspark 4.3.0 with the project's SparkSession setup?

    .venv/bin/python -m tests.spark.kafka_source_spike /tmp/spike-dir

Starts a real broker, writes 30 000 events through KafkaEventLog (3 partitions) plus 3
malformed records from a plain producer, then reads them with readStream.format("kafka")
(availableNow, maxOffsetsPerTrigger), parses with from_json, appends 500 more and resumes from
the checkpoint. Prints what it saw as JSON. Findings are in docs/development.md."""
import json
import sys
import time
from pathlib import Path
import pyspark
from tests.kafka_broker import KafkaBroker, client_config
from ingest.log.kafka import KafkaEventLog
from catalog import StreamDef
from ingest.events import EventValidator
from confluent_kafka import Producer

root = Path(sys.argv[1])
b = KafkaBroker(root / "broker"); b.start()
out = {}
try:
    stream = StreamDef(name="orders", key_field="customer_id", dimensions=("country",), values=("amount",), partitions=3)
    log = KafkaEventLog(b.bootstrap, replication_factor=1)
    log.ensure_topic(stream)
    v = EventValidator(stream)
    now = int(time.time() * 1000)
    t = time.monotonic()
    for start in range(0, 30_000, 5_000):
        log.append(stream, [v.validate({"time": now + i, "customer_id": f"c{i % 97}", "country": "de", "amount": 1.0})
                            for i in range(start, start + 5_000)], now)
    out["append_30000_s"] = round(time.monotonic() - t, 2)
    p = Producer(client_config(b.bootstrap))
    for bad in (b"not json", b'{"time": "x"}', b'{"customer_id": "c1", "amount": "12"}'):
        p.produce("sketchboard.orders", bad, b"c1", partition=0)
    p.flush(10)
    ends = {k: o.end for k, o in log.offsets("orders").items()}
    out["end_offsets"] = ends

    from aggregates.spark import build_spark
    jars = sorted(str(j) for j in Path("jars/spark-kafka").glob("*.jar"))
    t = time.monotonic()
    spark = build_spark("local[2]", app_name="kafka-spike", driver_memory="1g", extra_conf={"spark.jars": ",".join(jars)})
    out["spark_start_s"] = round(time.monotonic() - t, 1)
    out["pyspark"] = pyspark.__version__

    def reader(**opts):
        r = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", b.bootstrap)
             .option("subscribePattern", r"sketchboard\..*").option("startingOffsets", "earliest")
             .option("failOnDataLoss", "false"))
        for k, val in opts.items():
            r = r.option(k, val)
        return r.load()

    seen = []
    def batch(df, batch_id):
        rows = df.groupBy("topic", "partition", "timestampType").agg({"offset": "count", "timestamp": "min"}).collect()
        seen.append((batch_id, [r.asDict() for r in rows]))

    df = reader(maxOffsetsPerTrigger="12000")
    out["schema"] = df.schema.simpleString()
    ck = str(root / "ck")
    t = time.monotonic()
    q = df.writeStream.foreachBatch(batch).option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    out["availableNow_s"] = round(time.monotonic() - t, 1)
    per_partition = {}
    for _, rows in seen:
        for r in rows:
            per_partition[r["partition"]] = per_partition.get(r["partition"], 0) + r["count(offset)"]
    out["batches"] = len(seen)
    out["read_per_partition"] = per_partition
    out["timestampType"] = sorted({r["timestampType"] for _, rows in seen for r in rows})
    # from_json with a schema: the JVM-side parse the pipeline would use
    from pyspark.sql import functions as F
    schema = "time long, customer_id string, country string, amount double"
    parsed = (spark.read.format("kafka").option("kafka.bootstrap.servers", b.bootstrap)
              .option("subscribe", "sketchboard.orders").option("startingOffsets", "earliest").load()
              .select(F.from_json(F.col("value").cast("string"), schema, {"mode": "PERMISSIVE"}).alias("e"), "offset", "partition"))
    out["from_json_null_time"] = parsed.where("e.time is null").count()
    # resume from the checkpoint: only new records
    seen.clear()
    log.append(stream, [v.validate({"time": now, "customer_id": f"c{i}", "amount": 2.0}) for i in range(500)], now)
    q = df.writeStream.foreachBatch(batch).option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    out["resumed_read"] = sum(r["count(offset)"] for _, rows in seen for r in rows)

    # A running query (1 s trigger) while the broker is stopped and started again.
    seen.clear()
    q = (df.writeStream.foreachBatch(batch).option("checkpointLocation", ck).trigger(processingTime="1 second")
         .start())
    log.append(stream, [v.validate({"time": now, "customer_id": f"c{i}", "amount": 3.0}) for i in range(1000)], now)
    time.sleep(5)
    t = time.monotonic()
    b.stop()
    time.sleep(10)
    b.start()
    out["broker_down_s"] = round(time.monotonic() - t, 1)
    log.append(stream, [v.validate({"time": now, "customer_id": f"c{i}", "amount": 4.0}) for i in range(1000)], now)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and q.isActive:
        if sum(r["count(offset)"] for _, rows in seen for r in rows) >= 2000:
            break
        time.sleep(1)
    out["restart_query_active"] = q.isActive
    out["restart_query_exception"] = str(q.exception())[:500] if not q.isActive else None
    out["restart_read"] = sum(r["count(offset)"] for _, rows in seen for r in rows)
    out["restart_caught_up_s_after_start"] = round(time.monotonic() - t - out["broker_down_s"], 1)
    if q.isActive:
        q.stop()
    spark.stop()
    log.close()
finally:
    b.stop()
print(json.dumps(out, indent=1, default=str))
