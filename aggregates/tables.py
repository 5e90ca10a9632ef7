"""Changelog tables in the pipeline: each batch's newest change per key, for the store's table_rows.

The change records of a table stream (ingest/tables.py) are aggregated into panes like any
stream's events (their counts per `op` are the table's change stream), and besides that the
newest change of each key in the batch is picked on the executors (max_by over the log order)
and written with the batch (store/table_state.py): the table's current rows, exactly once.
Every change the source could read counts, also one the panes dead-letter as too old: a table's
rows do not expire (a compacted log keeps a row of years ago, and replaying it must give it back).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from aggregates.driver_batch import among
from aggregates.driver_rules import stream_is
from catalog import Catalog, StreamDef
from catalog.tables import DELETE, OP_FIELD, row_columns
from store.table_state import TableChange


class TableChanges:
    def __init__(self, catalog: Catalog):
        self.tables = {name: s for name, s in catalog.streams.items() if s.kind == "table"}

    @property
    def enabled(self) -> bool:
        return bool(self.tables)

    def process(self, batch: DataFrame, *, streams: Collection[str] | None = None,
                on_driver: bool = False) -> dict[str, dict[str, TableChange]]:
        """Per table and key: the batch's newest change (a Spark job over the batch's table rows).
        `streams`: those with records in the batch (None: unknown); the other tables have none.
        `on_driver`: the batch is an Arrow table on the driver (aggregates/driver_batch.py): the
        newest change per key is picked here, as `max_by` orders them, with no Spark job."""
        tables = among(self.tables, streams)
        if not tables:
            return {}
        if on_driver:
            return self._newest_on_driver(batch, tables)
        key = None
        for name in tables:
            stream = self.tables[name]
            at = F.col("ids")[stream.distinct_fields.index(stream.key_field)]
            key = F.when(F.col("stream") == name, at) if key is None else key.when(F.col("stream") == name, at)
        newest = (
            batch.where(F.col("stream").isin(tables) & F.col("error").isNull())
            .select("stream", key.alias("key"), "dims", "vals", "event_time", "partition", "offset", "ingest_time")
            .where(F.col("key").isNotNull())
            .groupBy("stream", "key")
            .agg(F.max_by(F.struct("dims", "vals", "event_time", "partition", "offset", "ingest_time"),
                          F.struct("ingest_time", "offset")).alias("last"))
        )
        out: dict[str, dict[str, TableChange]] = {}
        for row in newest.collect():
            last = row["last"]
            out.setdefault(row["stream"], {})[row["key"]] = change_of(
                self.tables[row["stream"]], last["dims"], last["vals"], last["event_time"], last["partition"],
                last["offset"], last["ingest_time"])
        return out

    def _newest_on_driver(self, batch: pa.Table, tables: list[str]) -> dict[str, dict[str, TableChange]]:
        changes = batch.filter(pc.and_(stream_is(batch.column("stream"), tables), batch.column("error").is_null()))
        rows = changes.select(["stream", "ids", "dims", "vals", "event_time", "partition", "offset",
                               "ingest_time"]).to_pylist()
        newest: dict[tuple[str, str], tuple] = {}
        for r in rows:
            stream = self.tables[r["stream"]]
            at = stream.distinct_fields.index(stream.key_field)
            key = r["ids"][at] if r["ids"] is not None and at < len(r["ids"]) else None
            if key is None:
                continue
            # max_by's order: struct(ingest_time, offset), a null field before any value
            order = (r["ingest_time"] is not None, r["ingest_time"] or 0, r["offset"])
            held = newest.get((r["stream"], key))
            if held is None or order > held[0]:
                newest[(r["stream"], key)] = (order, r)
        out: dict[str, dict[str, TableChange]] = {}
        for (name, key), (_, r) in newest.items():
            out.setdefault(name, {})[key] = change_of(self.tables[name], r["dims"], r["vals"], r["event_time"],
                                                      r["partition"], r["offset"], r["ingest_time"])
        return out


def change_of(stream: StreamDef, dims, vals, event_time_ms: int, partition: int, offset: int,
              ingest_time_ms: int | None = None) -> TableChange:
    """A source row of a table (dims and vals in the declared order) as the change of its key's row."""
    by_dim: Mapping[str, str] = dict(zip(stream.dimensions, dims or (), strict=False))
    if by_dim.get(OP_FIELD) == DELETE:
        return TableChange(None, event_time_ms, partition, offset, ingest_time_ms)
    strings, numbers = row_columns(stream)
    row = {name: by_dim.get(name, "") for name in strings}
    row.update(zip(numbers, vals or (), strict=False))
    return TableChange(row, event_time_ms, partition, offset, ingest_time_ms)
