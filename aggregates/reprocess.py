"""Reprocessing runs, the Kappa way (issue 16; docs/reprocessing.md): a second pipeline for one
stream, with its configured (new) definition, reads the log from its earliest retained offset into
a versioned namespace of its own, while the live pipeline goes on computing the stored (old) way.

This module plans a run (what it reads, what it must reach, from when its output is complete),
checks that one may start, and reports progress from the run's committed offsets (the consumer
registry's copies). It imports no Spark: the API uses it; the CLI runs the pipeline
(sketchboard/reprocess.py)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from catalog import Catalog, StreamDef
from catalog.tables import row_columns
from catalog.defined_patterns import catalog_with_patterns, pattern_definition_id
from catalog.dependents import aligned_joins, aligned_patterns, moved_with, rebuilt_patterns, refused_dependents
from catalog.dependents import aligned_enrichments, aligned_views, capped_streams, enrichment_feeds, \
    enriched_streams
from catalog.patterns import PatternDef, matches_stream_name
from catalog.views import ViewDef
from aggregates.views import definition_of
from catalog.versions import changed_streams, definition_version, short_version, stored_stream, stream_document, \
    versioned_streams
from ingest.log import EventLog, PartitionOffsets
from store.consumers import ConsumerRegistry
from store import PaneStore
from store.definitions import (RUN_HEARTBEAT_MS, RUN_STALE_MS, DefinitionStore, ReprocessRun, RunGoing,
                               StoredDefinition, insert_run, run_going)
from store.pattern_definitions import PatternDefinitionStore
from store.namespace import PREVIOUS_PREFIX, ROOT, RUN_PREFIX
from store.namespace_storage import NamespaceStorage
from store.switch import NotAligned, Side, SwitchConflict, stream_offsets, switch_stream
from store.switch import switch_enriched
from store.table_versions import TableVersion

logger = logging.getLogger("sketchboard.reprocess")

_STREAM_CHARS = 29  # "reprocess-" + 29 + "-" + 8 = 48, a pipeline name's limit (store/namespace.py)


class DefinitionUnchanged(ValueError):
    """The stream's output is already built with its configured definition: nothing to reprocess."""


class UnknownStream(KeyError):
    """Not a stream read from the log (unknown, or derived: reprocessed with its parent)."""

    def __str__(self) -> str:  # the reason, not KeyError's quoted repr (the CLI prints it)
        return str(self.args[0])


def run_id(stream: str, version: str, prefix: str = RUN_PREFIX) -> str:
    """The run's id, also its pipeline's name and store namespace: reprocess-<stream>-<version8>
    (previous-<stream>-<version8> for an output a switch replaced)."""
    name = stream if len(stream) <= _STREAM_CHARS else (
        f"{stream[:_STREAM_CHARS - 9]}-{hashlib.sha256(stream.encode()).hexdigest()[:8]}")
    return f"{prefix}{name}-{short_version(version)}"


class SwitchRefused(ValueError):
    """The switch or drop cannot be done now (the reason says why)."""


class UnknownRun(KeyError):
    """`sketchboard reprocess STREAM --run ID`: no run with that id, or a run of another stream."""

    def __str__(self) -> str:  # the reason, not KeyError's quoted repr (the CLI prints it)
        return str(self.args[0])


class RunNotResumable(ValueError):
    """`--run ID` names an output no pipeline reprocesses into (a replaced `previous-*` output)."""


class NeedsAlignment(SwitchRefused):
    """The stream feeds a window join: its switch is a synchronized one, which needs a process that
    can run the run's final batch (`sketchboard reprocess STREAM --switch`, or the API's child)."""



# How many times a synchronized switch runs the final batch and tries again when the serving
# pipeline's offsets moved meanwhile (a commit that was under way when the hold was set).
ALIGN_ATTEMPTS = 3

# align(run, offsets): process the run's output up to the log's end, reading each of the joins'
# other streams exactly to `offsets` ({stream: {partition: offset}}): sketchboard/reprocess.py.
Aligner = Callable[[ReprocessRun, dict[str, dict[int, int]]], None]


@dataclass(frozen=True)
class Outputs:
    """How the service reaches the versioned outputs (wired from settings: sketchboard/reprocess.py):
    their storage, a store opened on one (which makes its tables), the serving pipeline's name,
    and the removal of a pipeline's Spark checkpoint."""

    storage: NamespaceStorage
    open_store: Callable[[str], PaneStore]
    serving_pipeline: str
    remove_checkpoint: Callable[[str], None]


def _fed_text(joins, patterns, views, enriched: Sequence[str] = ()) -> str:
    """What a stream feeds with another stream, as refusals and requests for a switch name it."""
    return ", ".join([*(f"join {j.name!r}" for j in joins), *(f"pattern {p.name!r}" for p in patterns),
                      *(f"view {v.name!r}" for v in views), *(f"enrichment of {s!r}" for s in enriched)])


def is_run_pipeline(pipeline: str) -> bool:
    return pipeline.startswith(RUN_PREFIX)


def streams_read(definitions: DefinitionStore, registry: ConsumerRegistry, pipeline: str) -> set[str] | None:
    """The streams of the log a reprocessing run reads, for its lag: its own, those it reads whole
    beside it (the streams enriched from a table: reprocess_run_reads) and every stream it has
    committed offsets of (a join's other stream, the tables it is enriched from: each batch commits
    them all). None (every stream) for any other pipeline, which reads the whole catalog, and for a
    run nothing is known of."""
    if not is_run_pipeline(pipeline):
        return None
    read = set(registry.offsets(pipeline)) | set(definitions.run_reads(pipeline))
    run = definitions.run(pipeline)
    if run is not None:
        read.add(run.stream)
    return read or None


def complete_from_ms(starts: Mapping[int, int], first_ingest_ms: Mapping[int, int | None], now_ms: int,
                     stream_retention_ms: int) -> int:
    """From when a reprocessed output holds every event: the latest of now - the stream's
    retention (older events are dead-lettered, as the live pipeline does) and, for each partition
    whose oldest records are gone (its first retained offset is not 0), the time its first
    retained record was appended (Kafka: the record's timestamp). A partition whose first record's
    time the log cannot tell counts as dropped just now: better too late a date than a false one."""
    bounds = [now_ms - stream_retention_ms]
    for partition, start in starts.items():
        if start > 0:
            first = first_ingest_ms.get(partition)
            bounds.append(now_ms if first is None else first)
    return max(bounds)


@dataclass(frozen=True)
class PartitionProgress:
    partition: int
    done: int
    to_do: int
    stream: str | None = None  # the run's stream, or another it reads whole (an enriched stream it rebuilds)

    def to_json(self) -> dict:
        out = {"partition": self.partition, "done": self.done, "to_do": self.to_do}
        return out if self.stream is None else {**out, "stream": self.stream}


@dataclass(frozen=True)
class Progress:
    partitions: tuple[PartitionProgress, ...]
    events_per_s: float | None
    eta_s: float | None

    @property
    def done(self) -> int:
        return sum(p.done for p in self.partitions)

    @property
    def to_do(self) -> int:
        return sum(p.to_do for p in self.partitions)

    @property
    def fraction(self) -> float:
        return 1.0 if self.to_do == 0 else self.done / self.to_do

    def to_json(self) -> dict:
        return {"done": self.done, "to_do": self.to_do, "fraction": round(self.fraction, 4),
                "events_per_s": None if self.events_per_s is None else round(self.events_per_s, 1),
                "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
                "partitions": [p.to_json() for p in self.partitions]}


def run_progress(run: ReprocessRun, committed: Mapping[int, int], now_ms: int,
                 reads: Mapping[str, tuple[Mapping[int, int], Mapping[int, int], Mapping[int, int]]] | None = None,
                 since: tuple[int, int] | None = None) -> Progress:
    """Offsets done / to do per partition (from where the run started to the log's end when it
    started), the rate since it started and the time left at that rate. Offsets, not events:
    Kafka's offsets may have gaps (a direct producer's invalid records), so 'done' counts records.
    `reads`: the other streams the run reads whole, {stream: (starts, targets, committed)}: their
    partitions count too (named by stream: then the run's own are as well).
    `since`: (when, done then) where the process reading now took over (a resumed run: its
    checkpoint holds what an earlier process read): the rate counts only what was read since."""
    parts = []
    streams = [(None if not reads else run.stream, run.start_offsets, run.target_offsets, committed),
               *((name, *offsets) for name, offsets in sorted((reads or {}).items()))]
    for stream, starts, targets, reached_by in streams:
        for partition in sorted(targets):
            start, target = starts.get(partition, 0), targets[partition]
            reached = min(max(reached_by.get(partition, start), start), target)
            parts.append(PartitionProgress(partition, reached - start, target - start, stream))
    done, to_do = sum(p.done for p in parts), sum(p.to_do for p in parts)
    from_ms, done_then = (run.started_at_ms, 0) if since is None else since
    elapsed_s = (now_ms - from_ms) / 1000
    read = done - done_then
    rate = read / elapsed_s if read > 0 and elapsed_s > 0 else None
    eta = 0.0 if done >= to_do else (None if rate is None else (to_do - done) / rate)
    return Progress(tuple(parts), rate, eta)


def serving_caps(definitions: DefinitionStore, serving_pipeline: str, stream: str,
                 offsets: Mapping[int, PartitionOffsets]) -> dict[int, int]:
    """How far a run reads `stream` when it reads it only as far as the serving pipeline has: the
    serving pipeline's committed offset of each of its partitions (`offsets`, the log's), the
    partition's log start where it has read nothing yet."""
    committed = definitions.pipeline_offsets(serving_pipeline, stream)
    return {p: committed.get(p, o.start) for p, o in offsets.items()}


def carried_versions(kept: Sequence[tuple[str, TableVersion]], present: Collection[tuple[int, int]],
                     old: StreamDef, new: StreamDef) -> list[tuple[str, TableVersion]]:
    """For a run of a table that enriches streams (docs/reprocessing.md "A table that enriches
    streams"): the serving store's `kept` row versions of it whose records are no longer in its
    log (compacted away: their (partition, offset) is not `present`), carried into the run's
    output as the new definition `new` reads them: its string columns from the old row, "" where
    the old definition had none, its number columns likewise (null). The versions still in the log
    are left to the run, which reads them with the new definition. None when the key field
    changed: the old versions are keyed by another field."""
    if old.key_field != new.key_field:
        return []
    strings, numbers = row_columns(new)
    out = []
    for key, version in kept:
        if (version.partition, version.offset) in present:
            continue
        row = None if version.row is None else {**{c: version.row.get(c, "") for c in strings},
                                                **{c: version.row.get(c) for c in numbers}}
        out.append((key, TableVersion(version.valid_from_ms, version.partition, version.offset, row)))
    return out


def built_by_run(db, source: Side, catalog: Catalog, patterns: Sequence[PatternDef]) -> None:
    """SwitchRefused unless the run's output holds each pattern's state built with the definition
    the serving pipeline runs (its definition id, written by every batch): a pattern defined or
    changed after the run started is not in its output, and switching would lose its state."""
    for pattern in patterns:
        _built_as_now(db, source, "pattern_applied", "definition_id", "pattern", pattern.name,
                      pattern_definition_id(catalog, pattern), "pattern", "defined")


def views_built_by_run(db, source: Side, catalog: Catalog, views: Sequence[ViewDef]) -> None:
    """SwitchRefused unless the run's output holds each view built for its declaration as the
    serving pipeline will maintain it after the switch (declaration and both tables' columns)."""
    for view in views:
        _built_as_now(db, source, "view_definitions", "definition", "view_name", view.name,
                      definition_of(catalog, view), "view", "declared")


def _built_as_now(db, source: Side, table: str, column: str, key: str, name: str, expected: str,
                  kind: str, verb: str) -> None:
    row = db.execute(f"SELECT {column} FROM {source.table(table)} WHERE {key} = ?", (name,)).fetchone()
    if row is None or row[0] != expected:
        raise SwitchRefused(f"run {source.pipeline!r} did not build {kind} {name!r} as it is {verb} now"
                            f" ({verb} or changed since the run started, or no batch ran it): start a new run")


class ReprocessService:
    """Plans and records runs in the root store; `launch(run)` starts the pipeline for one (the CLI
    runs it in process, the API starts `sketchboard reprocess` as a child)."""

    def __init__(self, catalog: Catalog, definitions: DefinitionStore, registry: ConsumerRegistry, log: EventLog,
                 *, launch: Callable[[ReprocessRun], None] | None = None, clock: Callable[[], float] = time.time,
                 outputs: Outputs | None = None, patterns: PatternDefinitionStore | None = None):
        self.outputs = outputs
        self.patterns = patterns  # the patterns defined through the API: runs and switches follow them too
        self.switch_listeners: list[Callable[[str], None]] = []  # called with the stream after a switch
        self._stores: dict[str, PaneStore] = {}  # outputs opened for ?version= queries
        self._stores_lock = threading.Lock()
        self.catalog = catalog
        self.definitions = definitions
        self.registry = registry
        self.log = log
        self.launch = launch
        self.clock = clock
        # Window joins (patterns over two streams, views) are rebuilt by runs and switched in step
        # where a run can stop their other stream at chosen offsets: on both logs (the embedded
        # log's source takes caps; on Kafka, batches of the run's own: aggregates/bounded_batches.py).
        self.joins_rebuilt = True
        # Starts a run's synchronized switch in a process that can run its final batch (the API's child).
        self.launch_switch: Callable[[ReprocessRun], None] | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def full_catalog(self) -> Catalog:
        """The configured catalog with the patterns defined through the API, as the serving
        pipeline runs it (aggregates/pattern_definitions.py): what a run builds and a switch moves."""
        if self.patterns is None:
            return self.catalog
        _, stored = self.patterns.patterns()
        catalog, _ = catalog_with_patterns(self.catalog, [p.definition for p in stored],
                                           {p.name: p.version for p in stored})
        return catalog

    def changes(self) -> dict[str, tuple[str, str]]:
        """{stream: (serving version, configured version)} for the streams whose definition changed."""
        stored = {name: d.version for name, d in self.definitions.definitions().items()}
        return changed_streams(self.catalog, stored)

    def plan(self, stream: str) -> ReprocessRun:
        """The run that would start now; KeyError for an unknown stream, DefinitionUnchanged when
        the served output is built with the configured definition already, RunGoing when a run of
        the stream is going."""
        streams = versioned_streams(self.catalog)
        if stream not in streams:
            raise UnknownStream(f"unknown stream {stream!r}; streams read from the log: {', '.join(sorted(streams))}")
        definition = streams[stream]
        version = definition_version(definition, self.catalog)  # a view it is enriched through counts
        stored = self.definitions.definitions().get(stream)
        if stored is None:  # no pipeline has met the stream yet: its first run builds it as configured
            raise DefinitionUnchanged(
                f"stream {stream!r} has no served output yet: the pipeline builds it with the configured definition"
                f" (version {short_version(version)}) when it first runs; nothing to reprocess")
        if stored.version == version:
            raise DefinitionUnchanged(
                f"stream {stream!r} is served with its configured definition (version {short_version(version)}):"
                " change the streams configuration first, then reprocess")
        going = [r.id for r in self.runs() if r.stream == stream and r.active]
        if going:
            raise run_going(going[0], stream)
        now = self._now_ms()
        offsets = self.log.offsets(stream)
        starts = {p: o.start for p, o in offsets.items()}
        first = {p: (self.log.ingest_time_ms(stream, p, o.start) if o.end > o.start else None)
                 for p, o in offsets.items()}
        return ReprocessRun(
            id=run_id(stream, version), stream=stream, version=version, definition=stream_document(definition, self.catalog),
            state="starting", error=None, started_at_ms=now, updated_at_ms=now,
            complete_from_ms=complete_from_ms(starts, first, now, definition.retention),
            start_offsets=starts, target_offsets={p: o.end for p, o in offsets.items()})

    def start(self, stream: str) -> ReprocessRun:
        run = self.definitions.start_run(self.plan(stream))
        # The streams enriched from a table, which its run rebuilds reading them whole: in its progress too.
        enriched = enriched_streams(self.full_catalog(), stream)
        offsets = {name: self.log.offsets(name) for name in enriched}  # one read of the log per stream
        ends = {name: {p: o.end for p, o in parts.items()} for name, parts in offsets.items()}
        # Those read only as far as the serving pipeline has (sketchboard/reprocess.py run_caps).
        if self.outputs is not None:
            for name in aligned_enrichments(self.full_catalog(), stream) if enriched else []:
                ends[name] = serving_caps(self.definitions, self.outputs.serving_pipeline, name, offsets[name])
        self.definitions.record_reads(run.id, {name: ({p: o.start for p, o in parts.items()}, ends[name])
                                               for name, parts in offsets.items()})
        if self.launch is not None:
            try:
                self.launch(run)
            except Exception as exc:
                self.definitions.set_state(run.id, "failed", self._now_ms(), error=f"could not start: {exc}")
                raise
        return run

    def resume(self, stream: str, run_id_: str, *, launched: bool = False,
               launch_token: str | None = None) -> ReprocessRun:
        """The run `sketchboard reprocess STREAM --run ID` carries out, checked before any Spark:
        UnknownRun for an unknown id or a run of another stream; RunNotResumable for an output no
        pipeline reads into (a `previous-*` output a switch kept: switching back is a switch);
        RunGoing while it (or another run of the stream) is going in another process, unless
        `launched` (the API recorded it going and started this process for it: its child) or its
        process stopped reporting (RUN_STALE_MS: then it is failed, and resumed here). The run is
        then claimed (`starting`), so a second `--run` of it is refused until this one ends.
        `launched` is checked, not taken on trust: `launch_token` must be the claim the API recorded
        for its child (store/definitions.py take_launch), else NotLaunched; so a hand-typed
        `--launched` cannot skip the going-run check and drive one checkpoint from two processes."""
        run = self.run(run_id_)
        if run is None:
            known = ", ".join(r.id for r in self.runs() if r.stream == stream) or "none"
            raise UnknownRun(f"no reprocessing run {run_id_!r} (runs of stream {stream!r}: {known})")
        if run.stream != stream:
            raise UnknownRun(f"run {run.id!r} is a run of stream {run.stream!r}, not of {stream!r}")
        if run.id.startswith(PREVIOUS_PREFIX) or not is_run_pipeline(run.id):
            raise RunNotResumable(
                f"{run.id!r} is the output of {stream!r} that a switch replaced, kept to switch back to: no pipeline"
                f" reads into it. Switching back is a switch: POST /api/v1/reprocess/{run.id}/switch (admin), or the"
                " dashboard's Switch button")
        configured = versioned_streams(self.catalog).get(stream)
        if configured is not None and definition_version(configured, self.catalog) != run.version:
            # Its checkpoint would read on with another definition than the one its output was built
            # with so far, and the output would be labelled with the old version.
            raise RunNotResumable(
                f"run {run.id!r} builds version {short_version(run.version)} of {stream!r}, but the configured"
                f" definition is version {short_version(definition_version(configured, self.catalog))} now: start"
                f" a new run (`sketchboard reprocess {stream}`) or configure the run's definition again")
        if launched:
            return self.definitions.take_launch(run.id, launch_token)
        return self.definitions.claim_run(run.id, stream, self._now_ms())

    def runs(self) -> list[ReprocessRun]:
        self.fail_stale()
        return self.definitions.runs()

    def run(self, run_id_: str) -> ReprocessRun | None:
        self.fail_stale()
        return self.definitions.run(run_id_)

    def fail_stale(self) -> None:
        """Runs whose process stopped reporting (RUN_STALE_MS) are failed, saying so: a new run
        of the stream may start, the run may be dropped or resumed."""
        for stale in self.definitions.fail_stale(self._now_ms(), RUN_STALE_MS):
            logger.warning("reprocessing run %r: its process stopped reporting; marked failed", stale)

    def progress(self, run: ReprocessRun) -> Progress:
        """Its rate counts from where the process reading it now took it over (record_resume)."""
        committed = self.registry.offsets(run.id)
        reads = {name: (starts, targets, committed.get(name, {}))
                 for name, (starts, targets) in self.definitions.run_reads(run.id).items()}
        return run_progress(run, committed.get(run.stream, {}), self._now_ms(), reads,
                            self.definitions.resumed(run.id))

    def record_resume(self, run: ReprocessRun) -> None:
        """The process reading `run` takes it over now: what its checkpoint holds was read before
        (by an earlier process, for a resumed run) and is not counted in its rate."""
        self.definitions.record_resume(run.id, self._now_ms(), self.progress(run).done)

    # -- versions, switch, drop

    def serving_version(self, stream: str) -> str | None:
        stored = self.definitions.definitions().get(stream)
        return None if stored is None else stored.version

    def versions(self, stream: str) -> list[dict]:
        """The outputs of a stream that can be queried (?version=): the served one (the root's) and
        each run's or previous output whose namespace is there, newest first after the served."""
        out = []
        stored = self.definitions.definitions().get(stream)
        if stored is not None:
            out.append({"version": stored.version, "namespace": ROOT, "serving": True})
        for run in reversed(self.runs()):
            if run.stream == stream and (stored is None or run.version != stored.version) \
                    and self.outputs is not None and self.outputs.storage.exists(run.id):
                out.append({"version": run.version, "namespace": run.id, "serving": False})
        seen = {v["version"] for v in out}
        for namespace, _, built in self._enriched_outputs(stream):  # built by a run of a table it is enriched from
            if built.version not in seen:
                seen.add(built.version)
                out.append({"version": built.version, "namespace": namespace, "serving": False})
        return out

    def output(self, stream: str, version: str) -> tuple[str, dict]:
        """(namespace, declaration) of the output of `stream` built with `version` (the full
        version or a prefix of at least 8 characters); KeyError naming the versions there are."""
        stored = self.definitions.definitions().get(stream)
        if len(version) >= 8:
            if stored is not None and stored.version.startswith(version):
                return ROOT, stored.definition
            for run in reversed(self.runs()):
                if run.stream == stream and run.version.startswith(version) and self.outputs is not None \
                        and self.outputs.storage.exists(run.id):
                    return run.id, run.definition
        if len(version) >= 8:
            # Built by a table's run: by the stream's version there, or by the table's (the stream's
            # own version is the same when only the table's definition changed).
            for namespace, table_version, built in self._enriched_outputs(stream):
                if built.version.startswith(version) or table_version.startswith(version):
                    return namespace, built.definition
        known = ", ".join(short_version(v["version"]) for v in self.versions(stream)) or "none"
        raise KeyError(f"stream {stream!r} has no output of version {version!r} (its versions: {known})")

    def _enriched_outputs(self, stream: str) -> list[tuple[str, str, StoredDefinition]]:
        """The outputs of `stream` built by runs of a table it is enriched from (and the outputs
        their switches replaced), newest first: (namespace, the table's version there, the
        definition the stream was built with there). A table's run rebuilds the stream too
        (docs/reprocessing.md "A table that enriches streams")."""
        from catalog.dependents import enriched_streams

        if self.outputs is None:
            return []
        out = []
        for run in reversed(self.runs()):
            if stream in enriched_streams(self.catalog, run.stream) and self.outputs.storage.exists(run.id):
                definitions = DefinitionStore(self.output_store(run.id).side_db())
                try:
                    found = definitions.definitions().get(stream)
                finally:
                    definitions.close()
                if found is not None:
                    out.append((run.id, run.version, found))
        return out

    def output_store(self, namespace: str) -> PaneStore:
        """The store of a versioned output (not the root), opened once and kept for later queries."""
        outputs = self._needs_outputs()
        with self._stores_lock:
            store = self._stores.get(namespace)
            if store is None:
                store = self._stores[namespace] = outputs.open_store(namespace)
            return store

    def close_outputs(self, namespace: str | None = None) -> None:
        with self._stores_lock:
            names = list(self._stores) if namespace is None else [namespace]
            for name in names:
                store = self._stores.pop(name, None)
                if store is not None:
                    store.close()

    def _needs_outputs(self) -> Outputs:
        if self.outputs is None:
            raise SwitchRefused("this process cannot reach the reprocessing outputs")
        return self.outputs

    def switch(self, run_id_: str, align: Aligner | None = None) -> dict:
        """Make the run's output the served one (docs/reprocessing.md): KeyError for an unknown run,
        SwitchRefused (with why) unless it has caught up and its output is there and not served.
        A stream feeding a window join, a pattern over two streams or a view is switched in step (`align`:
        the run's final batch; without it NeedsAlignment): the serving pipeline's commits are held,
        the run reads their other streams exactly as far as the serving pipeline has, and the
        switch (which checks that under the commit lock) moves their state and derived streams with
        the stream (a view's changelog gets the difference: store/switch.py move_view)."""
        outputs = self._needs_outputs()
        run = self.run(run_id_)
        if run is None:
            raise KeyError(f"no reprocessing run {run_id_!r}")
        stored = self.definitions.definitions().get(run.stream)
        if stored is not None and stored.version == run.version:
            raise SwitchRefused(f"stream {run.stream!r} is served with version {short_version(run.version)} already")
        if run.state != "caught_up":
            progress = self.progress(run)
            why = f": {run.error}" if run.error else ""
            raise SwitchRefused(
                f"run {run.id!r} is {run.state}{why} ({progress.done}/{progress.to_do} offsets read): a switch needs"
                " a run that has caught up with the log's end as of its start")
        if not outputs.storage.exists(run.id):
            raise SwitchRefused(f"the output of run {run.id!r} is gone (dropped)")
        catalog = self.full_catalog()
        # The streams enriched from a table are rebuilt by its runs on both logs (on Kafka in
        # batches of the run's own: sketchboard/reprocess.py run_end_offsets).
        dependents = refused_dependents(catalog, run.stream, joins_rebuilt=self.joins_rebuilt)
        if dependents:  # their state is keyed by another name: it would stay the old way, fed twice
            aligned = refused_dependents(catalog, run.stream, joins_rebuilt=True)
            unaligned = ", ".join(d for d in dependents if d not in aligned and not d.startswith("enrichment of"))
            why = "" if self.joins_rebuilt or not unaligned else (
                f" (on this log a run cannot stop the other stream of {unaligned}"
                " at the serving pipeline's offsets, which switching in step needs)")
            raise SwitchRefused(
                f"stream {run.stream!r} also feeds {', '.join(dependents)}, which also read(s) another stream, whose"
                " state a run does not rebuild: a switch would leave it built the old way and feed it the records"
                f" since the run's end again{why}")
        if stored is None:
            raise SwitchRefused(f"stream {run.stream!r} has no served output yet: start the pipeline first")
        joins = aligned_joins(catalog, run.stream) if self.joins_rebuilt else []
        two_stream = aligned_patterns(catalog, run.stream) if self.joins_rebuilt else []
        views = aligned_views(catalog, run.stream) if self.joins_rebuilt else []
        enriched = self._enriched(run, catalog)
        # The joins and patterns the enriched streams feed: rebuilt by the run, switched in step.
        fed_joins, fed_patterns = enrichment_feeds(catalog, run.stream)
        joins += [j for j in fed_joins if j not in joins]
        two_stream += [p for p in fed_patterns if p not in two_stream]
        patterns = [p for p in catalog.patterns if p in (*rebuilt_patterns(catalog, run.stream), *two_stream)]
        others = capped_streams(catalog, run.stream)
        if not others:
            if not run.id.startswith(PREVIOUS_PREFIX) and self._behind_serving(run, enriched):
                if align is None:
                    raise NeedsAlignment(
                        f"run {run.id!r} has read less of {run.stream!r} than the serving pipeline: its switch"
                        " reads on to the log's end first, so readers never see the new output behind the served"
                        f" one; run it with `sketchboard reprocess {run.stream} --run {run.id} --switch`")
                self._read_on(run, align, enriched)
            return self._switch(run, stored, catalog, patterns, enriched=enriched)
        # Read from the other streams too (a join's, a pattern's over two streams, a view's other
        # table, an enriched stream read only as far as the serving pipeline has): switched in step.
        fed = _fed_text(joins, two_stream, views, [s for s in enriched if s in others])
        self.refuse_unswitchable(run.stream, catalog)
        if run.id.startswith(PREVIOUS_PREFIX):  # kept by a switch: no pipeline of its own can go on
            raise SwitchRefused(f"{run.id!r} is a replaced output of {run.stream!r}, which feeds {fed}: their state"
                                " stopped when it was replaced; to go back, configure the old definition and reprocess")
        read = self._definitions_built_by(run.id)
        missing = [s for s in others if s not in read]
        if missing:
            raise SwitchRefused(f"run {run.id!r} did not read {', '.join(map(repr, missing))} (started before runs"
                                f" rebuilt {fed}): start a new run")
        # The run built the other streams as they were configured then: the state it moves must be
        # built with the definitions the serving pipeline computes them with (one of them changed,
        # or switched, since the run started: its state holds their records the other way).
        served = self.definitions.definitions()
        built_otherwise = [f"{s!r} (built with {short_version(read[s].version)}, served with"
                           f" {short_version(served[s].version)})" for s in others
                           if s not in enriched and s in served and read[s].version != served[s].version]
        if built_otherwise:
            raise SwitchRefused(f"run {run.id!r} read {', '.join(built_otherwise)} with another definition than the"
                                f" serving pipeline's, for {fed}: start a new run")
        if align is None:
            raise NeedsAlignment(
                f"stream {run.stream!r} feeds {fed}: its switch holds the serving"
                " pipeline while the run reads the other stream(s) as far as it has; run it with"
                f" `sketchboard reprocess {run.stream} --switch` (or turn reprocess_auto_switch on)")
        return self._aligned_switch(run, stored, catalog, patterns, joins, others, align, views, enriched)

    def refuse_unswitchable(self, stream: str, catalog: Catalog | None = None) -> None:
        """SwitchRefused when a run of `stream` could not be switched because another stream it is
        read with (a join's, a pattern's over two streams, a view's other table: `capped_streams`)
        has a changed definition of its own: the serving pipeline computes that one as stored, the
        run as configured. Checked by the switch, and by `sketchboard reprocess --switch` before its
        run starts Spark. When each stream's change waits for the other's switch (both streams of a
        join changed), the way out is one change at a time, which the reason says."""
        catalog = catalog or self.full_catalog()
        others = capped_streams(catalog, stream)
        if not others:
            return
        changes = self.changes()
        changed = sorted((set(others) - set(enriched_streams(catalog, stream))) & set(changes))
        if not changed:
            return
        fed = _fed_text(aligned_joins(catalog, stream), aligned_patterns(catalog, stream),
                        aligned_views(catalog, stream)) or "its dependents"
        names = ", ".join(map(repr, changed))
        waits = [s for s in changed if stream in capped_streams(catalog, s)]  # that one's switch waits for this one
        how = (f"switch one at a time: configure {names} as served (version"
               f" {', '.join(short_version(changes[s][0]) for s in changed)}) again, reprocess {stream!r} and switch"
               f" it, then configure {names} as you want and reprocess and switch {'it' if len(changed) == 1 else 'them'}"
               ) if waits else f"reprocess and switch {names} first"
        raise SwitchRefused(f"the definition of {names} (read by {fed} with {stream!r}) changed too, and the serving"
                            f" pipeline computes it as stored: {how}")

    def start_switch(self, run_id_: str) -> ReprocessRun:
        """A synchronized switch in the background (the API, after `switch` raised NeedsAlignment):
        the run is marked running (a second request is refused meanwhile) and `launch_switch` starts
        `sketchboard reprocess STREAM --run ID --switch`, which reads on from the run's checkpoint
        and switches in step. NeedsAlignment again when no process can be started here."""
        run = self.run(run_id_)
        if self.launch_switch is None or run is None:
            raise NeedsAlignment(f"run {run_id_!r} needs a synchronized switch, which this process cannot start")
        self.definitions.set_state(run.id, "running", self._now_ms())
        try:
            self.launch_switch(run)
        except Exception as exc:
            self.definitions.set_state(run.id, "failed", self._now_ms(), error=f"could not start the switch: {exc}")
            raise
        return self.run(run.id)

    def _behind_serving(self, run: ReprocessRun, enriched=()) -> bool:
        """Whether the serving pipeline has read further than the run in some partition of its
        stream (or of a stream its switch moves with it, `enriched`): the run stopped at the log's
        end as of its start (or its last read-on), and the live pipeline went on meanwhile."""
        outputs = self._needs_outputs()
        store = outputs.open_store(run.id)
        try:
            read = store.progress(run.id, row_counts=False).end_offsets
        finally:
            store.close()
        return any(read.get(stream, {}).get(p, 0) < at for stream in (run.stream, *enriched)
                   for p, at in self.definitions.pipeline_offsets(outputs.serving_pipeline, stream).items())

    def _read_on(self, run: ReprocessRun, align: Aligner, enriched=()) -> None:
        """Before a switch, the run reads on to the log's end now (`align` with no other stream to
        stop), a few times while the serving pipeline is still further: after the switch the
        serving pipeline goes on from the run's offsets, so readers see the new output as far as
        the live one, not where the run first caught up (minutes or days behind). What the serving
        pipeline commits between the last read-on and the switch (a batch or so) it reads again."""
        for attempt in range(ALIGN_ATTEMPTS):
            started = time.monotonic()
            align(run, {})
            logger.info("switch of %r: read on to the log's end in %.1f s (try %d)", run.id,
                        time.monotonic() - started, attempt + 1)
            if not self._behind_serving(run, enriched):
                return

    def _aligned_switch(self, run: ReprocessRun, stored, catalog: Catalog, patterns, joins, others: list[str],
                        align: Aligner, views=(), enriched=None) -> dict:
        outputs = self._needs_outputs()
        pipeline = outputs.serving_pipeline
        with outputs.storage.transaction([]) as (db, _):  # under the commit lock: no commit is half way
            held = db.execute("SELECT run_id FROM switch_holds WHERE pipeline = ?", (pipeline,)).fetchone()
            if held is not None and held[0] != run.id:
                raise SwitchRefused(f"pipeline {pipeline!r} is held by the switch of run {held[0]!r}: try again later")
            if held is None:
                db.execute("INSERT INTO switch_holds (pipeline, run_id, at_ms) VALUES (?, ?, ?)",
                           (pipeline, run.id, self._now_ms()))
        held = time.monotonic()
        try:
            why = None
            for attempt in range(ALIGN_ATTEMPTS):
                offsets = {s: self.definitions.pipeline_offsets(pipeline, s) for s in others}
                aligning = time.monotonic()
                align(run, offsets)
                try:
                    switched = self._switch(run, stored, catalog, patterns, joins=joins, aligned=others, views=views,
                                            enriched=enriched)
                except NotAligned as exc:
                    why = exc
                    logger.warning("switch of %r: not aligned after the final batch (try %d): %s", run.id,
                                   attempt + 1, exc)
                    continue
                now = time.monotonic()
                logger.info("switch of %r: pipeline %r held %.1f s (the run's final batch %.1f s)", run.id, pipeline,
                            now - held, now - aligning)
                return {**switched, "held_s": round(now - held, 3)}
            raise SwitchRefused(f"run {run.id!r} could not be aligned with pipeline {pipeline!r}: {why}")
        finally:  # released by the switch's own transaction when it went through
            with outputs.storage.transaction([]) as (db, _):
                db.execute("DELETE FROM switch_holds WHERE pipeline = ? AND run_id = ?", (pipeline, run.id))

    def _enriched(self, run: ReprocessRun, catalog: Catalog) -> dict[str, tuple[str | None, list[str]]]:
        """The streams enriched from the run's table that its switch moves with it (catalog/dependents.py
        enriched_streams), each with the version the root serves it with and its derived streams;
        SwitchRefused unless the run's output holds each built as configured now (a reprocessing
        run) or at all (a replaced output, switched back to)."""
        enriched = enriched_streams(catalog, run.stream)
        if not enriched:
            return {}
        built = self._definitions_built_by(run.id)
        served = self.definitions.definitions()
        out = {}
        for name in enriched:
            mine = built.get(name)
            if mine is None or (not run.id.startswith(PREVIOUS_PREFIX)
                                and mine.version != definition_version(catalog.streams[name], catalog)):
                raise SwitchRefused(f"run {run.id!r} did not build stream {name!r}, enriched from {run.stream!r}, as it"
                                    " is declared now (declared or changed since the run started, or the run started"
                                    " before runs rebuilt enriched streams): start a new run")
            old = served.get(name)
            derived = moved_with(name, *([] if old is None else [stored_stream(old.definition)]),
                                 stored_stream(mine.definition))
            out[name] = (None if old is None else old.version, derived)
        return out

    def _definitions_built_by(self, output: str) -> dict[str, StoredDefinition]:
        """The stream definitions an output's batches were computed with (its stream_definitions)."""
        store = self._needs_outputs().open_store(output)
        definitions = DefinitionStore(store.side_db())
        try:
            return definitions.definitions()
        finally:
            definitions.close()
            store.close()

    def _switch(self, run: ReprocessRun, stored, catalog: Catalog, patterns, *, joins=(), aligned=(),
                views=(), enriched=None) -> dict:
        outputs = self._needs_outputs()
        now = self._now_ms()
        previous = run_id(run.stream, stored.version, PREVIOUS_PREFIX)
        store = outputs.open_store(previous)  # makes its tables
        try:
            DefinitionStore(store.side_db()).close()  # and stream_definitions
        finally:
            store.close()
        # The source's tables as this Sketchboard has them: a kept output written by an older one
        # lacks those added since (the copy reads every table of STREAM_TABLES), which opening adds.
        outputs.open_store(run.id).close()
        with outputs.storage.transaction([run.id, previous]) as (db, qualifiers):
            previous_side = Side(qualifiers[previous], previous)
            source = Side(qualifiers[run.id], run.id)
            built_by_run(db, source, catalog, patterns)
            views_built_by_run(db, source, catalog, views)
            derived = [*moved_with(run.stream, stored_stream(stored.definition), stored_stream(run.definition)),
                       *(matches_stream_name(p.name) for p in patterns), *(j.name for j in joins),
                       *(v.name for v in views)]  # a view's changes, a derived stream of its own
            try:
                offsets = switch_stream(db, run.stream, root=Side("", outputs.serving_pipeline),
                                        source=source, previous=previous_side,
                                        serving_version=stored.version, now_ms=now, derived=derived,
                                        patterns=[p.name for p in patterns], joins=[j.name for j in joins],
                                        aligned=aligned, views=[v.name for v in views])
                if enriched:  # the streams enriched from the table, rebuilt by the run, and its row versions
                    switch_enriched(db, run.stream, {name: v for name, (v, _) in enriched.items()},
                                    root=Side("", outputs.serving_pipeline), source=source, previous=previous_side,
                                    now_ms=now, derived=[d for _, ds in enriched.values() for d in ds])
            except NotAligned:
                raise
            except SwitchConflict as exc:
                raise SwitchRefused(str(exc)) from None
            old_offsets = stream_offsets(db, run.stream, previous_side)
            # The replaced output, as a finished run (in the same transaction): switching back is a switch to it.
            insert_run(db, ReprocessRun(
                id=previous, stream=run.stream, version=stored.version, definition=stored.definition,
                state="caught_up", error=None, started_at_ms=now, updated_at_ms=now,
                complete_from_ms=now - stored_stream(stored.definition).retention, start_offsets=old_offsets,
                target_offsets=old_offsets))
        for listener in self.switch_listeners:
            for name in (run.stream, *(enriched or {})):
                listener(name)
        out = {"stream": run.stream, "serving_version": run.version, "from_run": run.id, "previous": previous,
               "offsets": {str(p): o for p, o in sorted(offsets.items())}, "at_ms": now}
        if enriched:
            out["enriched"] = sorted(enriched)  # moved with the table (kept in `previous` too)
        return out

    def drop(self, run_id_: str) -> None:
        """Delete a run's (or previous) output: namespace, checkpoint, registry entry, the run."""
        outputs = self._needs_outputs()
        run = self.run(run_id_)
        if run is None:
            raise KeyError(f"no reprocessing run {run_id_!r}")
        if run.active:
            raise SwitchRefused(f"run {run.id!r} is still going ({run.state}): let it catch up or fail first")
        if self._last_output_of_served_version(run):
            raise SwitchRefused(f"version {short_version(run.version)} of stream {run.stream!r} is the served one:"
                                " switch to another before dropping it")
        self.close_outputs(run.id)
        outputs.storage.drop(run.id)
        outputs.remove_checkpoint(run.id)
        self.registry.forget(run.id)
        self.definitions.delete_run(run.id)

    def _last_output_of_served_version(self, run: ReprocessRun) -> bool:
        """Whether `run`'s output is the only one kept of the version its stream is served with.
        Switching back and then to the run again leaves two (`previous-<stream>-<v8>` and the run's
        own, both copies of what the root was switched to): either may go, not both."""
        if self.serving_version(run.stream) != run.version:
            return False
        storage = self._needs_outputs().storage
        return not any(other.id != run.id and other.stream == run.stream and other.version == run.version
                       and storage.exists(other.id) for other in self.definitions.runs())

    def drop_unused(self, max_age_ms: int) -> list[str]:
        """Drop every output that is neither served nor going and whose run last changed state at
        least `max_age_ms` ago (setting reprocess_drop_after); the ids dropped."""
        now, dropped = self._now_ms(), []
        for run in self.runs():
            if run.active or now - run.updated_at_ms < max_age_ms:
                continue
            try:
                if self._last_output_of_served_version(run):
                    continue
                self.drop(run.id)
            except (KeyError, SwitchRefused):  # gone or switched to meanwhile (another replica)
                continue
            except Exception:  # one output that cannot be dropped keeps the others from staying forever
                logger.exception("reprocess_drop_after: the output %r could not be dropped (tried again next round)",
                                 run.id)
                continue
            dropped.append(run.id)
        return dropped

    def to_json(self, run: ReprocessRun) -> dict:
        return {"id": run.id, "stream": run.stream, "version": run.version, "state": run.state,
                "error": run.error, "started_at_ms": run.started_at_ms, "updated_at_ms": run.updated_at_ms,
                "complete_from_ms": run.complete_from_ms, "namespace": run.id,
                "serving": self.serving_version(run.stream) == run.version,
                "progress": self.progress(run).to_json()}
