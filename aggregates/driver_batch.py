"""A small micro-batch held on the driver: read without a Spark job (embedded log) or with one
(Kafka), later steps plan over local rows.

At the demo's rate a batch is a few hundred events, and what it costs is Spark's fixed cost per
job (scheduling, tasks, Python worker round trips: ~0.05-0.4 s each), not the rows. Persisting
such a batch costs three jobs (the cache is built by the first action) and every step's
collect is one more. Instead, below `PipelineConfig.driver_batch_rows` rows, the batch is read
once (`collectAsList`, one job, the rows stay in the driver's JVM) and made a `LocalRelation`
with the same schema. Spark's optimizer then evaluates the filters and projections over it on
the driver (ConvertToLocalRelation) and a `collect()` of them runs no job at all; aggregations
and `toArrow` still run one, over local rows instead of the source or a cache. From the embedded
log even the read runs no job: the batch's offset range is known from the checkpoint before
anything runs, so its records are read in Python by the source's own reader
(ingest.spark_source.read_batch) and sent to the JVM as Arrow, which makes them local rows
(`local_batch`); Spark's own DataFrame of the batch is never executed. Spark's Kafka source reads
in the JVM, so a Kafka batch keeps the one job (`on_driver`).

Results are the same by construction: every step runs the same Spark expressions over the same
rows; only where they run changes (tests/spark/test_driver_batch.py pins the panes and the
commit against the cached path, and the job count). Whether a batch is small is known before
reading it: its rows are at most the sum of (end - start) offsets over its partitions, from
the checkpoint's offset log (the previous batch's end is this one's start).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ingest.source_rows import SOURCE_SCHEMA


def rows_at_most(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> int | None:
    """An upper bound of a batch's records from its start and end offsets per stream and
    partition; None when a partition's start is unknown (a new partition, no previous batch)."""
    if not end:
        return None
    total = 0
    for stream, parts in end.items():
        for partition, offset in parts.items():
            began = start.get(stream, {}).get(partition)
            if began is None:
                return None
            total += max(0, offset - began)
    return total


def streams_with_rows(start: Mapping[str, Mapping[int, int]],
                      end: Mapping[str, Mapping[int, int]]) -> frozenset[str] | None:
    """The streams that may have records in a batch, from its start and end offsets per stream and
    partition: one none of whose partitions moved has none (a stream not in `end` was not read).
    None when unknown (no end offsets, a partition's start unknown)."""
    if not end:
        return None
    out = set()
    for stream, parts in end.items():
        for partition, offset in parts.items():
            began = start.get(stream, {}).get(partition)
            if began is None:
                return None
            if offset > began:
                out.add(stream)
    return frozenset(out)


def among(names: Iterable[str], present: Collection[str] | None) -> list[str]:
    """`names` (in their order) that are in `present`; all of them when `present` is None (unknown:
    a batch not on the driver). A step skips the streams with no records in a small batch: no
    expressions built, no Spark job, no calls into the JVM for them."""
    return [n for n in names if present is None or n in present]


def no_records(columns: Iterable[str]) -> pa.Table:
    """An empty table of the source's `columns`: what a step's records are when none of its streams
    has any in the batch (no expression built, no call into the JVM)."""
    return SOURCE_SCHEMA.empty_table().select(list(columns))


def on_driver(batch: DataFrame) -> DataFrame:
    """`batch` read once (one Spark job) into a LocalRelation of the same schema, in a copy of its
    session without adaptive execution: over a few hundred local rows it has nothing to adapt,
    and it would run each shuffle of an aggregation as a Spark job of its own (two jobs instead
    of one per groupBy). Adaptive execution changes plans, never results."""
    jdf = batch._jdf
    session = _without_adaptive(jdf.sparkSession())
    return DataFrame(session.createDataFrame(jdf.collectAsList(), jdf.schema()), batch.sparkSession)


def local_batch(batch: DataFrame, records: pa.Table, schema: T.StructType | None = None) -> DataFrame:
    """`records` (the batch's source rows, read on the driver from the embedded log:
    ingest.spark_source.read_batch; or a step's rows made in Python: aggregates/enrichment.py) as a
    LocalRelation of `batch`'s schema (or `schema`) in the session
    `on_driver` uses, with no Spark job: `batch` itself is never executed. Arrow record batches
    go to the JVM through a file, as `createDataFrame(pyarrow.Table)` sends them, and become local
    rows there (below `spark.sql.execution.arrow.localRelationThreshold`, 48 MB, far above
    `driver_batch_rows` records)."""
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    jdf = batch._jdf
    session = _without_adaptive(jdf.sparkSession())
    schema = schema or batch.schema
    records = records.cast(to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC"))
    sc = batch.sparkSession.sparkContext
    jvm = sc._jvm
    chunks = sc._serialize_to_jvm(records.to_batches(), ArrowStreamSerializer(),
                                  lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
                                  lambda: jvm.ArrowIteratorServer())
    local = DataFrame(jvm.PythonSQLUtils.toDataFrame(chunks, schema.json(), session), batch.sparkSession)
    local.__dict__["schema"] = schema  # known (a cached property): no calls into the JVM to ask for it
    return local


def arrow_on_driver(df: DataFrame) -> pa.Table:
    """What `df.toArrow()` gives (same schema, same rows) for filters and projections over a batch
    on the driver, without its Spark job: Spark collects Arrow through an RDD, always a job, while
    `collect()` of such a plan is evaluated on the driver (ConvertToLocalRelation) and runs none."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    rows = df.collect()
    return pa.table([pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)], schema=schema)


def map_literal(mapping: Mapping[str, object], value_type: T.DataType) -> Column:
    """`mapping` (JSON-able values) as a map<string, value_type> literal for a projection over a
    batch on the driver: one JSON string parsed once (Spark folds it), not two literals per entry,
    each a call into the JVM."""
    return F.from_json(F.lit(json.dumps(mapping)), T.MapType(T.StringType(), value_type))


_SESSIONS: dict[str, object] = {}  # the batch's session's id -> its copy without adaptive execution


def _without_adaptive(jsession):
    key = jsession.sessionUUID()
    if key not in _SESSIONS:
        _SESSIONS.clear()  # a new streaming query's session: the copy of the previous one is done with
        copy = jsession.cloneSession()
        copy.conf().set("spark.sql.adaptive.enabled", "false")
        _SESSIONS[key] = copy
    return _SESSIONS[key]

