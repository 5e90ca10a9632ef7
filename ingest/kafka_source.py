"""The log's Kafka topics read by Spark's own Kafka source (spark-sql-kafka-0-10), as the same
rows the embedded log's source gives (`ingest.source_rows`), so the pipeline after the source
is one and the same for both backends.

- `readStream.format("kafka")` subscribes to the catalog's topics (`<prefix><stream>`); a new
  checkpoint starts at `startingOffsets` (default `earliest`, like the embedded source: every
  retained record is read); a checkpointed query resumes from Spark's offset log, whose end
  offsets per batch the store records with the batch id (exactly once, as on the embedded log).
- `maxOffsetsPerTrigger` = `max_records_per_batch`; Trigger.AvailableNow honours it.
- `failOnDataLoss` is false by default: records the topic's retention deleted before the
  pipeline read them are skipped with a warning in Spark's log, as the embedded log's retention
  skips them; true stops the query instead (for operators who would rather stop than skip).
- Each record's value is one JSON event (what `POST /api/v1/events` takes). With `fast_path`
  (off by default: slower here, see docs/benchmarks.md), records that are clearly valid
  events become source rows in the JVM (`ingest.kafka_fast_path`: `from_json` with the stream's
  schema plus Spark SQL checks, never a rejection); every other record is validated here, on the executors, by the API's own `EventValidator` (mapInArrow, one Arrow
  batch at a time): the same rules and the same messages as the ingest API. One that fails
  becomes an `invalid` row carrying the message, its partition and offset, which the pipeline
  dead-letters: read = aggregated + dead-lettered still holds. The record timestamp (the
  broker's append time on a LogAppendTime topic) is the ingest time.
- An event stream's records are first tried as columns, COLUMNAR_CHUNK at a time: their values
  joined as NDJSON and read by the ingest API's columnar path (`ingest.columnar`), which only
  ever answers "all valid, here they are" or "cannot tell". A chunk it cannot tell about is
  halved while that isolates its bad records, and what is left goes through the validator record
  by record; a stream whose chunks are mostly left to it skips the columnar path for a while.
  Rows and reasons never depend on which path ran (tests/unit/test_kafka_columnar.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from catalog import Catalog
from ingest.columnar import columnar_events, limits_allow
from ingest.json_limits import JsonLimits
from ingest.kafka_fast_path import judge_records, vouched_batch
from ingest.events import Event, EventValidator
from ingest.log.kafka import RECORD_SCHEMA, KafkaEventLog, topic_name
from ingest.log.records import columns_to_batch, events_to_batch, json_to_event, with_offsets
from ingest.tables import is_table, record_event
from ingest.source_rows import INVALID, SOURCE_SCHEMA, SPARK_SCHEMA, error_rows, to_source_batch

# How many records of one topic are read as columns in one call: Arrow's reader costs ~1 ms a
# call besides 2-3 us a demo record (measured: 7 us a record in calls of 256, 3.5 in 1 024, 2-3
# in 4 096, against ~22 us a record through the validator), and a record the columnar path
# cannot vouch for sends its whole chunk to the halving below.
COLUMNAR_CHUNK = 4096
# A chunk that failed is halved, down to this size, while one of its halves reads as columns (one
# bad record in a chunk then costs a few more parses and MIN_COLUMNAR_CHUNK records through the
# validator); when both halves fail, the bad records are everywhere and halving on would only add
# parses (measured: with 1 bad record in 1 000 or 100, halving on to 256 was slower than the
# validator alone).
MIN_COLUMNAR_CHUNK = 256
# A chunk mostly left to the validator makes its stream's next COLUMNAR_CHUNK records skip the
# columnar path, twice as many after each further such chunk in a row, up to 2^5 times as many:
# a producer whose valid events this path cannot read (an undeclared field, RFC 3339 times) or
# whose records are often bad would otherwise pay the parses on every chunk (~+30 %).
MAX_SKIP_DOUBLINGS = 5
# Options of Spark's Kafka source that Sketchboard sets itself, and Kafka consumer settings the
# connector refuses (it manages offsets and deserialisation itself: IllegalArgumentException).
_OWN_OPTIONS = {"subscribe", "subscribepattern", "assign", "kafka.bootstrap.servers"}
_REFUSED = {"auto.offset.reset", "enable.auto.commit", "key.deserializer", "value.deserializer",
            "interceptor.classes"}


@dataclass(frozen=True)
class KafkaSourceConfig:
    bootstrap_servers: str
    topic_prefix: str = "sketchboard."
    # Kafka client settings for the connector's consumers (without the `kafka.` prefix).
    kafka_options: Mapping[str, object] = field(default_factory=dict)
    # Options of the source itself, or `kafka.*` settings only the Java client knows (sasl.jaas.config).
    source_options: Mapping[str, object] = field(default_factory=dict)
    starting_offsets: str = "earliest"
    fail_on_data_loss: bool = False
    # The ingest API's bounds on an event (settings max_json_*), applied to records that bypassed it.
    json_limits: JsonLimits = field(default_factory=JsonLimits)
    # On: clearly valid records become rows in the JVM (ingest.kafka_fast_path) and only the others
    # go to the API's validator in Python. Off by default: measured here, log -> store was no faster
    # (5 300-6 400 vs 6 900-7 400 events/s) and from_json plus its checks read about half as many
    # records/s as the Python validator (docs/benchmarks.md).
    fast_path: bool = False


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def spark_kafka_options(config: KafkaSourceConfig, topics: list[str], max_records_per_batch: int) -> dict[str, str]:
    """The options of `readStream.format("kafka")`. Every client setting is passed as `kafka.<key>`
    (security.protocol, sasl.mechanism, ssl.*: same names in librdkafka and the Java client; a key
    only librdkafka knows draws a warning from the Java client, not an error) except those the
    connector refuses; `source_options` come last and win."""
    options = {f"kafka.{k}": _text(v) for k, v in config.kafka_options.items()
               if k.lower() not in _REFUSED and k != "bootstrap.servers"}
    options.update({
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "subscribe": ",".join(topics),
        "startingOffsets": config.starting_offsets,
        "failOnDataLoss": _text(config.fail_on_data_loss),
        "maxOffsetsPerTrigger": str(max_records_per_batch),
        # Change data capture appends a source's records and its position in one Kafka transaction
        # (ingest/log/kafka_positions.py): an aborted one's records must never be aggregated.
        "kafka.isolation.level": "read_committed",
        # Spark's default adds the topic name to the consumer group: fine; the source never
        # commits to Kafka, offsets live in the checkpoint and the store.
    })
    for key, value in config.source_options.items():
        if key.lower() in _OWN_OPTIONS:
            raise ValueError(f"kafka_source_options: {key!r} is set by Sketchboard (from the catalog and"
                             " kafka_bootstrap_servers)")
        options[key] = _text(value)
    return options


def topics_of(catalog: Catalog, prefix: str) -> dict[str, str]:
    """topic -> stream, for every stream of the catalog."""
    return {topic_name(prefix, name): name for name in catalog.streams}


def stream_offsets(offsets: Mapping[str, Mapping[int, int]], topics: Mapping[str, str]) -> dict[str, dict[int, int]]:
    """Spark's per-topic end offsets (its offset log) as the store records them: per stream."""
    return {topics[t]: dict(parts) for t, parts in offsets.items() if t in topics}


class RecordConverter:
    """Kafka records (RECORD_SCHEMA) -> source rows (SOURCE_SCHEMA). Pure: no I/O.

    `columnar=False` validates every record one by one, as before issue 28 (what the columnar
    path is compared with, and a switch should it ever be needed); the rows are the same."""

    def __init__(self, catalog: Catalog, topic_prefix: str, limits: JsonLimits | None = None, *,
                 columnar: bool = True):
        self.streams = {t: catalog.stream(s) for t, s in topics_of(catalog, topic_prefix).items()}
        self.limits = limits if limits is not None else JsonLimits()
        # JSON bounds tighter than the validator's own: only the per-record path checks them.
        self.columnar = columnar and limits_allow(self.limits)
        self._validators: dict[str, EventValidator] = {}
        # Per stream: chunks in a row that were mostly not columns, and how many of its records
        # go straight to the validator before the columnar path is tried again.
        self._misses: dict[str, int] = {}
        self._skip: dict[str, int] = {}

    def validator(self, stream) -> EventValidator:
        validator = self._validators.get(stream.name)
        if validator is None:
            validator = self._validators[stream.name] = EventValidator(stream)
        return validator

    def _from_json(self, validator: EventValidator, value: bytes | None) -> Event:
        return json_to_event(validator, value, self.limits)

    def convert(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Per topic: its good rows in the records' order, then its bad rows in the records' order
        (the order the per-record path has always given, whichever path a chunk took)."""
        topics = batch.column("topic").to_pylist()
        values = batch.column("value").to_pylist()
        columns = _Records(batch, values)
        by_topic: dict[str, list[int]] = {}
        for i, topic in enumerate(topics):
            by_topic.setdefault(topic, []).append(i)
        for topic, rows in by_topic.items():
            stream = self.streams.get(topic)
            if stream is None:  # not a topic of the catalog (cannot happen with `subscribe`)
                continue
            # A table's tombstones, keys and `op` are set per record; a sent time is not read as
            # columns (ingest.columnar): neither is worth joining into NDJSON.
            as_columns = self.columnar and not is_table(stream) and not stream.sent_time_field
            pending: list[int] = []  # records for the validator, flushed in order before columns
            bad: list[int] = []
            reasons: list[str] = []
            for part, table in (self._parts(stream, rows, values) if as_columns else [(rows, None)]):
                if table is None:
                    pending += part
                    continue
                if pending:
                    yield from self._per_record(stream, columns, pending, bad, reasons)
                    pending = []
                yield self._from_columns(stream, columns, part, table)
            if pending:
                yield from self._per_record(stream, columns, pending, bad, reasons)
            if bad:
                yield error_rows(stream.name, columns.take("partition", bad), columns.take("offset", bad), reasons,
                                 INVALID, ingest_time=columns.take("ingest_time", bad))

    def _parts(self, stream, rows: list[int], values: list) -> Iterator[tuple[list[int], pa.Table | None]]:
        """`rows` in order, in parts: each with its events as validated columns, or None (the
        validator decides)."""
        for at in range(0, len(rows), COLUMNAR_CHUNK):
            chunk = rows[at:at + COLUMNAR_CHUNK]
            skip = self._skip.get(stream.name, 0)
            if skip > 0:
                self._skip[stream.name] = skip - len(chunk)
                yield chunk, None
                continue
            table = self._columns(stream, chunk, values)
            if table is not None:
                self._misses.pop(stream.name, None)
                yield chunk, table
                continue
            parts = list(self._halved(stream, chunk, values))
            taken = sum(len(part) for part, table in parts if table is not None)
            if 2 * taken >= len(chunk):
                self._misses.pop(stream.name, None)
            else:
                # Mostly not columns (bad records throughout, or valid ones this path cannot read:
                # an undeclared field, RFC 3339 times): the stream's next records skip the parses,
                # for longer after each such chunk in a row.
                misses = self._misses[stream.name] = self._misses.get(stream.name, 0) + 1
                self._skip[stream.name] = COLUMNAR_CHUNK << min(misses - 1, MAX_SKIP_DOUBLINGS)
            yield from parts

    def _halved(self, stream, chunk: list[int], values: list) -> Iterator[tuple[list[int], pa.Table | None]]:
        """A chunk that did not read as columns, in parts: the halves that do, and the rest."""
        if len(chunk) < 2 * MIN_COLUMNAR_CHUNK:
            yield chunk, None
            return
        mid = len(chunk) // 2
        halves = [(half, self._columns(stream, half, values)) for half in (chunk[:mid], chunk[mid:])]
        if all(table is None for _, table in halves):  # bad records throughout: halving on only adds parses
            yield chunk, None
            return
        for half, table in halves:
            if table is None:
                yield from self._halved(stream, half, values)
            else:
                yield half, table

    @staticmethod
    def _columns(stream, chunk: list[int], values: list) -> pa.Table | None:
        """The chunk's events as columns when every record is valid, else None. Its values are
        joined as NDJSON only when each is one line that starts like an object: then line i of
        the body is record i exactly (ingest.columnar.object_lines splits on \\n alone and skips
        blank lines), and `columnar_events` checks that each line held one object. A null value
        (a tombstone), a blank one, or one holding a newline (pretty-printed JSON, valid as a
        record) leaves the chunk to the validator."""
        part = [values[i] for i in chunk]
        for value in part:
            if value is None or b"\n" in value or value.lstrip()[:1] != b"{":
                return None
        table = columnar_events(stream, b"\n".join(part))
        return table if table is None or table.num_rows == len(part) else None  # (cannot differ: no newlines)

    def _from_columns(self, stream, columns: _Records, part: list[int], table: pa.Table) -> pa.RecordBatch:
        segment = columns_to_batch(stream, table, columns.take("ingest_time", part))
        return to_source_batch(stream, columns.take("partition", part),
                               with_offsets(columns.take("offset", part), segment))

    def _per_record(self, stream, columns: _Records, rows: list[int], bad: list[int],
                    reasons: list[str]) -> Iterator[pa.RecordBatch]:
        """The records through the API's validator one by one: the good ones' rows (yielded), the
        bad ones added to `bad` and `reasons`."""
        validator = self.validator(stream)
        values, keys, times = columns.values, columns.list("key"), columns.list("ingest_time")
        good: list[int] = []
        events: list[Event] = []
        for i in rows:
            try:
                events.append(record_event(stream, validator, keys[i], values[i], times[i], self._from_json))
                good.append(i)
            except ValueError as exc:
                bad.append(i)
                reasons.append(str(exc))
        if good:
            decoded = events_to_batch(stream, events, [times[i] for i in good])
            yield to_source_batch(stream, columns.take("partition", good),
                                  with_offsets(columns.take("offset", good), decoded))


class _Records:
    """A batch of records' columns, each read into Python once and only if asked for."""

    def __init__(self, batch: pa.RecordBatch, values: list):
        self.batch = batch
        self.values = values
        self._lists: dict[str, list] = {}

    def list(self, name: str) -> list:
        column = self._lists.get(name)
        if column is None:
            if name in self.batch.schema.names:
                column = self.batch.column(name).to_pylist()
            else:  # a table's key: absent from batches built without it (tests, older callers)
                column = [None] * self.batch.num_rows
            self._lists[name] = column
        return column

    def take(self, name: str, rows: list[int]) -> pa.Array:
        """The rows' values of a column (partition int32, offset and ingest_time int64)."""
        column = self.batch.column(name)
        if rows and rows[-1] - rows[0] == len(rows) - 1:  # consecutive (one topic's batch): a slice
            return column.slice(rows[0], len(rows))
        return column.take(pa.array(rows, pa.int64()))


def read_kafka(spark, catalog: Catalog, config: KafkaSourceConfig, max_records_per_batch: int):
    """The catalog's topics as a streaming DataFrame of source rows (ingest.source_rows)."""
    from pyspark.sql import functions as F

    topics = sorted(topics_of(catalog, config.topic_prefix))
    options = spark_kafka_options(config, topics, max_records_per_batch)
    records = (
        spark.readStream.format("kafka").options(**options).load()
        .select("topic", "partition", "offset", F.unix_millis("timestamp").alias("ingest_time"), "value",
                "key")
    )
    return validated_rows(records, catalog, config.topic_prefix, config.json_limits, fast_path=config.fast_path)


def range_options(config: KafkaSourceConfig, start: Mapping[str, Mapping[int, int]],
                  end: Mapping[str, Mapping[int, int]]) -> dict[str, str] | None:
    """The options of a batch read (`spark.read.format("kafka")`) of [start, end) per stream and
    partition: the partitions with records in the range `assign`ed, with their startingOffsets and
    endingOffsets as JSON (a batch read wants both for every partition it reads). None when the
    range holds no record. Pure: what a batch with chosen end offsets reads on Kafka, where a
    streaming query takes no per-partition end (aggregates/bounded_batches.py)."""
    import json

    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    for stream, parts in sorted(end.items()):
        for partition, hi in sorted(parts.items()):
            lo = start.get(stream, {}).get(partition, 0)
            if hi > lo:
                ranges.setdefault(topic_name(config.topic_prefix, stream), {})[int(partition)] = (int(lo), int(hi))
    if not ranges:
        return None
    options = spark_kafka_options(config, sorted(ranges), 1)
    for streaming_only in ("subscribe", "maxOffsetsPerTrigger"):
        options.pop(streaming_only)
    options["assign"] = json.dumps({t: sorted(parts) for t, parts in ranges.items()})
    options["startingOffsets"] = json.dumps({t: {str(p): lo for p, (lo, _) in parts.items()}
                                             for t, parts in ranges.items()})
    options["endingOffsets"] = json.dumps({t: {str(p): hi for p, (_, hi) in parts.items()}
                                           for t, parts in ranges.items()})
    return options


def read_kafka_range(spark, catalog: Catalog, config: KafkaSourceConfig, start: Mapping[str, Mapping[int, int]],
                     end: Mapping[str, Mapping[int, int]]):
    """The records of [start, end) per stream and partition as a (batch) DataFrame of source rows,
    converted as `read_kafka`'s are: one batch with chosen end offsets (aggregates/bounded_batches.py)."""
    from pyspark.sql import functions as F

    options = range_options(config, start, end)
    if options is None:
        return spark.createDataFrame([], SPARK_SCHEMA)
    records = (
        spark.read.format("kafka").options(**options).load()
        .select("topic", "partition", "offset", F.unix_millis("timestamp").alias("ingest_time"), "value",
                "key")
    )
    return validated_rows(records, catalog, config.topic_prefix, config.json_limits, fast_path=config.fast_path)


class KafkaDataLost(RuntimeError):
    """Records a batch was to read were deleted by the topic's retention, with fail_on_data_loss on."""


def read_kafka_rows(log: KafkaEventLog, catalog: Catalog, config: KafkaSourceConfig,
                    start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> pa.Table:
    """The source rows of [start, end) per stream and partition, read by this process's own
    consumer (`log`, read_committed as Spark's source reads) and converted by the same
    RecordConverter as `read_kafka_range`'s, in the embedded reader's order (stream, partition,
    offset): a batch of the pipeline's own on a local master reads Kafka with no Spark job and no
    JVM (aggregates/bounded_batches.py `kafka_batches`). Records the topic's retention deleted are
    skipped with a warning, as Spark's source skips them with failOnDataLoss off; with it on, the
    read fails as Spark's query would."""
    import logging

    def lost(stream: str, partition: int, first: int, retained: int) -> None:
        what = (f"records {first}..{retained - 1} of stream {stream!r} partition {partition} were deleted by the"
                " Kafka topic's retention before the pipeline read them")
        if config.fail_on_data_loss:
            raise KafkaDataLost(f"{what} (kafka_fail_on_data_loss is on: stopping, as Spark's Kafka source does"
                                " with failOnDataLoss)")
        logging.getLogger("sketchboard.pipeline").warning("%s: skipped (kafka_fail_on_data_loss is off)", what)

    ranges = {(stream, partition): (start.get(stream, {}).get(partition, 0), hi)
              for stream, parts in sorted(end.items()) if stream in catalog.streams
              for partition, hi in sorted(parts.items())}
    read = log.records(ranges, lost)
    converter = _converter(catalog.model_dump_json(), config.topic_prefix, config.json_limits)
    batches = [b for key in ranges for raw in read[key] for b in converter.convert(raw) if b.num_rows]
    return pa.Table.from_batches([b.select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA) for b in batches],
                                 schema=SOURCE_SCHEMA)


def validated_rows(records, catalog: Catalog, prefix: str, limits: JsonLimits, *, fast_path: bool = False):
    """Kafka records (topic, partition, offset, ingest_time, value; streaming or not) -> source rows:
    the JVM's fast path for the records it vouches for, the API's validator in Python for the rest.
    One pass: the vouched rows cross into the Python worker already read (moved, not validated,
    a whole Arrow batch at a time), so the records are read from Kafka once per batch."""
    catalog_json = catalog.model_dump_json()
    topics = topics_of(catalog, prefix)
    record_columns = list(records.columns)
    if fast_path:
        # A table's records always take the Python path: a tombstone and the `op` of an upsert are set there.
        events_only = {t: name for t, name in topics.items() if not is_table(catalog.stream(name))}
        records = judge_records(records, catalog, events_only, limits)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        converter = _converter(catalog_json, prefix, limits)
        for batch in batches:
            if "vouched" in batch.schema.names:
                vouched = batch.column("vouched")
                if pc.any(vouched).as_py():
                    yield vouched_batch(batch.filter(vouched))
                if pc.all(vouched).as_py():
                    continue
                batch = batch.filter(pc.invert(vouched)).select(record_columns)
            for out in converter.convert(batch):
                if out.num_rows:
                    yield out

    return records.mapInArrow(convert, SPARK_SCHEMA)


_CONVERTERS: dict[tuple[str, str, JsonLimits], RecordConverter] = {}


def _converter(catalog_json: str, prefix: str, limits: JsonLimits) -> RecordConverter:
    # Python workers are reused across tasks: build the validators (pydantic models) once per
    # worker and catalog, not once per task.
    key = (catalog_json, prefix, limits)
    converter = _CONVERTERS.get(key)
    if converter is None:
        _CONVERTERS.clear()
        converter = _CONVERTERS[key] = RecordConverter(Catalog.model_validate_json(catalog_json), prefix, limits)
    return converter


__all__ = ["RECORD_SCHEMA", "SOURCE_SCHEMA", "KafkaDataLost", "KafkaSourceConfig", "RecordConverter", "range_options",
           "read_kafka", "read_kafka_range", "read_kafka_rows", "spark_kafka_options", "stream_offsets", "topics_of", "validated_rows"]
