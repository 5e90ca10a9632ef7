"""Lag samples (one partition at one instant: the log's offsets and the pipeline's committed
offset), the statuses the lag evaluator (lag/status.py) gives them, and their time series,
kept beside the panes (the store's SQLite file with its own connection, or the PostgreSQL
store's database: store.connection.Db). Here, low in the layers, because the alert rules
name statuses and the store keeps samples: neither should reach up into `lag/`.

Kept out of store/sqlite.py on purpose: samples are written by the API process's sampler
every few seconds and must not contend with the pane store's code paths. Retention is
bounded: every write prunes samples older than the retention.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from store.connection import Db, SideStore


class LagStatus(str, Enum):
    """Burrow's partition statuses, plus ERR for "cannot be evaluated"."""

    OK = "OK"
    WARN = "WARN"  # lag growing while the pipeline moves
    STALL = "STALL"  # committed offset not moving while lag > 0, though the pipeline commits
    STOP = "STOP"  # no commits for longer than the window while lag > 0
    REWIND = "REWIND"  # committed offset went backwards
    ERR = "ERR"  # the samples cannot be evaluated

    @property
    def severity(self) -> int:
        """Roll-ups show the worst: OK < WARN < STALL < STOP < REWIND < ERR."""
        return _SEVERITY[self]


_SEVERITY = {s: i for i, s in enumerate(LagStatus)}


@dataclass(frozen=True)
class LagSample:
    """One partition at one instant: the log's offsets and the pipeline's committed offset.

    committed is the pipeline's stored end offset (exclusive) for the partition, None before
    its first commit; last_commit_ms is when the pipeline last committed any batch (None:
    never). lag_ms is the age of the oldest record not yet processed (0 when caught up, None
    when unknown)."""

    pipeline: str
    stream: str
    partition: int
    at_ms: int
    log_start: int
    log_end: int
    committed: int | None
    last_commit_ms: int | None = None
    lag_ms: int | None = None
    # The round's place in the order rounds were written (the store numbers them; None before):
    # rounds are ordered by it, not by at_ms, the writer's wall clock, which goes back when the
    # sampler moves to a replica whose clock is behind the previous leader's.
    # Not compared: where a sample was stored, not what it measured.
    round_seq: int | None = field(default=None, compare=False)

    @property
    def order(self) -> tuple[int, int]:
        """Where the sample's round comes: write order, then (samples from before rounds were
        numbered, or not stored) time."""
        return (self.round_seq or 0, self.at_ms)

    @property
    def position(self) -> int:
        """The next offset the pipeline will read: its committed offset, or the log start
        when it has none or retention dropped records it never read."""
        return max(self.log_start, self.committed if self.committed is not None else self.log_start)

    @property
    def lag_events(self) -> int:
        return max(0, self.log_end - self.position)

    @property
    def lag_seconds(self) -> float | None:
        return None if self.lag_ms is None else round(self.lag_ms / 1000, 3)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS lag_samples (
    pipeline TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    log_start INTEGER NOT NULL,
    log_end INTEGER NOT NULL,
    committed INTEGER,               -- NULL: the pipeline never committed this partition
    last_commit_ms INTEGER,          -- the pipeline's newest batch commit (any partition)
    lag_events INTEGER NOT NULL,
    lag_ms INTEGER,                  -- age of the oldest unprocessed record; NULL: unknown
    round_seq INTEGER NOT NULL DEFAULT 0,  -- the round's number in write order (0: written before rounds were numbered)
    PRIMARY KEY (pipeline, stream, partition, at_ms)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lag_samples_by_time ON lag_samples (pipeline, at_ms);
-- Retention prunes by age alone, every pipeline at once (one whose samples stopped coming, a
-- dropped reprocessing run, is pruned too): without this index that delete scans every sample.
CREATE INDEX IF NOT EXISTS lag_samples_by_age ON lag_samples (at_ms);
-- The number of the last round written: one row, raised in each write's transaction (a row lock
-- on PostgreSQL: two writers never share a number), on both backends alike.
CREATE TABLE IF NOT EXISTS lag_rounds (
    id INTEGER PRIMARY KEY,
    last_round INTEGER NOT NULL
);
"""

# After the upgrade below (a table from before round_seq gains it first).
_ROUND_INDEXES = """
CREATE INDEX IF NOT EXISTS lag_samples_by_round ON lag_samples (pipeline, stream, partition, round_seq);
CREATE INDEX IF NOT EXISTS lag_samples_newest_round ON lag_samples (pipeline, round_seq);
"""

_WRITTEN = "pipeline, stream, partition, at_ms, log_start, log_end, committed, last_commit_ms, lag_ms"
_COLUMNS = f"{_WRITTEN}, round_seq"


class LagStore(SideStore):
    def __init__(self, path: str | Path | Db, *, retention_ms: int = 86_400_000, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0):
        if retention_ms <= 0:
            raise ValueError(f"lag sample retention must be positive, got {retention_ms} ms")
        super().__init__(path, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self.retention_ms = retention_ms
        with self._lock:
            # A store from before rounds were numbered (CREATE TABLE IF NOT EXISTS kept its table):
            # its samples get round 0, older than any round written from now on.
            self.add_column("lag_samples", "round_seq", "INTEGER NOT NULL DEFAULT 0")
            self._conn.create(_ROUND_INDEXES)
            self._conn.execute("INSERT INTO lag_rounds (id, last_round) VALUES (1, 0) ON CONFLICT (id) DO NOTHING")

    def write(self, samples: Sequence[LagSample]) -> int:
        """Store one round of samples and prune those past the retention; return rows pruned."""
        if not samples:
            return 0
        newest = max(s.at_ms for s in samples)
        with self._lock, self._conn.transaction() as conn:
            conn.execute("UPDATE lag_rounds SET last_round = last_round + 1 WHERE id = 1")
            round_seq = conn.execute("SELECT last_round FROM lag_rounds WHERE id = 1").fetchone()[0]
            conn.executemany(
                f"INSERT INTO lag_samples ({_WRITTEN}, lag_events, round_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (pipeline, stream, partition, at_ms) DO UPDATE SET log_start = excluded.log_start,"
                " log_end = excluded.log_end, committed = excluded.committed,"
                " last_commit_ms = excluded.last_commit_ms, lag_ms = excluded.lag_ms, lag_events = excluded.lag_events,"
                " round_seq = excluded.round_seq",
                # In key order (pipeline, stream, partition), not the round's (partition, then
                # consumer): each insert then lands beside the one before in the key and in the
                # indexes that start with the pipeline, which halved a round's write at 400 consumers.
                sorted(((s.pipeline, s.stream, s.partition, s.at_ms, s.log_start, s.log_end, s.committed,
                         s.last_commit_ms, s.lag_ms, s.lag_events, round_seq) for s in samples), key=_sample_key),
            )
            # Every pipeline's, not only this round's: a consumer that is gone has no rounds to prune it.
            pruned = conn.execute("DELETE FROM lag_samples WHERE at_ms < ?", (newest - self.retention_ms,)).rowcount
        return pruned

    def recent(self, pipeline: str, per_partition: int,
               partitions: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], list[LagSample]]:
        """The newest `per_partition` samples of every partition (or of the given ones), oldest
        first, in the order their rounds were written (not by at_ms: see LagSample.round_seq). Given partitions cost one index range each; without, every stored partition is
        found by a scan (slower with a full retention of samples)."""
        with self._lock:
            if partitions is None:
                partitions = self._conn.execute(
                    "SELECT DISTINCT stream, partition FROM lag_samples WHERE pipeline = ?", (pipeline,)
                ).fetchall()
            out: dict[tuple[str, int], list[LagSample]] = {}
            for stream, partition in partitions:
                rows = self._conn.execute(
                    f"SELECT {_COLUMNS} FROM lag_samples WHERE pipeline = ? AND stream = ? AND partition = ?"
                    " ORDER BY round_seq DESC, at_ms DESC LIMIT ?",
                    (pipeline, stream, partition, per_partition),
                ).fetchall()
                if rows:
                    out[(stream, partition)] = [LagSample(*row) for row in reversed(rows)]
        return out

    def newest_round(self, pipeline: str) -> int | None:
        """The number of the pipeline's newest stored round (write order), None without samples;
        a round written before rounds were numbered is 0."""
        with self._lock:
            return self._conn.execute(
                "SELECT MAX(round_seq) FROM lag_samples WHERE pipeline = ?", (pipeline,)
            ).fetchone()[0]

    def newest_at_ms(self, pipeline: str) -> int | None:
        """When the pipeline's newest round (in write order) was sampled, on its writer's clock."""
        with self._lock:
            row = self._conn.execute(
                "SELECT at_ms FROM lag_samples WHERE pipeline = ? ORDER BY round_seq DESC, at_ms DESC LIMIT 1",
                (pipeline,)).fetchone()
        return None if row is None else row[0]

    def series(self, pipeline: str, from_ms: int, to_ms: int, *, stream: str | None = None,
               limit: int = 100_000) -> list[LagSample]:
        """Samples with from_ms <= at_ms < to_ms, by time (at most `limit`, the newest kept)."""
        query = f"SELECT {_COLUMNS} FROM lag_samples WHERE pipeline = ? AND at_ms >= ? AND at_ms < ?"
        args: list = [pipeline, from_ms, to_ms]
        if stream is not None:
            query += " AND stream = ?"
            args.append(stream)
        with self._lock:
            rows = self._conn.execute(f"{query} ORDER BY at_ms DESC LIMIT ?", (*args, limit)).fetchall()
        # Ordered here, not by the database: a stream's name in code-point order on both backends
        # (PostgreSQL's default collation is usually linguistic).
        samples = [LagSample(*row) for row in rows]
        samples.sort(key=lambda s: (s.at_ms, s.stream, s.partition))
        return samples



SqliteLagStore = LagStore  # the name from before PostgreSQL; the same class on a file path


def _sample_key(row: tuple) -> tuple:
    # The key only: the other columns may be None, which does not compare with a number.
    return row[:3]
