"""A small micro-batch held on the driver as an Arrow table: read without a Spark job (embedded
log) or with one (Kafka), every later step in Python and Arrow over it.

At the demo's rate a batch is a few hundred events, and what it costs in Spark is the fixed cost
per job (scheduling, tasks, Python worker round trips: ~0.05-0.4 s each) and per plan (Catalyst
over a few local rows, ~50 ms, and its calls into the JVM, ~0.5-1 ms each), not the rows. So below
`PipelineConfig.driver_batch_rows` rows the batch is not a DataFrame at all: from the embedded log
its records are read in Python by the source's own reader (ingest.spark_source.read_batch) for the
batch's offset range, known from the checkpoint before anything runs (Spark's own DataFrame of the
batch is never executed); from Kafka, whose source reads in the JVM, it is collected once as Arrow
(one job). Each step has its rule for such a table: the dead-letter reason, pane start and device
clock correction in aggregates/driver_rules.py, enrichment's lookups in
aggregates/enrichment_driver.py, the partial aggregates in aggregates/arrow_partials.py, the
Bloom and sessions' keys in aggregates/key_rows.py, the tables' newest rows in aggregates/tables.py.
A batch at the demo's rate thus makes no call into the JVM besides Spark's own trigger.

Results are the same as the large batches' Spark path: tests/spark/test_driver_rules.py checks
the rules against Spark's expressions with Hypothesis, and tests/spark/test_driver_batch.py pins
that a pipeline taking this path commits what one that persists every batch commits (panes,
tables, device clocks, misses, dead letters), with no Spark job and no call into the JVM. Whether a
batch is small is known before reading it: its rows are at most the sum of (end - start) offsets
over its partitions, from the checkpoint's offset log (the previous batch's end is this one's
start).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

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


def arrow_on_driver(df: DataFrame) -> pa.Table:
    """What `df.toArrow()` gives (same schema, same rows) through `collect()`: over local rows
    (`createDataFrame` of a few rows: tests, the references Spark's rules are checked with) Spark
    evaluates the plan on the driver (ConvertToLocalRelation) and runs no job, while `toArrow`
    always runs one."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    rows = df.collect()
    return pa.table([pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)], schema=schema)
