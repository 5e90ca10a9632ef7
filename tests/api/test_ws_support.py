"""A tiny in-process stand-in for the Spark pipeline, for websocket and browser tests: read
what the API appended to the log since the last committed offsets, aggregate it into pane
partials (exact count/n/sum/min/max, real KLL and HLL sketches), enrich streams with `enrich` from
their tables' versions as of each event's time (the pure lookup of store/table_versions.py that
aggregates/enrichment.py runs on Spark's executors), run the catalog's window joins and patterns
through the pipeline's own driver side (aggregates/joins.py, aggregates/patterns.py) and commit one
batch to the store, as the real pipeline's foreachBatch does. No tests here."""

from __future__ import annotations

import math
from collections import defaultdict

import pyarrow as pa

from aggregates.joins import WindowJoins, with_joins
from aggregates.patterns import PatternRunner, with_patterns
from catalog import Catalog
from catalog.tables import OP_FIELD, row_columns
from ingest.log import EventLog
from ingest.log.records import EVENT_TIME, INGEST_TIME, OFFSET
from sketches import HllSketch, KllSketch
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats, pane_start
from aggregates.view_join import joined_as_of
from aggregates.views import shape_of
from catalog.enrichment import enrichment_tables
from store.table_versions import EnrichmentCommit, TableVersion, as_of, by_key, lookup_time


def drain_log_into_store(catalog: Catalog, log: EventLog, store: PaneStore, now_ms: int,
                         pipeline: str = "main") -> int:
    """Commit everything in the log beyond the committed offsets as one batch; events committed."""
    progress = store.progress(pipeline)
    partials: list[PanePartial] = []
    end_offsets: dict[str, dict[int, int]] = {}
    max_event: dict[str, int] = {}
    joined_streams = {s for j in catalog.joins for s in (j.left.stream, j.right.stream)}
    join_records: list[tuple] = []  # (stream, partition, offset, time, dims, ids): what the pipeline collects
    patterns = PatternRunner(catalog, store)
    pattern_records: list[tuple] = []  # (stream, partition, offset, time, dims, vals, ids): the same, for patterns
    enrich = _Enrichment(catalog, log, store, progress)
    total = 0
    for stream in catalog.streams.values():
        groups: dict[tuple[int, tuple], list[dict]] = defaultdict(list)
        for partition, offsets in log.offsets(stream.name).items():
            start = progress.end_offsets.get(stream.name, {}).get(partition, offsets.start)
            if start >= offsets.end:
                continue
            end_offsets.setdefault(stream.name, {})[partition] = offsets.end
            for batch in log.read(stream, partition, start, offsets.end):
                for row in batch.to_pylist():
                    t = row[EVENT_TIME]
                    max_event[stream.name] = max(max_event.get(stream.name, t), t)
                    found = enrich.lookup(stream, row)
                    dims = tuple((d, found[d] if d in found else row.get(d) or "") for d in stream.dimensions)
                    groups[(pane_start(t, stream.pane), dims)].append(row)
                    if stream.name in joined_streams:
                        join_records.append((stream.name, partition, row[OFFSET], t, [v for _, v in dims],
                                             [row.get(f) for f in stream.source_ids]))
                    if stream.name in patterns.streams:
                        pattern_records.append((stream.name, partition, row[OFFSET], t, [v for _, v in dims],
                                                [row.get(f) for f in stream.values],
                                                [row.get(f) for f in stream.source_ids]))
        for (start, dims), rows in groups.items():
            values = {}
            for field in stream.values:
                xs = [r[field] for r in rows if r.get(field) is not None]
                if xs:
                    kll = KllSketch()
                    for x in xs:
                        kll.update(x)
                    values[field] = ValueStats(len(xs), math.fsum(xs), min(xs), max(xs), kll.to_bytes())
            distincts = {}
            for field in stream.distinct_fields:
                hll = HllSketch()
                for r in rows:
                    if r.get(field):
                        hll.update(r[field])
                distincts[field] = hll.to_bytes()
            partials.append(PanePartial(stream.name, start, start + stream.pane, dict(dims),
                                        PaneData(len(rows), values, distincts)))
            total += len(rows)
    if not end_offsets:
        return 0
    batch_id = 0 if progress.last_batch_id is None else progress.last_batch_id + 1
    lateness = {name: s.allowed_lateness for name, s in catalog.streams.items()}
    commit = BatchCommit(pipeline, batch_id, partials, total, max_event, end_offsets,
                         enrichment=enrich.commit(now_ms) if enrich.tables else None)
    if catalog.joins:
        joins = WindowJoins(catalog, store)
        commit = with_joins(commit, joins.join(join_table(join_records), commit, now_ms=now_ms), joins.names)
    if patterns.enabled:  # with the streams' watermarks stored before the batch, as the pipeline reads them
        matched = patterns.run(pattern_table(pattern_records), store.watermarks())
        commit = with_patterns(commit, matched, patterns.names)
    store.commit_batch(commit, lateness_ms=lateness, now_ms=now_ms)
    return total


def join_table(rows: list[tuple]) -> pa.Table:
    """The joined streams' records as the pipeline collects them (aggregates/joins.py)."""
    cols = list(zip(*rows)) if rows else [[]] * 6
    return pa.table({"stream": pa.array(cols[0], pa.string()), "partition": pa.array(cols[1], pa.int32()),
                     "offset": pa.array(cols[2], pa.int64()), "event_time": pa.array(cols[3], pa.int64()),
                     "dims": pa.array(cols[4], pa.list_(pa.string())), "ids": pa.array(cols[5], pa.list_(pa.string()))})


def pattern_table(rows: list[tuple]) -> pa.Table:
    """The patterns' streams' records as the pipeline collects them (aggregates/patterns.py)."""
    cols = list(zip(*rows)) if rows else [[]] * 7
    return pa.table({"stream": pa.array(cols[0], pa.string()), "partition": pa.array(cols[1], pa.int32()),
                     "offset": pa.array(cols[2], pa.int64()), "event_time": pa.array(cols[3], pa.int64()),
                     "dims": pa.array(cols[4], pa.list_(pa.string())), "vals": pa.array(cols[5], pa.list_(pa.float64())),
                     "ids": pa.array(cols[6], pa.list_(pa.string()))})


class _Enrichment:
    """The batch's enrichment, as aggregates/enrichment.py does it: the enriching tables' versions
    (the store's and the batch's own changes, each valid from its append time), the lookup per
    event as of min(event time, append time), and the misses. Every event is counted (the
    callers' events are inside the retention), as the pipeline counts those merged into panes."""

    def __init__(self, catalog: Catalog, log: EventLog, store: PaneStore, progress):
        self.streams = {name: s for name, s in catalog.streams.items() if s.enrich}
        self.catalog = catalog
        self.tables = {t for s in self.streams.values() for d in s.enrich for t in enrichment_tables(catalog, d)}
        self.retention = {t: max(s.retention for s in self.streams.values()
                                 if any(t in enrichment_tables(catalog, d) for d in s.enrich))
                          for t in self.tables}
        self.new: dict[str, list[tuple[str, TableVersion]]] = {}
        for name in self.tables:
            table = catalog.streams[name]
            columns = row_columns(table)
            for partition, offsets in log.offsets(name).items():
                start = progress.end_offsets.get(name, {}).get(partition, offsets.start)
                for batch in (log.read(table, partition, start, offsets.end) if start < offsets.end else ()):
                    for r in batch.to_pylist():
                        row = None if r.get(OP_FIELD) == "delete" else {
                            **{c: r.get(c) or "" for c in columns[0]}, **{c: r.get(c) for c in columns[1]}}
                        self.new.setdefault(name, []).append(
                            (r[table.key_field], TableVersion(r[INGEST_TIME], partition, r[OFFSET], row)))
        self.versions = {name: by_key([*store.table_versions(name), *self.new.get(name, ())]) for name in self.tables}
        self.misses: dict[tuple[str, str], int] = defaultdict(int)

    def lookup(self, stream, row: dict) -> dict[str, str]:
        """The enriched columns of one event of `stream` (none for a stream without `enrich`)."""
        out: dict[str, str] = {}
        for decl in stream.enrich:
            key = row.get(decl.by)
            at = lookup_time(row[EVENT_TIME], row[INGEST_TIME])
            view = self.catalog.views.get(decl.table)
            if view is not None:  # through a view: the join of its tables' rows as of then
                found, complete = joined_as_of(shape_of(self.catalog, view), key, self.versions[view.left].get(key, []),
                                               self.versions[view.right], at) if key else (None, False)
            else:
                found = as_of(self.versions[decl.table].get(key, []), at) if key else None
                complete = found is not None
            if not complete:
                self.misses[(stream.name, decl.table)] += 1
            for c in decl.columns:
                out[c] = "" if found is None else str(found.get(c) or "")
        return out

    def commit(self, now_ms: int) -> EnrichmentCommit:
        return EnrichmentCommit(self.new, {t: now_ms - self.retention[t] for t in self.tables}, dict(self.misses))
