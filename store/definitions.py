"""The definitions a namespace's output was built with, and the reprocessing runs (issue 16).

`stream_definitions`, in every namespace: per stream, the version (catalog/versions.py) and the
declaration as JSON that the panes there were computed with, written by the pipeline when it
first starts on that namespace (or first meets that stream). A pipeline started later with a
changed definition keeps computing the stream the stored way (the Kappa way: the old job runs
on; a reprocessing run builds the new output beside it), so the stored definition changes only
when a switch says so.

`reprocess_runs`, in the root: one row per reprocessing run (its id is its pipeline's name and
namespace), with where it started, the log's end offsets it has to reach, and its state; its
committed offsets are the consumer registry's copies (store/consumers.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_definitions (
    stream TEXT PRIMARY KEY,
    version TEXT NOT NULL,              -- sha256 of the shaping definition (catalog/versions.py)
    definition TEXT NOT NULL,           -- JSON: the stream's declaration, as StreamDef reads it
    recorded_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reprocess_runs (
    id TEXT PRIMARY KEY,                -- also its pipeline's name and store namespace
    stream TEXT NOT NULL,
    version TEXT NOT NULL,
    definition TEXT NOT NULL,
    state TEXT NOT NULL,                -- starting | running | caught_up | failed | stopped
    error TEXT,
    started_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    complete_from_ms INTEGER NOT NULL,  -- the new output holds every event from then on (epoch ms)
    start_offsets TEXT NOT NULL,        -- JSON {partition: first offset read}
    target_offsets TEXT NOT NULL        -- JSON {partition: the log's end when the run started}
);
-- Written by a switch (store/switch.py): where the serving pipeline reads the stream from next;
-- applied to its Spark checkpoint when it starts (sketchboard/definitions.py), then deleted.
CREATE TABLE IF NOT EXISTS offset_moves (
    pipeline TEXT NOT NULL,
    stream TEXT NOT NULL,
    offsets TEXT NOT NULL,              -- JSON {partition: end offset}
    at_ms INTEGER NOT NULL,
    PRIMARY KEY (pipeline, stream)
);
-- The streams a run reads to the log's end beside its own (the streams enriched from a table it
-- rebuilds: aggregates/reprocess.py), with where each started and the log's end then: its progress covers them.
CREATE TABLE IF NOT EXISTS reprocess_run_reads (
    run_id TEXT NOT NULL,
    stream TEXT NOT NULL,
    start_offsets TEXT NOT NULL,        -- JSON {partition: first offset read}
    target_offsets TEXT NOT NULL,       -- JSON {partition: the log's end when the run started}
    PRIMARY KEY (run_id, stream)
);
-- Where the process reading a run now took it over (a resumed run: what its checkpoint held was
-- read by an earlier process): its rate, in GET /api/v1/reprocess too, counts from there.
CREATE TABLE IF NOT EXISTS reprocess_run_resumes (
    run_id TEXT PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    done INTEGER NOT NULL               -- offsets done then
);
-- A run the API launched a child process for (sketchboard/reprocess.py child_launcher): the claim,
-- a secret handed to that child alone (in its environment), taken once by it (`reprocess --launched`).
-- A hand-typed `--launched` has none, so it cannot pass for the child and skip the going-run check.
CREATE TABLE IF NOT EXISTS reprocess_run_launches (
    run_id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
-- The ids a switch gave the copies of a run's corrections it moved into the root (store/switch.py
-- copied_corrections): the run's history under new ids, not news; the websocket's corrections
-- feed skips them (api/corrections_routes.py).
CREATE TABLE IF NOT EXISTS switched_corrections (
    first_id INTEGER PRIMARY KEY,
    last_id INTEGER NOT NULL,           -- inclusive
    at_ms INTEGER NOT NULL
);
-- Set by a synchronized switch (a stream feeding a window join, aggregates/reprocess.py): while a
-- row is here, the pipeline's batch commits are refused as held (store/switch.py SwitchHeld) and
-- retried, so its offsets of the join's other stream stay where the run's final batch aligns to.
CREATE TABLE IF NOT EXISTS switch_holds (
    pipeline TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
"""

RUN_STATES = ("starting", "running", "caught_up", "failed", "stopped")
ACTIVE_STATES = ("starting", "running")


@dataclass(frozen=True)
class StoredDefinition:
    stream: str
    version: str
    definition: dict
    recorded_at_ms: int


@dataclass(frozen=True)
class ReprocessRun:
    id: str
    stream: str
    version: str
    definition: dict
    state: str
    error: str | None
    started_at_ms: int
    updated_at_ms: int
    complete_from_ms: int
    start_offsets: dict[int, int]
    target_offsets: dict[int, int]

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


_RUN_COLUMNS = ("id, stream, version, definition, state, error, started_at_ms, updated_at_ms, complete_from_ms,"
                " start_offsets, target_offsets")


def _offsets(text: str) -> dict[int, int]:
    return {int(p): int(o) for p, o in json.loads(text).items()}


def _run(row) -> ReprocessRun:
    (id_, stream, version, definition, state, error, started, updated, complete_from, start, target) = row
    return ReprocessRun(id_, stream, version, json.loads(definition), state, error, started, updated, complete_from,
                        _offsets(start), _offsets(target))


class DefinitionStore(SideStore):
    def __init__(self, target: str | Path | Db, **kwargs):
        super().__init__(target, _SCHEMA, **kwargs)

    # -- the definitions this namespace's output was built with

    def record_missing(self, definitions: Mapping[str, tuple[str, dict]], now_ms: int) -> dict[str, StoredDefinition]:
        """Record (version, declaration) for the streams that have none yet; an existing record is
        kept (it says how the output there was built). Returns every stored definition."""
        rows = [(stream, version, json.dumps(doc, sort_keys=True), now_ms)
                for stream, (version, doc) in definitions.items()]
        with self._lock, self._conn.transaction() as conn:
            conn.executemany("INSERT INTO stream_definitions (stream, version, definition, recorded_at_ms)"
                             " VALUES (?, ?, ?, ?) ON CONFLICT (stream) DO NOTHING", rows)
        return self.definitions()

    def replace(self, stream: str, version: str, doc: dict, now_ms: int) -> None:
        """The output there is now built with this definition (a switch)."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO stream_definitions (stream, version, definition, recorded_at_ms) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (stream) DO UPDATE SET version = excluded.version, definition = excluded.definition,"
                " recorded_at_ms = excluded.recorded_at_ms", (stream, version, json.dumps(doc, sort_keys=True), now_ms))

    def definitions(self) -> dict[str, StoredDefinition]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT stream, version, definition, recorded_at_ms FROM stream_definitions").fetchall()
        return {s: StoredDefinition(s, v, json.loads(d), at) for s, v, d, at in rows}

    # -- reprocessing runs (kept in the root)

    def start_run(self, run: ReprocessRun) -> ReprocessRun:
        """Record a new run; RunGoing when a run of that stream is going, or the id is taken
        by one that is (a finished run of the same version is replaced: started again)."""
        with self._lock, self._conn.transaction() as conn:
            _refuse_going(conn, run.stream)
            insert_run(conn, run)
        return run

    def claim_run(self, run_id: str, stream: str, now_ms: int) -> ReprocessRun:
        """Mark run `run_id` of `stream` `starting` again (resumed by `sketchboard reprocess
        --run`): RunGoing when a run of the stream is going, checked and claimed in one
        transaction, as start_run checks and records, so two processes never both claim it."""
        with self._lock, self._conn.transaction() as conn:
            _refuse_going(conn, stream)
            conn.execute("UPDATE reprocess_runs SET state = 'starting', error = NULL, updated_at_ms = ? WHERE id = ?",
                         (now_ms, run_id))
        return self.run(run_id)

    def record_launch(self, run_id: str, now_ms: int) -> str:
        """The API launches a child process for going run `run_id`: a new claim (replacing any
        earlier one), returned for that child alone to present (`take_launch`)."""
        token = secrets.token_hex(16)
        with self._lock:
            self._conn.execute("INSERT INTO reprocess_run_launches (run_id, token, at_ms) VALUES (?, ?, ?)"
                               " ON CONFLICT (run_id) DO UPDATE SET token = excluded.token, at_ms = excluded.at_ms",
                               (run_id, token, now_ms))
        return token

    def take_launch(self, run_id: str, token: str | None) -> ReprocessRun:
        """The launched child takes its run: NotLaunched unless `token` is the claim the API
        recorded for it (record_launch) and the run is still going; the claim is taken once, in the
        transaction that checks it, so a second `--launched` is refused as a hand-typed one is."""
        with self._lock, self._conn.transaction() as conn:
            row = conn.execute("SELECT r.token, u.state FROM reprocess_run_launches r JOIN reprocess_runs u"
                               " ON u.id = r.run_id WHERE r.run_id = ?", (run_id,)).fetchone()
            if row is None or token is None or not secrets.compare_digest(row[0], token):
                raise NotLaunched(
                    f"reprocessing run {run_id!r} was not launched for this process: `--launched` is for the process"
                    " the API starts for a run it recorded (it hands that process the run's claim); to resume a"
                    f" run by hand, leave `--launched` out: `sketchboard reprocess STREAM --run {run_id}`")
            if row[1] not in ACTIVE_STATES:
                raise NotLaunched(f"reprocessing run {run_id!r} is {row[1]}, no longer going: its launch is over;"
                                  f" resume it with `sketchboard reprocess STREAM --run {run_id}`")
            conn.execute("DELETE FROM reprocess_run_launches WHERE run_id = ?", (run_id,))
        return self.run(run_id)

    def delete_run(self, run_id: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM reprocess_runs WHERE id = ?", (run_id,))
            self._conn.execute("DELETE FROM reprocess_run_launches WHERE run_id = ?", (run_id,))
            self._conn.execute("DELETE FROM reprocess_run_reads WHERE run_id = ?", (run_id,))
            self._conn.execute("DELETE FROM reprocess_run_resumes WHERE run_id = ?", (run_id,))

    def record_resume(self, run_id: str, at_ms: int, done: int) -> None:
        """The process reading run `run_id` took it over at `at_ms`, `done` offsets done then."""
        with self._lock:
            self._conn.execute("INSERT INTO reprocess_run_resumes (run_id, at_ms, done) VALUES (?, ?, ?)"
                               " ON CONFLICT (run_id) DO UPDATE SET at_ms = excluded.at_ms, done = excluded.done",
                               (run_id, at_ms, done))

    def resumed(self, run_id: str) -> tuple[int, int] | None:
        """(at_ms, done then) of record_resume, if any."""
        with self._lock:
            row = self._conn.execute("SELECT at_ms, done FROM reprocess_run_resumes WHERE run_id = ?",
                                     (run_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def record_reads(self, run_id: str, reads: Mapping[str, tuple[Mapping[int, int], Mapping[int, int]]]) -> None:
        """The other streams a run reads to the log's end: {stream: (start offsets, target offsets)}."""
        with self._lock, self._conn.transaction() as conn:
            conn.execute("DELETE FROM reprocess_run_reads WHERE run_id = ?", (run_id,))
            conn.executemany("INSERT INTO reprocess_run_reads (run_id, stream, start_offsets, target_offsets)"
                             " VALUES (?, ?, ?, ?)",
                             [(run_id, stream, json.dumps({str(p): o for p, o in starts.items()}),
                               json.dumps({str(p): o for p, o in targets.items()}))
                              for stream, (starts, targets) in sorted(reads.items())])

    def run_reads(self, run_id: str) -> dict[str, tuple[dict[int, int], dict[int, int]]]:
        with self._lock:
            rows = self._conn.execute("SELECT stream, start_offsets, target_offsets FROM reprocess_run_reads"
                                      " WHERE run_id = ?", (run_id,)).fetchall()
        return {stream: (_offsets(starts), _offsets(targets)) for stream, starts, targets in rows}

    def switched_corrections(self, after_id: int) -> list[tuple[int, int]]:
        """(first, last) ids, inclusive, that switches gave copied corrections, of those ending
        after `after_id`, lowest first."""
        with self._lock:
            rows = self._conn.execute("SELECT first_id, last_id FROM switched_corrections WHERE last_id > ?"
                                      " ORDER BY first_id", (after_id,)).fetchall()
        return [(int(first), int(last)) for first, last in rows]

    def offset_moves(self, pipeline: str) -> dict[str, dict[int, int]]:
        """{stream: {partition: offset}}: where a switch says `pipeline` reads each stream from next."""
        with self._lock:
            rows = self._conn.execute("SELECT stream, offsets FROM offset_moves WHERE pipeline = ?",
                                      (pipeline,)).fetchall()
        return {stream: _offsets(text) for stream, text in rows}

    def moved(self, pipeline: str, stream: str) -> None:
        """The move is in the pipeline's checkpoint now."""
        with self._lock:
            self._conn.execute("DELETE FROM offset_moves WHERE pipeline = ? AND stream = ?", (pipeline, stream))

    def pipeline_offsets(self, pipeline: str, stream: str) -> dict[int, int]:
        """{partition: end offset} the pipeline has committed for the stream (its last batch's)."""
        with self._lock:
            rows = self._conn.execute("SELECT partition, end_offset FROM pipeline_offsets WHERE pipeline = ?"
                                      " AND stream = ?", (pipeline, stream)).fetchall()
        return {int(p): int(o) for p, o in rows}

    def holds(self) -> dict[str, str]:
        """{pipeline: run id} of the synchronized switches holding a pipeline's commits."""
        with self._lock:
            return dict(self._conn.execute("SELECT pipeline, run_id FROM switch_holds").fetchall())

    def heartbeat(self, run_id: str, now_ms: int) -> None:
        """A going run's process is alive: its `updated_at_ms` moves (fail_stale's clock)."""
        with self._lock:
            self._conn.execute(f"UPDATE reprocess_runs SET updated_at_ms = ? WHERE id = ? AND state IN"
                               f" ({', '.join('?' * len(ACTIVE_STATES))})", (now_ms, run_id, *ACTIVE_STATES))

    def fail_stale(self, now_ms: int, stale_ms: int) -> list[str]:
        """Mark failed every going run whose process has not reported for `stale_ms` (killed, or
        gone with its host): it would otherwise refuse every new run of its stream, and its drop,
        for ever. Returns their ids."""
        cutoff = now_ms - stale_ms
        going = f"state IN ({', '.join('?' * len(ACTIVE_STATES))}) AND updated_at_ms < ?"
        with self._lock:  # a read first: runs are listed every poll, and almost never is one stale
            stale = [row[0] for row in self._conn.execute(f"SELECT id FROM reprocess_runs WHERE {going}",
                                                          (*ACTIVE_STATES, cutoff)).fetchall()]
        if not stale:
            return []
        with self._lock, self._conn.transaction() as conn:  # again under the write lock: a heartbeat may have come
            stale = [row[0] for row in conn.execute(f"SELECT id FROM reprocess_runs WHERE {going}",
                                                    (*ACTIVE_STATES, cutoff)).fetchall()]
            for run_id in stale:
                conn.execute("UPDATE reprocess_runs SET state = 'failed', error = ?, updated_at_ms = ? WHERE id = ?",
                             (f"its process stopped reporting for more than {stale_ms // 1000} s (killed, or its"
                              " host gone): resume it with `sketchboard reprocess STREAM --run ID`, or start"
                              " a new run", now_ms, run_id))
        return stale

    def set_state(self, run_id: str, state: str, now_ms: int, error: str | None = None) -> None:
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}")
        with self._lock:
            self._conn.execute("UPDATE reprocess_runs SET state = ?, error = ?, updated_at_ms = ? WHERE id = ?",
                               (state, error, now_ms, run_id))

    def runs(self) -> list[ReprocessRun]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM reprocess_runs ORDER BY started_at_ms, id").fetchall()
        return [_run(row) for row in rows]

    def run(self, run_id: str) -> ReprocessRun | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM reprocess_runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else _run(row)


def insert_run(conn: Db, run: ReprocessRun) -> None:
    """Record (or replace) a run in an open transaction (a switch records the output it replaces)."""
    conn.execute("DELETE FROM reprocess_runs WHERE id = ?", (run.id,))
    conn.execute(
        f"INSERT INTO reprocess_runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (run.id, run.stream, run.version, json.dumps(run.definition, sort_keys=True), run.state, run.error,
         run.started_at_ms, run.updated_at_ms, run.complete_from_ms,
         json.dumps({str(p): o for p, o in run.start_offsets.items()}),
         json.dumps({str(p): o for p, o in run.target_offsets.items()})))


class RunGoing(ValueError):
    """A reprocessing run of the stream is already going."""


class NotLaunched(ValueError):
    """`sketchboard reprocess --launched` of a run the API did not launch this process for."""


# A going run's process reports every RUN_HEARTBEAT_MS (sketchboard/reprocess.py); one silent for
# RUN_STALE_MS is taken for dead and marked failed (a SIGKILL, an out-of-memory kill, its host
# gone): long enough for a child's JVM to start on a loaded host, short enough not to keep a
# stream's new runs refused for long.
RUN_HEARTBEAT_MS = 10_000
RUN_STALE_MS = 300_000


def run_going(run_id_: str, stream: str) -> RunGoing:
    """The refusal of a run (or `--run`) while a run of the stream is going, with how to go on."""
    return RunGoing(f"reprocessing run {run_id_!r} of stream {stream!r} is still going (its process reports every"
                    f" {RUN_HEARTBEAT_MS // 1000} s); if that process is gone, the run is marked failed"
                    f" {RUN_STALE_MS // 60_000} minutes after its last report: then resume it with"
                    f" `sketchboard reprocess {stream} --run {run_id_}`")


def _refuse_going(conn, stream: str) -> None:
    """RunGoing when a run of `stream` is going: inside the transaction that then records or claims one."""
    going = conn.execute(f"SELECT id FROM reprocess_runs WHERE stream = ? AND state IN"
                         f" ({', '.join('?' * len(ACTIVE_STATES))})", (stream, *ACTIVE_STATES)).fetchone()
    if going is not None:
        raise run_going(going[0], stream)
