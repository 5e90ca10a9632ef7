"""The registry of the log's consumers (fan-out): every named pipeline, where its output lives,
where its first run started (earliest | latest, and the offsets that start was pinned at), and its
committed offsets, in the store's root namespace (beside
the serving pipeline's panes), where the API reads them for lag.

Each pipeline's own namespace stays the source of truth: its batch ids and end offsets are
committed there in one transaction with its panes (exactly once). What a pipeline other than
the serving one writes here is a copy, made right after each of its commits (and once when it
starts, to cover a crash between the two): at worst one batch behind, so lag is overstated for
a moment, never understated. The serving pipeline's offsets are read from the store itself.

The registry also guards the root namespace: it belongs to one pipeline name, so a pipeline
started against the root under another name (pipeline_name changed, or SKETCHBOARD_PIPELINE_NAME
set for a second process instead of `--name`), or against a store whose root holds another
pipeline's batches, is refused instead of double counting."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from catalog import ConfigError
from store.connection import Db, SideStore
from store.namespace import ROOT, describe

_SCHEMA = """
CREATE TABLE IF NOT EXISTS consumers (
    pipeline TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,            -- '' : the store's root (the serving pipeline)
    started_from TEXT NOT NULL,         -- earliest | latest: where its first run began reading
    registered_at_ms INTEGER NOT NULL,
    last_batch_id INTEGER,
    last_commit_ms INTEGER,
    group_commits_failed INTEGER NOT NULL DEFAULT 0,   -- optional Kafka consumer-group commits
    group_commit_error TEXT
);
CREATE TABLE IF NOT EXISTS consumer_offsets (
    pipeline TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,        -- exclusive: the next offset the pipeline reads
    PRIMARY KEY (pipeline, stream, partition)
);
-- Where a pipeline's first run started reading (its pinned start, ingest/spark_source.py): its
-- position before it commits anything. A table of its own, so a store from before it gains it
-- by CREATE TABLE IF NOT EXISTS on both backends (no column to add to `consumers`).
CREATE TABLE IF NOT EXISTS consumer_starts (
    pipeline TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,      -- the first offset its first run reads
    PRIMARY KEY (pipeline, stream, partition)
);
"""


class NamespaceTaken(ConfigError):
    """A pipeline would write into a namespace another pipeline's output is in."""


@dataclass(frozen=True)
class Consumer:
    pipeline: str
    namespace: str
    started_from: str
    registered_at_ms: int
    last_batch_id: int | None
    last_commit_ms: int | None
    group_commits_failed: int
    group_commit_error: str | None

    def to_json(self) -> dict:
        return {"name": self.pipeline, "namespace": self.namespace or None, "started_from": self.started_from,
                "registered_at_ms": self.registered_at_ms, "last_batch_id": self.last_batch_id,
                "last_commit_ms": self.last_commit_ms,
                "group_commits_failed": self.group_commits_failed, "group_commit_error": self.group_commit_error}


_COLUMNS = ("pipeline, namespace, started_from, registered_at_ms, last_batch_id, last_commit_ms,"
            " group_commits_failed, group_commit_error")


class ConsumerRegistry(SideStore):
    def __init__(self, target: str | Path | Db, **kwargs):
        super().__init__(target, _SCHEMA, **kwargs)

    def register(self, pipeline: str, namespace: str, started_from: str, now_ms: int) -> Consumer:
        """Record a pipeline the first time it starts; later starts keep the first record (its
        checkpoint decides where it resumes, not `started_from`). NamespaceTaken when another
        pipeline owns the namespace, or left batches in the root."""
        with self._lock, self._conn.transaction() as conn:
            owner = conn.execute("SELECT pipeline FROM consumers WHERE namespace = ? AND pipeline <> ?",
                                 (namespace, pipeline)).fetchone()
            if owner is None and namespace == ROOT:
                # A store from before the registry: the root's batches say whose output it holds.
                # (Its session queries, before sessions ran in its own batches, committed as
                # `<pipeline>-sessions-<stream>`.)
                others = [name for (name,) in conn.execute("SELECT DISTINCT pipeline FROM batches").fetchall()
                          if name != pipeline and not name.startswith(f"{pipeline}-sessions-")]
                owner = (others[0],) if others else None
            if owner is not None:
                raise NamespaceTaken(
                    f"{describe(namespace)} holds the output of pipeline {owner[0]!r}, not {pipeline!r}:"
                    f" two pipelines writing one set of panes would count every event twice. Set pipeline_name to"
                    f" {owner[0]!r} for the serving pipeline, and run others with `sketchboard pipeline --name`")
            conn.execute(
                "INSERT INTO consumers (pipeline, namespace, started_from, registered_at_ms) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (pipeline) DO NOTHING", (pipeline, namespace, started_from, now_ms))
            row = conn.execute(f"SELECT {_COLUMNS} FROM consumers WHERE pipeline = ?", (pipeline,)).fetchone()
        consumer = Consumer(*row)
        if consumer.namespace != namespace:
            raise NamespaceTaken(f"pipeline {pipeline!r} writes into {describe(consumer.namespace)}, not"
                                 f" {describe(namespace)}: was the serving pipeline (pipeline_name) renamed?")
        return consumer

    def forget(self, pipeline: str) -> None:
        """The pipeline and its output are gone (a dropped reprocessing output): its record and offsets."""
        with self._lock, self._conn.transaction() as conn:
            conn.execute("DELETE FROM consumer_offsets WHERE pipeline = ?", (pipeline,))
            conn.execute("DELETE FROM consumer_starts WHERE pipeline = ?", (pipeline,))
            conn.execute("DELETE FROM consumers WHERE pipeline = ?", (pipeline,))

    def record_commit(self, pipeline: str, batch_id: int, committed_at_ms: int | None,
                      offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Copy a pipeline's committed end offsets (never moving one back: a late copy of an
        older batch changes nothing)."""
        rows = [(pipeline, stream, int(p), int(end)) for stream, parts in offsets.items() for p, end in parts.items()]
        with self._lock, self._conn.transaction() as conn:
            conn.executemany(
                "INSERT INTO consumer_offsets (pipeline, stream, partition, end_offset) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (pipeline, stream, partition) DO UPDATE SET end_offset ="
                f" {conn.greatest}(consumer_offsets.end_offset, excluded.end_offset)", rows)
            conn.execute(
                f"UPDATE consumers SET last_batch_id = {conn.greatest}(COALESCE(last_batch_id, -1), ?),"
                f" last_commit_ms = {conn.greatest}(COALESCE(last_commit_ms, 0), ?) WHERE pipeline = ?",
                (batch_id, committed_at_ms or 0, pipeline))

    def record_start(self, pipeline: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Where the pipeline's first run started (its pinned start): its position until it commits
        a partition. A pinned start never changes, so the first record of a partition is kept."""
        rows = [(pipeline, stream, int(p), int(start)) for stream, parts in offsets.items() for p, start in parts.items()]
        if not rows:
            return
        with self._lock, self._conn.transaction() as conn:
            conn.executemany(
                "INSERT INTO consumer_starts (pipeline, stream, partition, start_offset) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (pipeline, stream, partition) DO NOTHING", rows)

    def starts(self, pipeline: str) -> dict[str, dict[int, int]]:
        """The pipeline's recorded start (`record_start`), empty when none was recorded."""
        with self._lock:
            rows = self._conn.execute("SELECT stream, partition, start_offset FROM consumer_starts WHERE pipeline = ?",
                                      (pipeline,)).fetchall()
        out: dict[str, dict[int, int]] = defaultdict(dict)
        for stream, partition, start in rows:
            out[stream][partition] = start
        return dict(out)

    def record_group_commit(self, pipeline: str, error: str | None) -> None:
        """The outcome of a Kafka consumer-group commit: failures are counted, the last one kept."""
        with self._lock:
            if error is None:
                self._conn.execute("UPDATE consumers SET group_commit_error = NULL WHERE pipeline = ?", (pipeline,))
            else:
                self._conn.execute("UPDATE consumers SET group_commits_failed = group_commits_failed + 1,"
                                   " group_commit_error = ? WHERE pipeline = ?", (error, pipeline))

    def consumers(self) -> list[Consumer]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM consumers").fetchall()
        # Ordered here: ties by name in code-point order on both backends (not PostgreSQL's collation).
        return sorted((Consumer(*row) for row in rows), key=lambda c: (c.registered_at_ms, c.pipeline))

    def offsets(self, pipeline: str) -> dict[str, dict[int, int]]:
        with self._lock:
            rows = self._conn.execute("SELECT stream, partition, end_offset FROM consumer_offsets WHERE pipeline = ?",
                                      (pipeline,)).fetchall()
        out: dict[str, dict[int, int]] = defaultdict(dict)
        for stream, partition, end in rows:
            out[stream][partition] = end
        return dict(out)

    # Every pipeline's at once, one query each: the lag sampler reads every consumer's position
    # every round, and one `offsets` + `starts` per consumer (with 400 of them) was most of a round.

    def all_offsets(self) -> dict[str, dict[str, dict[int, int]]]:
        """`offsets` of every pipeline that has copied any: pipeline -> stream -> partition -> end."""
        with self._lock:
            rows = self._conn.execute("SELECT pipeline, stream, partition, end_offset FROM consumer_offsets").fetchall()
        return _by_pipeline(rows)

    def all_starts(self) -> dict[str, dict[str, dict[int, int]]]:
        """`starts` of every pipeline that has one recorded: pipeline -> stream -> partition -> start."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT pipeline, stream, partition, start_offset FROM consumer_starts").fetchall()
        return _by_pipeline(rows)


def _by_pipeline(rows) -> dict[str, dict[str, dict[int, int]]]:
    out: dict[str, dict[str, dict[int, int]]] = {}
    for pipeline, stream, partition, offset in rows:
        out.setdefault(pipeline, {}).setdefault(stream, {})[partition] = offset
    return out
