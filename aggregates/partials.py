"""Per-batch partial aggregation and dead-letter classification, run on the executors.

Every source row first gets a dead-letter reason or null (`dead_letter_reason_column`, the
rule of `aggregates.eventtime`). Good rows are assigned to their event-time pane and grouped
by (stream, pane start, dimension values); per group: the count, the newest event time, and
per value slot n/sum/min/max plus a KLL sketch, per distinct slot an HLL sketch (Spark's
native DataSketches aggregates, whose bytes the `datasketches` package reads). Dead rows go
through the same aggregation, one group per (stream, reason): its count is the per-reason
count, computed on the executors, and a collect_list carries the (few) dead records to the
driver. So a batch is one Spark job and one collect, and dead records cannot move the
watermark (their newest event time belongs to their own group, which is no pane). No state is kept between batches: the store
merges the partials, so Spark needs no state store.

`arrow_partial_aggregates` gives the same rows another way (`PipelineConfig.partials: arrow`): the
dead-letter reason and the pane start computed here, then a numpy group-by per partition
(aggregates/arrow_partials.py) instead of Spark's object aggregates, which cost ~80-100 us per
group: a backfill, whose events spread over a day, has about one group per event.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Collection, Sequence

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from aggregates.driver_batch import among, arrow_on_driver, no_records
from aggregates.eventtime import BEYOND_RETENTION, FUTURE_SKEW, MISSING_EVENT_ID, UNPARSEABLE
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
    """Null for a row to merge, else its dead-letter reason (see aggregates.eventtime). The
    same Column for the same catalog object and instant: half a dozen steps of a batch ask for
    it. Its per-stream CASEs (a few hundred calls into the JVM) are built once per catalog; only
    the instant's comparisons are new each batch (a small batch's driver time, not its rows')."""
    key = (id(catalog), batch_now_ms)
    with _DEAD_LETTER_LOCK:
        kept = _DEAD_LETTER_COLUMNS.get(key)
        if kept is not None and kept[0] is catalog:
            return kept[1]
        column = _dead_letter_reason_column(catalog, batch_now_ms)
        if len(_DEAD_LETTER_COLUMNS) >= 8:  # the current batch's, and a reprocess run's beside it
            _DEAD_LETTER_COLUMNS.pop(next(iter(_DEAD_LETTER_COLUMNS)))
        _DEAD_LETTER_COLUMNS[key] = (catalog, column)
        return column


_DEAD_LETTER_COLUMNS: dict[tuple[int, int], tuple[Catalog, Column]] = {}  # (id(catalog), now) -> the column
_DEAD_LETTER_LOCK = threading.Lock()  # a reprocess run's batches may ask from another thread


def merged_records(batch: DataFrame, catalog: Catalog, batch_now_ms: int, streams: Sequence[str],
                   columns: Sequence[str], *, present: Collection[str] | None, on_driver: bool,
                   rows=None) -> pa.Table:
    """`columns` of the batch's records of `streams` that it merges (not dead-lettered), as Arrow:
    what the window joins and the patterns read. `present`: the streams with records in a small
    batch (None: unknown), the others skipped without a call into the JVM; on the driver collected
    from its local rows (no Spark job), or projected from `rows` (aggregates/driver_rows.py
    DriverRows: the batch collected once for every step)."""
    reading = among(streams, present)
    if not reading:
        return no_records(columns)
    if rows is not None:
        return rows.merged(reading, columns)
    records = (batch.where(F.col("stream").isin(reading) & dead_letter_reason_column(catalog, batch_now_ms).isNull())
               .select(*columns))
    return arrow_on_driver(records) if on_driver else records.toArrow()


def per_catalog(catalog: Catalog, what: str, build: Callable[[], object]) -> object:
    """`build()` once per catalog object (and Spark context: a Column holds a reference into its
    JVM): Column expressions are unresolved, so the same ones serve every batch's DataFrame, and
    building them is calls into the JVM, a small batch's main cost."""
    context = SparkContext._active_spark_context
    key = (id(catalog), id(context), what)
    with _PER_CATALOG_LOCK:
        kept = _PER_CATALOG.get(key)
        if kept is not None and kept[0] is catalog and kept[1] is context:
            return kept[2]
    value = build()
    with _PER_CATALOG_LOCK:
        if len(_PER_CATALOG) >= 64:  # catalogs come and go (patterns defined through the API, tests)
            _PER_CATALOG.pop(next(iter(_PER_CATALOG)))
        _PER_CATALOG[key] = (catalog, context, value)
    return value


_PER_CATALOG: dict[tuple[int, int, str], tuple[Catalog, object, object]] = {}  # -> (catalog, context, value)
_PER_CATALOG_LOCK = threading.Lock()  # not the dead-letter lock: that one is held while building from here


def _dead_letter_reason_column(catalog: Catalog, batch_now_ms: int) -> Column:
    reason, retention, skew, beyond, future, none = per_catalog(catalog, "dead letter parts",
                                                                lambda: _dead_letter_parts(catalog))
    event_time = F.col("event_time")
    return (
        reason.when(event_time < F.lit(batch_now_ms) - retention, beyond)
        .when(event_time > F.col("ingest_time") + skew, future)
        .otherwise(none)
    )


def _dead_letter_parts(catalog: Catalog) -> tuple[Column, ...]:
    """What the dead-letter reason is made of, but for the batch's instant."""
    retention = per_stream(catalog, lambda s: s.retention)
    skew = per_stream(catalog, lambda s: s.max_future_skew)
    event_time, ingest_time = F.col("event_time"), F.col("ingest_time")
    reason = (
        F.when(F.col("error").isNotNull(), F.coalesce(F.col("error_kind"), F.lit(UNPARSEABLE)))
        .when(event_time.isNull() | ingest_time.isNull(), F.lit(UNPARSEABLE))
    )
    missing_id = event_id_missing_column(catalog)
    if missing_id is not None:
        reason = reason.when(missing_id, F.lit(MISSING_EVENT_ID))
    return reason, retention, skew, F.lit(BEYOND_RETENTION), F.lit(FUTURE_SKEW), F.lit(None).cast("string")


def event_id_column(stream: StreamDef) -> Column:
    """A row's event id (null when it has none), for a stream that declares event_id_field."""
    return F.get(F.col("ids"), stream.source_ids.index(stream.event_id_field))


def event_id_missing_column(catalog: Catalog) -> Column | None:
    """True for a row of a stream with an event_id_field that carries no id; None (no
    expression at all, so streams without event ids pay nothing) when no stream declares one."""
    cases = [(F.col("stream") == s.name) & event_id_column(s).isNull()
             for s in catalog.streams.values() if s.event_id_field]
    if not cases:
        return None
    out = cases[0]
    for case in cases[1:]:
        out = out | case
    return out


def partial_aggregates(df: DataFrame, catalog: Catalog, *, batch_now_ms: int, lg_k: int = DEFAULT_LG_K,
                       kll_k: int = DEFAULT_K) -> DataFrame:
    """One row per (stream, pane, dims) of good records (dead_reason null), with its count, newest
    event time overall and per log partition (`partition_max_event_time`), and one row per
    (stream, dead_reason) whose `count` is the number of records dead-lettered for that reason
    and whose `dead_records` lists them (partition, offset, event_time, ingest_time, error, dims)."""
    rows = _keyed(df, catalog, batch_now_ms)
    _, _, aggs = per_catalog(catalog, f"partial aggregates {lg_k} {kll_k}", lambda: _aggregations(catalog, lg_k, kll_k))
    return (
        rows.groupBy("stream", "dead_reason", "pane_start", "g_dims")
        .agg(*aggs)
        .withColumnRenamed("g_dims", "dims")
    )


PARTIALS = ("arrow", "spark")  # PipelineConfig.partials: how a batch's partial aggregates are computed


ARROW_MERGES = ("shuffle", "driver", "rows")  # how the Arrow path brings a group's rows or partials together


def arrow_partial_aggregates(df: DataFrame, catalog: Catalog, *, batch_now_ms: int, lg_k: int = DEFAULT_LG_K,
                             kll_k: int = DEFAULT_K, merge: str = "shuffle") -> DataFrame:
    """What `partial_aggregates` gives (same columns, same groups and aggregates), computed by an
    Arrow group-by (aggregates/arrow_partials.py) instead of Spark's object aggregates. Like
    Spark's groupBy, on the map side first: each input partition's rows grouped where they are
    (no shuffle of rows), then (`merge`) "shuffle": the partials hashed by (stream, pane start) to
    the shuffle's partitions (a group's partials, and a stream's dead ones whose pane start is
    null, whole in one of them) and merged there; "driver": the partials as they are (several
    rows per group: `arrow_partials_table` merges them after toArrow); "rows": no map side, every
    row hashed by (stream, pane start) and grouped after the shuffle (the first version, kept for
    bench.arrow_partials)."""
    from aggregates.arrow_partials import group_batches, merge_batches

    if merge not in ARROW_MERGES:
        raise ValueError(f"merge must be one of {', '.join(ARROW_MERGES)}, not {merge!r}")
    layout = catalog_layout(catalog, lg_k, kll_k)
    rows = arrow_input(df, catalog, batch_now_ms=batch_now_ms)
    if merge == "rows":
        rows = rows.repartition("stream", "pane_start")
    partials = rows.mapInArrow(functools.partial(group_batches, layout=layout), layout.ddl())
    if merge != "shuffle":
        return partials
    return (partials.repartition("stream", "pane_start")
            .mapInArrow(functools.partial(merge_batches, layout=layout), layout.ddl()))


def arrow_partials_table(df: DataFrame, catalog: Catalog, *, batch_now_ms: int, lg_k: int = DEFAULT_LG_K,
                         kll_k: int = DEFAULT_K, merge: str = "shuffle") -> pa.Table:
    """`arrow_partial_aggregates` collected as Arrow: one row per group (with merge "driver", the
    map side's partials merged here, on the driver)."""
    from aggregates.arrow_partials import merge_partials

    table = arrow_partial_aggregates(df, catalog, batch_now_ms=batch_now_ms, lg_k=lg_k, kll_k=kll_k,
                                     merge=merge).toArrow()
    return merge_partials(table, catalog_layout(catalog, lg_k, kll_k)) if merge == "driver" else table


def arrow_input(df: DataFrame, catalog: Catalog, *, batch_now_ms: int) -> DataFrame:
    """The rows the Arrow group-by reads: the dead-letter reason and pane start computed here, by
    Spark (the one rule), and a dead record's fields as one struct, null for a row that is merged."""
    columns = per_catalog(catalog, "arrow partials input", _arrow_columns)
    return _keyed(df, catalog, batch_now_ms).select(*columns)


ARROW_INPUT_COLUMNS = ("stream", "dead_reason", "pane_start", "dims", "event_time", "partition", "vals", "ids",
                       "clock_correction", "dead_record")


def _arrow_columns() -> list[Column]:
    return ["stream", "dead_reason", "pane_start", F.col("g_dims").alias("dims"), "event_time", "partition", "vals",
            "ids", "clock_correction", _dead_record()]


def _dead_record() -> Column:
    return F.when(F.col("dead_reason").isNotNull(), F.struct(
        F.col("partition"), F.col("offset"), F.col("event_time"), F.col("ingest_time"), F.col("error"),
        F.col("dims"), F.col("raw_event_time"), F.col("clock_correction"),
    )).alias("dead_record")


def catalog_layout(catalog: Catalog, lg_k: int, kll_k: int):
    """The Arrow group-by's slot widths for `catalog` (the same as `_aggregations`')."""
    from aggregates.arrow_partials import Layout

    return Layout(values=max((len(s.values) for s in catalog.streams.values()), default=0),
                  distincts=max((len(s.distinct_fields) for s in catalog.streams.values()), default=0),
                  partitions=max((s.partitions for s in catalog.streams.values()), default=0),
                  kll_k=kll_k, lg_k=lg_k)


def _keyed(df: DataFrame, catalog: Catalog, batch_now_ms: int) -> DataFrame:
    """`df`'s rows with their dead-letter reason, pane start and grouping dims (null for a dead row)."""
    if "clock_correction" not in df.columns:  # no device clock step ran (aggregates/device_clocks.py)
        df = df.withColumns({"raw_event_time": F.col("event_time"), "clock_correction": F.lit(None).cast("bigint")})
    rows = df.withColumn("dead_reason", dead_letter_reason_column(catalog, batch_now_ms))
    pane_start, g_dims = per_catalog(catalog, "pane start and grouping dims", lambda: _pane_and_dims(catalog))
    return rows.withColumns({"pane_start": pane_start, "g_dims": g_dims})


def _pane_and_dims(catalog: Catalog) -> tuple[Column, Column]:
    good = F.col("dead_reason").isNull()
    pane_ms = pane_ms_column(catalog)
    return F.when(good, F.col("event_time") - F.pmod(F.col("event_time"), pane_ms)), F.when(good, F.col("dims"))


def _aggregations(catalog: Catalog, lg_k: int, kll_k: int) -> tuple[Column, Column, list[Column]]:
    """The pane start and grouping dims of each row, and the aggregations, for `catalog`."""
    width_vals = max((len(s.values) for s in catalog.streams.values()), default=0)
    width_ids = max((len(s.distinct_fields) for s in catalog.streams.values()), default=0)
    width_parts = max((s.partitions for s in catalog.streams.values()), default=0)
    good = F.col("dead_reason").isNull()
    pane_start, g_dims = _pane_and_dims(catalog)
    # Dead records sit in their own groups (their reason is part of the key), so they add to
    # no pane and to no pane's newest event time: the watermark ignores them.
    aggs = [
        F.count(F.lit(1)).alias("count"),
        F.max("event_time").alias("max_event_time"),
        # The newest event time per log partition (slot k = partition k), for the per-partition
        # watermarks (store/watermarks.py): a few max() buffers, so the batch stays one job.
        F.array(*[F.max(F.when(F.col("partition") == k, F.col("event_time"))) for k in range(width_parts)])
        .alias("partition_max_event_time"),
        # collect_list skips nulls: empty for good groups, the (few) dead records otherwise.
        F.collect_list(F.when(~good, F.struct(
            F.col("partition"), F.col("offset"), F.col("event_time"), F.col("ingest_time"), F.col("error"),
            F.col("dims"), F.col("raw_event_time"), F.col("clock_correction"),
        ))).alias("dead_records"),
        # Records whose event time a device clock offset shifted (the batch's log line says how many).
        F.count(F.when(F.col("clock_correction").isNotNull(), F.lit(1))).alias("clock_corrected"),
    ]
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
    return pane_start, g_dims, aggs
