"""Per-batch partial aggregation and dead-letter classification, run on the executors.

Every source row first gets a dead-letter reason or null (`dead_letter_reason_column`, the
rule of `aggregates.eventtime`). Good rows are assigned to their event-time pane and grouped
by (stream, pane start, dimension values); per group: the count, the newest event time, and
per value slot n/sum/min/max plus a KLL sketch, per distinct slot an HLL sketch (Spark's
native DataSketches aggregates, whose bytes the `datasketches` package reads). Dead rows go
through the same aggregation, one group per record (keyed by partition and offset), so a
batch is one Spark job and one collect; their values are nulled first, so they cost no
sketch updates and cannot move the watermark. No state is kept between batches: the store
merges the partials, so Spark needs no state store.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from aggregates.eventtime import BEYOND_RETENTION, FUTURE_SKEW, UNPARSEABLE
from catalog import Catalog, StreamDef
from sketches import DEFAULT_K, DEFAULT_LG_K


def per_stream(catalog: Catalog, value: Callable[[StreamDef], int]) -> Column:
    """A per-stream constant of each row's stream, as a literal CASE expression."""
    expr = None
    for name, stream in catalog.streams.items():
        expr = (F.when if expr is None else expr.when)(F.col("stream") == name, F.lit(value(stream)))
    return expr.otherwise(F.lit(None)) if expr is not None else F.lit(None)


def pane_ms_column(catalog: Catalog) -> Column:
    """The pane size of each row's stream, as a literal CASE expression."""
    return per_stream(catalog, lambda s: s.pane)


def dead_letter_reason_column(catalog: Catalog, batch_now_ms: int) -> Column:
    """Null for a row to merge, else its dead-letter reason (see aggregates.eventtime)."""
    retention = per_stream(catalog, lambda s: s.retention)
    skew = per_stream(catalog, lambda s: s.max_future_skew)
    event_time, ingest_time = F.col("event_time"), F.col("ingest_time")
    return (
        F.when(F.col("error").isNotNull() | event_time.isNull() | ingest_time.isNull(), F.lit(UNPARSEABLE))
        .when(event_time < F.lit(batch_now_ms) - retention, F.lit(BEYOND_RETENTION))
        .when(event_time > ingest_time + skew, F.lit(FUTURE_SKEW))
        .otherwise(F.lit(None).cast("string"))
    )


def partial_aggregates(df: DataFrame, catalog: Catalog, *, batch_now_ms: int, lg_k: int = DEFAULT_LG_K,
                       kll_k: int = DEFAULT_K) -> DataFrame:
    """One row per (stream, pane, dims) of good records (dead_reason null) and one row per
    dead-lettered record (dead_reason set, with its partition, offset, times, error, dims)."""
    width_vals = max((len(s.values) for s in catalog.streams.values()), default=0)
    width_ids = max((len(s.distinct_fields) for s in catalog.streams.values()), default=0)
    pane_ms = pane_ms_column(catalog)
    rows = df.withColumn("dead_reason", dead_letter_reason_column(catalog, batch_now_ms))
    good = F.col("dead_reason").isNull()
    dead = F.col("dead_reason").isNotNull()
    rows = rows.select(
        "stream",
        "dead_reason",
        F.when(good, F.col("event_time") - F.pmod(F.col("event_time"), pane_ms)).alias("pane_start"),
        F.when(good, F.col("dims")).alias("g_dims"),
        F.when(dead, F.col("partition")).alias("dead_partition"),
        F.when(dead, F.col("offset")).alias("dead_offset"),
        F.when(good, F.col("event_time")).alias("good_event_time"),
        F.when(dead, F.col("event_time")).alias("dead_event_time"),
        F.when(dead, F.col("ingest_time")).alias("dead_ingest_time"),
        F.when(dead, F.col("error")).alias("dead_error"),
        F.when(dead, F.col("dims")).alias("dead_dims"),
        # get() yields null past the end of a shorter stream's array (no ANSI error).
        *[F.when(good, F.get(F.col("vals"), i)).alias(f"v_{i}") for i in range(width_vals)],
        *[F.when(good, F.get(F.col("ids"), j)).alias(f"id_{j}") for j in range(width_ids)],
    )
    aggs = [
        F.count(F.lit(1)).alias("count"),
        F.max("good_event_time").alias("max_event_time"),
        F.max("dead_event_time").alias("dead_event_time"),
        F.max("dead_ingest_time").alias("dead_ingest_time"),
        F.max("dead_error").alias("dead_error"),
        F.max("dead_dims").alias("dead_dims"),
    ]
    for i in range(width_vals):
        v = F.col(f"v_{i}")
        aggs += [
            F.count(v).alias(f"n_{i}"),
            F.sum(v).alias(f"sum_{i}"),
            F.min(v).alias(f"min_{i}"),
            F.max(v).alias(f"max_{i}"),
            F.kll_sketch_agg_double(v, kll_k).alias(f"kll_{i}"),
        ]
    for j in range(width_ids):
        aggs.append(F.hll_sketch_agg(F.col(f"id_{j}"), lg_k).alias(f"hll_{j}"))
    return (
        rows.groupBy("stream", "dead_reason", "pane_start", "g_dims", "dead_partition", "dead_offset")
        .agg(*aggs)
        .withColumnRenamed("g_dims", "dims")
    )
