"""Enrichment (stream-table join) in the pipeline: each event of a stream with `enrich` gets its
table columns as dimensions, looked up as of the event's time (store/table_versions.py), inside
the batch's exactly-once commit.

Per batch, on the driver: the batch's own changes of the enriching tables are collected (a table
changes slowly: a few rows per batch) and merged with the versions the store kept. The lookup runs
on the executors: a broadcast hash join of the batch with a DataFrame key -> its versions in order,
then per event the newest version valid at its lookup time (an array filter: no shuffle, no Python
per event). The enriched values replace the stream's enriched dimension slots before the panes are
aggregated, so everything downstream (panes, tiers, joins, queries) sees ordinary dimensions. The
new versions, the pruning horizon and the misses (events whose key had no row then: "" and a count,
never a drop) go into the batch's transaction. A batch held on the driver (aggregates/driver_batch.py)
is looked up in Python instead, by the same rule (aggregates/enrichment_driver.py): no Spark job
and few calls into the JVM.

Through a view (catalog/views.py, docs/tables.md "Enrichment through a view"): the same lookup in
the view's left table, then in its right table by the foreign key the left version holds, both as
of the event's lookup time (the view as of a time is the join of its tables as of that time;
aggregates/view_join.py `joined_as_of` is the pure rule). Only the tables' versions are kept.

Kept across batches (docs/tables.md, "What a batch pays"): the versions on the driver
(store/table_versions.py KeptVersions, as of the store's last committed batch id, else read
again), and per table a persisted lookup DataFrame of them (`LookupBase`) that is reused: a batch
replaces only the rows of the keys changed since it was built and of its own changes, made from the
driver's copy; it is built again when those pass `REBUILD_AFTER`. Reading the whole table from the
store and making a DataFrame of it in Python was most of the step's time (the bench/enrichment.py
figures in docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from aggregates.batch_ids import BatchIds
from aggregates.driver_batch import among
from aggregates.driver_rows import DriverRows
from aggregates.driver_rules import list_get, stream_is
from aggregates.enrichment_driver import MISSING, enrich_table, plan as driver_plan, text as _text
from aggregates.partials import dead_letter_reason_column, per_catalog
from aggregates.tables import change_of
from catalog import Catalog, StreamDef
from catalog.enrichment import enrichment_tables, enrichment_view
from catalog.tables import row_columns
from store import PaneStore
from store.table_versions import EnrichmentCommit, KeptVersions, TableVersion, by_key


_VERSIONS = T.ArrayType(T.StructType([
    T.StructField("from_ms", T.LongType()),
    T.StructField("found", T.BooleanType()),  # False: the key was deleted from then on
    T.StructField("cols", T.ArrayType(T.StringType())),  # the table's string columns, in row_columns order
]))


# A table's lookup DataFrame is made again from the driver's copy once this many of its keys have
# changed since it was made (they ride along, made in Python, with every batch until then): a few
# per batch in the demo, so hours; a bulk load of the table rebuilds it at the next batch.
REBUILD_AFTER = 2_000

@dataclass
class LookupBase:
    """A table's lookup DataFrame as made from the kept versions at some batch, persisted and reused,
    and the keys whose versions changed since (their rows are replaced by the driver's)."""

    frame: DataFrame
    changed: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Enriched:
    batch: DataFrame | pa.Table  # the batch with the enriched dimensions set (Arrow: a small batch on the driver)
    cached: DataFrame | None  # what `batch` reads from, persisted: unpersist when the batch is done
    commit: EnrichmentCommit
    rows: DriverRows | None = None  # on the driver: the enriched batch collected once for the later steps


class Enrichment:
    def __init__(self, spark: SparkSession, catalog: Catalog, store: PaneStore, *, keep_versions: bool = True):
        """keep_versions False: read every version from the store and make the lookup DataFrame
        from them every batch (the reference the kept path is compared with: tests, the bench)."""
        self.spark = spark
        self.catalog = catalog
        self.store = store
        self.streams = {name: s for name, s in catalog.streams.items() if s.enrich}
        # The changelog tables looked up: an enrichment's table, or both tables of its view.
        self.tables = {t: catalog.streams[t] for s in self.streams.values() for d in s.enrich
                       for t in enrichment_tables(catalog, d, s.name)}
        self.kept = KeptVersions(store.table_versions, self.tables) if keep_versions else None
        self.bases: dict[str, LookupBase] = {}
        self.timings: dict[str, float] = {}  # the last batch's step, in seconds per part (logs, the bench)

    @property
    def enabled(self) -> bool:
        return bool(self.streams)

    def process(self, batch: DataFrame, batch_now_ms: int, last_batch_id: int | None = None, *,
                on_driver: bool = False, streams: Collection[str] | None = None) -> Enriched:
        """`batch` (read more than once: pass it persisted) with its enriched dimensions, and what
        the batch's commit writes. `last_batch_id`: the store's last committed batch of the
        pipeline (the kept versions must be as of it). `on_driver`: the batch is a LocalRelation
        (aggregates/driver_batch.py): its rows are looked up in Python (aggregates/enrichment_driver.py)
        and made local rows again, nothing is persisted, so the step and every later collect of
        the batch run no Spark job. `streams`: those with records in the
        batch (None: unknown); the others (enriched streams and tables) are skipped."""
        started = time.perf_counter()
        enriching = among(self.streams, streams)
        new = self.batch_versions(batch, among(self.tables, streams))
        collected = time.perf_counter()
        versions = None
        if self.kept is None:
            versions = {name: by_key([*self.store.table_versions(name), *new.get(name, ())]) for name in self.tables}
        elif self.kept.as_of_store(last_batch_id):
            self.drop_bases()  # made from a copy that was not the store's
        read = time.perf_counter()
        if not enriching:  # no enriched stream has records: nothing to look up, the batch as it is
            out, miss_columns, ids = batch, [], None
            made = read
        elif on_driver:  # looked up in Python over the batch's rows (aggregates/enrichment_driver.py)
            made = read
            out, miss_columns, ids = self.enrich_on_driver(batch, new, versions, enriching)
        else:
            if versions is not None:
                frames = {name: self.versions_frame(self.tables[name], versions[name]) for name in self.tables}
            else:
                frames = {name: self.lookup_frame(name, new.get(name, ())) for name in self.tables}
            made = time.perf_counter()
            stages, miss_columns = per_catalog(self.catalog, f"enrichment stages {enriching}",
                                               lambda: self.stages(enriching))
            out, ids = self.run_stages(batch, stages, frames).persist(), None
        rows = DriverRows(out, self.catalog, batch_now_ms, ids=ids) if on_driver else None
        misses = self.count_misses(out, miss_columns, batch_now_ms, rows=rows)
        if on_driver:
            out_batch = out.drop_columns([m for _, m in miss_columns])
        else:
            out_batch = out.drop(*[m for _, m in miss_columns]) if miss_columns else out
        done = time.perf_counter()
        self.timings = {"changes": collected - started, "versions": read - collected, "frame": made - read,
                        "lookup": done - made, "step": done - started}
        # An accepted event's lookup time (the earlier of its event time and its append time) is at
        # least now - retention - max_future_skew: an event stamped up to max_future_skew ahead of
        # its append is accepted while its time is within retention, though its append is older.
        keep_from = {name: batch_now_ms - max(s.retention + s.max_future_skew for s in self.streams.values()
                                              if any(name in enrichment_tables(self.catalog, d, s.name) for d in s.enrich))
                     for name in self.tables}
        # The kept copy knows which keys pruning shortens at keep_from: the store prunes only those.
        prune_keys = None if self.kept is None else {
            name: self.kept.prune_candidates(name, new.get(name, ()), keep_from[name]) for name in self.tables}
        return Enriched(out_batch, None if on_driver else out,
                        EnrichmentCommit({name: [(k, v) for k, v in pairs] for name, pairs in new.items()},
                                         keep_from, misses, prune_keys), rows)

    def stages(self, enriching: list[str]) -> tuple[list[tuple], list[tuple[tuple[str, str], str]]]:
        """The lookups' projection over the batch for the `enriching` streams, as steps that
        `run_stages` applies in order: ("with", {name: Column}), ("drop", names) and ("lookup",
        table, key, tag), the one step that reads the batch's lookup frame. Depends
        on the catalog only, so it is built once per catalog: a small batch's driver time is these
        calls into the JVM. Also the miss flag columns, ((stream, table), column) each."""
        steps: list[tuple] = [("with", {"_at": F.least(F.col("event_time"), F.col("ingest_time"))})]
        miss_columns: list[tuple[tuple[str, str], str]] = []

        def hit(table: str, key: Column, tag: str) -> tuple[Column, Column]:
            """The version of `table` valid at each row's `_at` for `key`: whether the key had a row
            then (`{tag}found`) and its string columns (`{tag}vs`: the key's versions, null without a row)."""
            steps.append(("lookup", table, key, tag))
            hits = F.filter(F.col(f"{tag}vs"), lambda v: v["from_ms"] <= F.col("_at"))
            last = F.get(hits, F.size(hits) - 1)
            steps.append(("with", {f"{tag}found": F.coalesce(last["found"], F.lit(False)), f"{tag}cols": last["cols"]}))
            steps.append(("drop", (f"{tag}key", f"{tag}k", f"{tag}vs")))
            return F.col(f"{tag}found"), F.col(f"{tag}cols")

        for name in enriching:
            stream = self.streams[name]
            for i, decl in enumerate(stream.enrich):
                key = F.when(F.col("stream") == name, F.get(F.col("ids"), stream.source_ids.index(decl.by)))
                view = enrichment_view(self.catalog, decl, name)  # as stored for a pinned stream
                if view is None:
                    found, cols = hit(decl.table, key, "_l")
                    names = row_columns(self.tables[decl.table])[0]
                    values = {c: _column(found, cols, names.index(c)) for c in decl.columns}
                    complete = found
                else:  # through a view: the left row as of the event's time, then the right row it names then
                    found, cols = hit(view.left, key, "_l")
                    names = row_columns(self.tables[view.left])[0]
                    if view.foreign_key is None:
                        right_key = key
                    else:
                        fk = F.get(cols, names.index(view.foreign_key))
                        right_key = F.when(found & (fk != F.lit(MISSING)), fk)
                    right_found, right_cols = hit(view.right, right_key, "_r")
                    right_names = row_columns(self.tables[view.right])[0]
                    row = found & (right_found | F.lit(view.kind == "left"))  # the view has a row for the key then
                    values = {c: _column(row, cols, names.index(c)) if c in names
                              else _column(row & right_found, right_cols, right_names.index(c)) for c in decl.columns}
                    complete = found & right_found
                miss = f"_miss_{name}_{i}"
                steps.append(("with", {"dims": self.with_dims(stream, values), miss: (F.col("stream") == name) & ~complete}))
                steps.append(("drop", ("_lfound", "_lcols", "_rfound", "_rcols")))
                miss_columns.append(((name, decl.table), miss))
        steps.append(("drop", ("_at",)))
        return steps, miss_columns

    @staticmethod
    def run_stages(batch: DataFrame, stages: list[tuple], frames: dict[str, DataFrame]) -> DataFrame:
        """`stages` (see `stages`) applied to `batch`; `frames` the batch's lookup frames (a broadcast
        left join)."""
        out = batch
        for stage in stages:
            if stage[0] == "with":
                out = out.withColumns(stage[1])
            elif stage[0] == "drop":
                out = out.drop(*stage[1])
            else:
                _, table, key, tag = stage
                lookup = frames[table].withColumnsRenamed({"key": f"{tag}k", "_vs": f"{tag}vs"})
                out = (out.withColumn(f"{tag}key", key)
                       .join(F.broadcast(lookup), F.col(f"{tag}key") == F.col(f"{tag}k"), "left"))
        return out

    def lookup_frame(self, table: str, new: list[tuple[str, TableVersion]]) -> DataFrame:
        """key -> versions of `table` as the store's plus the batch's `new` ones: the persisted
        base with the rows of the keys changed since it was made, and of the batch's, replaced."""
        kept, stream = self.kept.versions[table], self.tables[table]
        new_keys = {k for k, _ in new}
        base = self.bases.get(table)
        if base is not None and len(base.changed | new_keys) > REBUILD_AFTER:
            self.bases.pop(table).frame.unpersist()
            base = None
        if base is None:
            if len(new_keys) > REBUILD_AFTER:  # a bulk change (the table's first load): whole, and a base next time
                return self.versions_frame(stream, {**kept, **self.kept.with_batch(table, new_keys, new)})
            base = self.bases[table] = LookupBase(self.versions_frame(stream, kept).persist())
        keys = base.changed | new_keys
        if not keys:
            return base.frame
        replaced = self.versions_frame(stream, self.kept.with_batch(table, keys, new))
        return base.frame.join(F.broadcast(replaced.select("key")), "key", "left_anti").unionByName(replaced)

    def enrich_on_driver(self, batch: pa.Table, new: dict[str, list[tuple[str, TableVersion]]],
                         versions: dict[str, dict[str, list[TableVersion]]] | None,
                         enriching: list[str]) -> tuple[pa.Table, list[tuple[tuple[str, str], str]], BatchIds]:
        """`batch` (an Arrow table on the driver) enriched in Python (aggregates/enrichment_driver.py),
        with its miss flag columns, and its ids encoded (for the steps after it: DriverRows);
        the versions of the keys it looks up from the driver's copy and the batch's `new` ones
        (or from `versions`, read from the store)."""
        lookups = per_catalog(self.catalog, f"driver lookups {enriching}",
                              lambda: driver_plan(self.catalog, self.streams, self.tables, enriching))

        def fetch(table: str, keys: set[str]) -> dict[str, list[TableVersion]]:
            if versions is not None:
                return {k: versions[table][k] for k in keys if k in versions[table]}
            return self.kept.with_batch(table, keys, new.get(table, ()))

        def singles(table: str, asked: int):
            if versions is not None:
                return None
            return self.kept.singles(table, (key for key, _ in new.get(table, ())), asked=asked)

        rows = batch.combine_chunks()
        ids = BatchIds.of(rows.column("ids"))
        dims, misses = enrich_table(rows, lookups, fetch, singles, encoded_ids=ids)
        at = rows.schema.get_field_index("dims")
        rows = rows.set_column(at, rows.schema.field(at), dims)
        for lookup in lookups:
            rows = rows.append_column(lookup.miss, misses[lookup.miss])
        return rows, [((lookup.stream, lookup.declared), lookup.miss) for lookup in lookups], ids

    def committed(self, batch_id: int, enriched: Enriched) -> None:
        """Batch `batch_id` is in the store: the kept versions take its changes and pruning."""
        if self.kept is None:
            return
        for table, keys in self.kept.committed(batch_id, enriched.commit).items():
            if table in self.bases:
                self.bases[table].changed |= keys

    def forget(self) -> None:
        """A commit failed midway (the store may or may not have the batch): read it again next time."""
        if self.kept is not None:
            self.kept.forget()

    def drop_bases(self) -> None:
        for base in self.bases.values():
            base.frame.unpersist()
        self.bases = {}

    def batch_versions(self, batch: DataFrame, tables: list[str] | None = None) -> dict[str, list[tuple[str, TableVersion]]]:
        """The enriching tables' changes in this batch, each a version valid from its append time.
        `tables`: those with records in the batch (default: all)."""
        tables = list(self.tables) if tables is None else tables
        if not tables:
            return {}
        if isinstance(batch, pa.Table):
            return self._batch_versions_on_driver(batch, tables)
        where, columns, valid = per_catalog(self.catalog, f"enrichment changes of {tables}",
                                            lambda: self.change_columns(tables))
        rows = batch.where(where).select(*columns).where(valid).collect()
        out: dict[str, list[tuple[str, TableVersion]]] = {}
        for r in rows:
            change = change_of(self.tables[r["stream"]], r["dims"], r["vals"], r["event_time"], r["partition"],
                               r["offset"])
            out.setdefault(r["stream"], []).append(
                (r["key"], TableVersion(r["ingest_time"], r["partition"], r["offset"], change.row)))
        return out

    def _batch_versions_on_driver(self, batch: pa.Table, tables: list[str]) -> dict[str, list[tuple[str, TableVersion]]]:
        """`batch_versions` of an Arrow table on the driver: the same rows in the same order."""
        streams = batch.column("stream")
        key = pa.nulls(batch.num_rows, pa.string())
        for name in tables:
            table = self.tables[name]
            key = pc.if_else(stream_is(streams, [name]),
                             list_get(batch.column("ids"), table.distinct_fields.index(table.key_field)), key)
        changes = batch.append_column("key", key).filter(pc.and_(
            pc.and_(stream_is(streams, tables), batch.column("error").is_null()),
            pc.and_(pc.is_valid(key), batch.column("ingest_time").is_valid())))
        out: dict[str, list[tuple[str, TableVersion]]] = {}
        for r in changes.select(["stream", "key", "dims", "vals", "event_time", "ingest_time", "partition",
                                 "offset"]).to_pylist():
            change = change_of(self.tables[r["stream"]], r["dims"], r["vals"], r["event_time"], r["partition"],
                               r["offset"])
            out.setdefault(r["stream"], []).append(
                (r["key"], TableVersion(r["ingest_time"], r["partition"], r["offset"], change.row)))
        return out

    def change_columns(self, tables: list[str]) -> tuple[Column, list, Column]:
        """Which rows are changes of `tables`, what is read of them, and which have a key and a time."""
        key = None
        for name in tables:
            table = self.tables[name]
            at = F.get(F.col("ids"), table.distinct_fields.index(table.key_field))
            key = F.when(F.col("stream") == name, at) if key is None else key.when(F.col("stream") == name, at)
        return (F.col("stream").isin(tables) & F.col("error").isNull(),
                ["stream", key.alias("key"), "dims", "vals", "event_time", "ingest_time", "partition", "offset"],
                F.col("key").isNotNull() & F.col("ingest_time").isNotNull())

    def versions_frame(self, table: StreamDef, versions: dict[str, list[TableVersion]]) -> DataFrame:
        """key -> [(from_ms, found, cols)] in version order: the broadcast side of the lookup."""
        names = row_columns(table)[0]
        rows = [(key, [(v.valid_from_ms, v.row is not None,
                        None if v.row is None else [_text(v.row.get(c)) for c in names]) for v in vs])
                for key, vs in versions.items()]
        schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("_vs", _VERSIONS)])
        return self.spark.createDataFrame(rows, schema)

    @staticmethod
    def with_dims(stream: StreamDef, values: dict[str, Column]) -> Column:
        """The `dims` array of `stream`'s rows with the enriched slots set; other rows unchanged."""
        slots = [values.get(d, F.get(F.col("dims"), j)) for j, d in enumerate(stream.dimensions)]
        return F.when(F.col("stream") == stream.name, F.array(*slots)).otherwise(F.col("dims"))

    def count_misses(self, enriched: DataFrame, miss_columns, batch_now_ms: int, *,
                     rows: DriverRows | None = None) -> dict[tuple[str, str], int]:
        """Misses among the events merged into panes (a dead-lettered event is counted there).
        `rows`: the batch on the driver collected once, whose flags are summed here (nulls counting
        none); else one Spark aggregation."""
        if not miss_columns:
            return {}
        if rows is not None:
            row = rows.true_counts([m for _, m in miss_columns])
        else:
            merged = enriched.where(dead_letter_reason_column(self.catalog, batch_now_ms).isNull())
            row = merged.agg(*[F.sum(F.col(m).cast("long")).alias(m) for _, m in miss_columns]).first()
        out: Counter[tuple[str, str], int] = Counter()
        for pair, m in miss_columns:
            out[pair] += int(row[m] or 0)
        return dict(out)


def _column(found: Column, cols: Column, index: int) -> Column:
    """One enriched column: the row's value when `found`, else MISSING."""
    return F.when(found, F.coalesce(F.get(cols, index), F.lit(MISSING))).otherwise(F.lit(MISSING))
