"""Exact duplicate drops in a micro-batch, for streams that declare an `event_id_field`.

Before the batch is aggregated: the (stream, partition, offset, ingest time, event id) of its
records that would be merged are collected to the driver (one Arrow transfer), the ids are
looked up in the store's seen ids (one query per stream), aggregates/event_ids.py decides which
records are copies, and those are taken out of the batch (an anti-join with the few dropped
records, broadcast). The ids counted go into the batch's store commit (store/event_ids.py), in
the same transaction as its panes and batch id.

Why not Spark's dropDuplicatesWithinWatermark: its state expires by one global watermark, so
the records of a partition that lags (a replay, a catch-up) would be dropped as late, and its
state lives in the checkpoint, not in the store transaction that records the batch. Streams
without an event id add no job and no column: `enabled` is False when none declares one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from aggregates.driver_rules import dead_reasons, list_get, stream_is
from aggregates.event_ids import find_duplicates
from aggregates.partials import dead_letter_reason_column, event_id_column
from catalog import Catalog
from store import PaneStore
from store.event_ids import EventIdCommit


@dataclass(frozen=True)
class DedupedBatch:
    batch: DataFrame | pa.Table  # the batch without its duplicates (Arrow: a small batch on the driver)
    commit: EventIdCommit


class DuplicateFilter:
    def __init__(self, spark: SparkSession, catalog: Catalog, store: PaneStore):
        self.spark, self.catalog, self.store = spark, catalog, store
        self.windows = {name: s.dedup_window_ms for name, s in catalog.streams.items()
                        if s.event_id_field and not s.derived_from}
        self.enabled = bool(self.windows)

    def candidates(self, batch: DataFrame | pa.Table, batch_now_ms: int) -> pa.Table:
        """The records with an event id that the batch would merge (dead letters are not counted);
        of a batch on the driver (Arrow) by the same rule in Arrow (aggregates/driver_rules.py)."""
        if isinstance(batch, pa.Table):
            return self._candidates_on_driver(batch, batch_now_ms)
        event_id = None
        for name in self.windows:
            expr = event_id_column(self.catalog.streams[name])
            event_id = (F.when if event_id is None else event_id.when)(F.col("stream") == name, expr)
        return (
            batch.where(F.col("stream").isin(list(self.windows)) & dead_letter_reason_column(self.catalog, batch_now_ms).isNull())
            .select("stream", "partition", "offset", "ingest_time", event_id.alias("event_id"))
            .toArrow()
        )

    def _candidates_on_driver(self, batch: pa.Table, batch_now_ms: int) -> pa.Table:
        streams = batch.column("stream")
        event_id = pa.nulls(batch.num_rows, pa.string())
        for name in self.windows:
            stream = self.catalog.streams[name]
            ids = list_get(batch.column("ids"), stream.source_ids.index(stream.event_id_field))
            event_id = pc.if_else(stream_is(streams, [name]), ids, event_id)
        merged = pc.and_(stream_is(streams, self.windows), dead_reasons(batch, self.catalog, batch_now_ms).is_null())
        return (batch.select(["stream", "partition", "offset", "ingest_time"]).append_column("event_id", event_id)
                .filter(merged))

    def process(self, batch: DataFrame | pa.Table, batch_now_ms: int, *, on_driver: bool = False) -> DedupedBatch:
        """`batch` without the copies of event ids counted before; `on_driver`: an Arrow table of a
        small batch (aggregates/driver_batch.py), the copies filtered out in Arrow."""
        records = self.candidates(batch, batch_now_ms)
        stored = {}
        for stream in self.windows:
            ids = records.filter(pc.equal(records["stream"], stream))["event_id"]
            stored[stream] = self.store.seen_event_ids(stream, pc.unique(ids).to_pylist())
        dedup = find_duplicates(records, stored, self.windows)
        commit = EventIdCommit(self.windows, dedup.counted, dedup.duplicates, dedup.read_ingest_ms)
        if not dedup.dropped:
            return DedupedBatch(batch, commit)
        if on_driver:
            dropped = set(dedup.dropped)
            keys = zip(*(batch.column(c).to_pylist() for c in ("stream", "partition", "offset")), strict=True)
            return DedupedBatch(batch.filter(pa.array([k not in dropped for k in keys], pa.bool_())), commit)
        dropped = self.spark.createDataFrame(dedup.dropped, "stream string, partition int, offset bigint")
        kept = batch.join(F.broadcast(dropped), ["stream", "partition", "offset"], "left_anti").select(*batch.columns)
        return DedupedBatch(kept, commit)
