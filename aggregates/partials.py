"""Per-batch partial aggregation, run on the executors.

Every source row is assigned to its event-time pane and grouped by (stream, pane start,
dimension values). Per group: the count, the newest event time, and per value slot
n/sum/min/max plus a KLL sketch, per distinct slot an HLL sketch (Spark's native
DataSketches aggregates, whose bytes the `datasketches` package reads). No state is
kept between batches: the store merges the partials, so Spark needs no state store.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from catalog import Catalog
from sketches import DEFAULT_K, DEFAULT_LG_K


def pane_ms_column(catalog: Catalog) -> Column:
    """The pane size of each row's stream, as a literal CASE expression."""
    expr = None
    for name, stream in catalog.streams.items():
        expr = (F.when if expr is None else expr.when)(F.col("stream") == name, F.lit(stream.pane))
    return expr.otherwise(F.lit(None)) if expr is not None else F.lit(None)


def partial_aggregates(df: DataFrame, catalog: Catalog, *, lg_k: int = DEFAULT_LG_K, kll_k: int = DEFAULT_K) -> DataFrame:
    width_vals = max((len(s.values) for s in catalog.streams.values()), default=0)
    width_ids = max((len(s.distinct_fields) for s in catalog.streams.values()), default=0)
    pane_ms = pane_ms_column(catalog)
    rows = df.withColumn("pane_start", F.col("event_time") - F.pmod(F.col("event_time"), pane_ms))
    aggs = [F.count(F.lit(1)).alias("count"), F.max("event_time").alias("max_event_time")]
    for i in range(width_vals):
        # get() yields null past the end of a shorter stream's array (no ANSI error).
        v = F.get(F.col("vals"), i)
        aggs += [
            F.count(v).alias(f"n_{i}"),
            F.sum(v).alias(f"sum_{i}"),
            F.min(v).alias(f"min_{i}"),
            F.max(v).alias(f"max_{i}"),
            F.kll_sketch_agg_double(v, kll_k).alias(f"kll_{i}"),
        ]
    for j in range(width_ids):
        aggs.append(F.hll_sketch_agg(F.get(F.col("ids"), j), lg_k).alias(f"hll_{j}"))
    return rows.groupBy("stream", "pane_start", "dims").agg(*aggs)
