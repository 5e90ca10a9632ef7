"""`sketchboard reprocess STREAM` and the API's starter of runs (issue 16; docs/reprocessing.md).

A run is one more named pipeline of the log (fan-out, store/consumers.py): the stream alone, with
its configured definition, from the earliest retained offset, into the namespace named by the
run's id, at full speed (AvailableNow) beside the live pipeline. Its progress is read from the
consumer registry's copies of its committed offsets, by this command's progress bar and by the
API alike."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import TextIO

from aggregates.reprocess import RUN_HEARTBEAT_MS, Outputs, Progress, ReprocessService, serving_caps
from catalog import Catalog
from catalog.dependents import aligned_joins, aligned_patterns, capped_streams, rebuilt_patterns
from catalog.dependents import aligned_views, enriched_streams, enrichment_feeds
from catalog.enrichment import enrichment_tables
from catalog.versions import short_version, stream_document
from sketchboard.settings import Settings
from store.definitions import DefinitionStore, ReprocessRun

logger = logging.getLogger("sketchboard.reprocess")
BAR_WIDTH = 30
LINE_EVERY_S = 10.0  # progress as whole lines, not a bar, where the output is not a terminal


class Interrupted(BaseException):
    """SIGTERM or SIGINT during `sketchboard reprocess` (sketchboard/cli.py cmd_reprocess): raised in
    the main thread like Ctrl-C's KeyboardInterrupt, so the run is recorded failed and its pipeline
    stopped on the way out. `run`: the run it interrupted, once known."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.run: ReprocessRun | None = None

    def __str__(self) -> str:
        return f"interrupted ({signal.Signals(self.signum).name})"


_deferring = threading.Event()  # set while a run is claimed: a stop signal then waits for its `try`
_deferred: list[int] = []


def interrupt(signum: int) -> None:
    """The CLI's SIGTERM and SIGINT handler: Interrupted, or, while the run is being claimed,
    remembered and raised once the claim is made (run_reprocess)."""
    if _deferring.is_set():
        _deferred.append(signum)
        return
    raise Interrupted(signum)


def failure_text(exc: BaseException, run: ReprocessRun) -> str:
    """The error a failed run records: a signal's name and how to resume, not "KeyboardInterrupt: "."""
    if isinstance(exc, KeyboardInterrupt):
        exc = Interrupted(signal.SIGINT)
    if isinstance(exc, Interrupted):
        return f"{exc}: resume it with `sketchboard reprocess {run.stream} --run {run.id}`, or start a new run"
    return f"{type(exc).__name__}: {exc}"


class ProgressOutput:
    """The progress line on `out`. On a terminal, one bar rewritten in place (`\r`), whose line is
    ended before a log record is written (`filter`, put on the log's handlers while the run goes:
    the record starts on a line of its own, the next bar on the next line). Elsewhere (a file, a
    pipe, the API's output) whole lines, one every `every_s` and the last."""

    def __init__(self, out: TextIO, every_s: float = LINE_EVERY_S, clock=time.monotonic):
        self.out = out
        isatty = getattr(out, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self.every_s = every_s
        self.clock = clock
        self._open = False  # a bar without its newline is on the terminal's last line
        self._last: float | None = None
        self._lock = threading.Lock()

    def show(self, line: str, *, final: bool = False) -> None:
        with self._lock:
            if self.tty:
                print("\r" + line, end="\n" if final else "", file=self.out, flush=True)
                self._open = not final
            elif final or self._last is None or self.clock() - self._last >= self.every_s:
                print(line, file=self.out, flush=True)
                self._last = self.clock()

    def end_line(self) -> None:
        with self._lock:
            if self._open:
                print(file=self.out, flush=True)
                self._open = False

    def filter(self, record: logging.LogRecord) -> bool:  # a logging filter: the bar's line ends first
        self.end_line()
        return True

    def __enter__(self) -> "ProgressOutput":
        if self.tty:
            for handler in logging.getLogger().handlers:
                handler.addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self)
        self.end_line()


def build_reprocess_service(settings: Settings, catalog: Catalog, root_store, log, *, launch=None) -> ReprocessService:
    from sketchboard.wiring import open_consumer_registry

    from store.pattern_definitions import PatternDefinitionStore

    service = ReprocessService(catalog, DefinitionStore(root_store.side_db()),
                               open_consumer_registry(settings, root_store), log, launch=launch,
                               outputs=reprocess_outputs(settings), patterns=PatternDefinitionStore(root_store.side_db()))
    if launch is not None:  # the API: a synchronized switch runs in a child too (it needs Spark)
        service.launch_switch = child_launcher(settings, switch=True)
    return service


def reprocess_outputs(settings: Settings) -> Outputs:
    """Where the versioned outputs are, for switches, drops and ?version= queries."""
    import shutil

    from sketchboard.wiring import open_store

    if settings.store_backend == "postgres":
        from store.postgres.namespaces import PostgresNamespaces

        storage = PostgresNamespaces(settings.postgres_dsn)
    else:
        from store.namespace_storage import SqliteNamespaces

        storage = SqliteNamespaces(settings.data_dir)
    return Outputs(storage=storage, open_store=lambda namespace: open_store(settings, namespace),
                   serving_pipeline=settings.pipeline_name,
                   remove_checkpoint=lambda pipeline: shutil.rmtree(settings.checkpoint_dir_of(pipeline),
                                                                    ignore_errors=True))


# Where the API's child finds its run's claim (store/definitions.py record_launch): in its
# environment, not its arguments, so it is neither in `ps` nor in a command line copied by hand.
LAUNCH_TOKEN_ENV = "SKETCHBOARD_REPROCESS_LAUNCH"


def child_launcher(settings: Settings, *, switch: bool = False):
    """For the API: start `sketchboard reprocess STREAM --run RUN` (`--switch`: then switch to it)
    as a child process on the same settings (its output goes to this process's; the run's state
    and progress to the store)."""
    def launch(run: ReprocessRun) -> None:
        import os

        env = {**os.environ, "SKETCHBOARD_DATA_DIR": str(settings.data_dir),
               "SKETCHBOARD_STREAMS_CONFIG": str(settings.streams_config),
               LAUNCH_TOKEN_ENV: record_launch(settings, run.id)}
        # --launched: the API recorded the run going for this child, which shows the claim handed to
        # it (a `--run` of a going run is refused otherwise, and so is a `--launched` without it)
        child = subprocess.Popen([sys.executable, "-m", "sketchboard.cli", "reprocess", run.stream, "--run", run.id,
                                  "--launched", *(["--switch"] if switch else [])], env=env)
        threading.Thread(target=failed_if_it_dies, args=(settings, run.id, child), name=f"watch-{run.id}",
                         daemon=True).start()

    return launch


def record_launch(settings: Settings, run_id: str) -> str:
    """The claim of going run `run_id` for the child about to be started (store/definitions.py)."""
    from sketchboard.wiring import open_store

    store = open_store(settings)
    try:
        definitions = DefinitionStore(store.side_db())
        token = definitions.record_launch(run_id, int(time.time() * 1000))
        definitions.close()
        return token
    finally:
        store.close()


def failed_if_it_dies(settings: Settings, run_id: str, child: subprocess.Popen) -> None:
    """A child that exits with an error before recording one (settings or a log it cannot use: it
    fails before its pipeline starts) would leave its run `starting` for ever, and every new run
    of the stream refused as going, its drop too: the API records it failed, with the status."""
    status = child.wait()
    if status == 0:
        return
    from sketchboard.wiring import open_store

    store = open_store(settings)
    try:
        definitions = DefinitionStore(store.side_db())
        run = definitions.run(run_id)
        if run is not None and run.active:
            definitions.set_state(run_id, "failed", int(time.time() * 1000),
                                  error=f"its process (sketchboard reprocess) exited with status {status}: its reason"
                                        " is in the API process's output")
        definitions.close()
    finally:
        store.close()


def stream_catalog(catalog: Catalog, stream: str, *, with_joins: bool = True) -> Catalog:
    """The catalog of a run: the stream alone (derived streams generated again), with its metrics,
    and the tables it is enriched from (their versions are rebuilt from the log: docs/tables.md);
    through a view: the view's two tables, and the view (its declaration names the columns); the
    patterns that read the stream alone (catalog/dependents.py: a switch moves them with it),
    those defined through the API with their stored versions (their state's definition id).
    `with_joins` (the default): the window joins, the patterns over two streams and the views
    the stream feeds, and their other streams with their tables, which the run reads only as far as the
    serving pipeline has (`run_caps`) so that a synchronized switch can move their state with the
    stream; and the streams enriched from the table (catalog/dependents.py enriched_streams),
    read whole (or capped, capped_streams), with their tables."""
    joins = aligned_joins(catalog, stream) if with_joins else []
    two_stream = aligned_patterns(catalog, stream) if with_joins else []
    table_views = aligned_views(catalog, stream) if with_joins else []  # a view of the table: rebuilt too
    enriched = with_joins
    # The streams enriched from the table, rebuilt whole (docs/reprocessing.md "A table that
    # enriches streams"), with the joins and patterns they feed and those's other streams.
    fed_joins, fed_patterns = enrichment_feeds(catalog, stream) if enriched else ([], [])
    joins += [j for j in fed_joins if j not in joins]
    two_stream += [p for p in fed_patterns if p not in two_stream]
    read = [stream, *(enriched_streams(catalog, stream) if enriched else [])]
    read += [s for s in (capped_streams(catalog, stream) if with_joins else []) if s not in read]
    metrics = {name: m.model_dump(mode="json", exclude_defaults=True) for name, m in catalog.metrics.items()
               if m.stream in read or m.stream in {v.name for v in table_views}}
    streams = {name: stream_document(catalog.streams[name]) for name in read}
    views = {v.name: v.model_dump(mode="json", exclude={"name"}) for v in table_views}
    for name in read:
        for decl in catalog.streams[name].enrich:
            for table in enrichment_tables(catalog, decl):
                streams.setdefault(table, stream_document(catalog.streams[table]))
            if decl.table in catalog.views:
                views[decl.table] = catalog.views[decl.table].model_dump(mode="json", exclude={"name"})
    built = [*rebuilt_patterns(catalog, stream), *two_stream]  # those the enriched streams feed among two_stream
    patterns = [p for p in catalog.patterns if p in built]
    run = Catalog(streams=streams, metrics=metrics, views=views,
                  joins=[j.model_dump(mode="json", exclude_defaults=True) for j in joins],
                  patterns=[p.model_dump(mode="json", exclude_defaults=True) for p in patterns])
    defined = {p.name for p in patterns}
    return run.model_copy(update={"defined_patterns": {n: v for n, v in catalog.defined_patterns.items()
                                                       if n in defined}})


def seed_table_versions(catalog: Catalog, stream: str, root, out, log=None) -> int:
    """Copy the serving store's kept row versions of the tables `stream` is enriched from into the
    run's output store, before its first batch. A table's log is compacted (only each key's newest
    record survives), so versions rebuilt from it alone would miss the older rows the live run
    enriched older events with; the versions the serving store kept are exactly those (pruned
    only behind the streams' retention and max_future_skew, where no accepted event looks up). The run's own
    reading of the table's log adds the same versions again (same log position: kept once).
    Returns how many versions were copied."""
    run = stream_catalog(catalog, stream)  # its other streams' tables too, when it reads a join's
    tables = sorted({t for s in run.streams.values() for decl in s.enrich for t in enrichment_tables(catalog, decl)})
    # A run of a table rebuilds that table's versions from its log with its new definition: the
    # kept ones were built with the old (other columns, maybe another key) and would be kept over
    # the run's own at the same log position (docs/reprocessing.md "A table that enriches streams").
    tables = [t for t in tables if t != stream]
    versions = {t: root.table_versions(t) for t in tables}
    if log is not None and enriched_streams(catalog, stream):
        carried = carried_table_versions(catalog, stream, root, log)
        if carried:
            versions[stream] = carried
    if any(versions.values()):
        out.seed_table_versions({t: v for t, v in versions.items() if v})
    return sum(len(v) for v in versions.values())


def carried_table_versions(catalog: Catalog, table: str, root, log) -> list:
    """The serving store's versions of `table` whose records compaction removed from its log, as
    the table's configured definition reads them (aggregates/reprocess.py carried_versions): a run
    of the table rebuilds the others from its log."""
    from aggregates.reprocess import carried_versions
    from catalog.versions import stored_stream
    from ingest.log.records import OFFSET

    definitions = DefinitionStore(root.side_db())
    try:
        stored = definitions.definitions().get(table)
    finally:
        definitions.close()
    kept = root.table_versions(table)
    if stored is None or not kept:
        return []
    new = catalog.streams[table]
    present = {(partition, offset) for partition, o in log.offsets(table).items()
               for batch in log.read(new, partition, o.start, o.end)
               for offset in batch.column(OFFSET).to_pylist()}
    return carried_versions(kept, present, stored_stream(stored.definition), new)


def format_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def progress_line(run: ReprocessRun, progress: Progress) -> str:
    """`[#######-----]  42.0%  1234/2938 offsets  5120 events/s  ETA 3s  p0 600/1000 p1 634/1938`"""
    filled = int(round(progress.fraction * BAR_WIDTH))
    rate = "-" if progress.events_per_s is None else f"{progress.events_per_s:.0f}"
    eta = "-" if progress.eta_s is None else f"{progress.eta_s:.0f}s"
    parts = " ".join(f"{'' if p.stream in (None, run.stream) else p.stream + ' '}p{p.partition} {p.done}/{p.to_do}"
                     for p in progress.partitions)
    return (f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * progress.fraction:5.1f}%"
            f"  {progress.done}/{progress.to_do} offsets  {rate} events/s  ETA {eta}  {parts}")


def run_caps(settings: Settings, catalog: Catalog, stream: str, definitions: DefinitionStore, log) -> dict:
    """How far a run reads the other streams of the joins `stream` feeds (and the enriched streams
    it rebuilds but aligns, catalog/dependents.py capped_streams): as far as the serving pipeline
    has committed (the log's start where it has read nothing yet), so the run's join state never
    holds a record the serving pipeline has not read (a synchronized switch then lets the run
    read on to exactly where the serving pipeline stands)."""
    return {other: serving_caps(definitions, settings.pipeline_name, other, log.offsets(other))
            for other in capped_streams(catalog, stream)}


def run_end_offsets(settings: Settings, catalog: Catalog, stream: str, definitions: DefinitionStore,
                    log) -> dict | None:
    """A run's `end_offsets` (aggregates/pipeline.py PipelineConfig): its caps (`run_caps`); None
    (the source plans the batches) unless it has caps or enriches a stream from a table it reads
    (a table's run rebuilding the streams it enriches, or an enriched stream's run). Those the
    run's own batches read on Kafka too (aggregates/bounded_batches.py), cut at one append time
    as the embedded source cuts them (ingest/append_cut.py), not shared in proportion to each
    partition's backlog as Spark's Kafka source shares `maxOffsetsPerTrigger`, which can enrich
    an event before a change of its key appended before it is read (docs/reprocessing.md "A
    table that enriches streams")."""
    caps = run_caps(settings, catalog, stream, definitions, log)
    enriches = any(s.enrich for s in stream_catalog(catalog, stream).streams.values())
    return caps if caps or enriches else None


def aligner(settings: Settings, spark, catalog: Catalog, root):
    """The final batch of a synchronized switch (aggregates/reprocess.py `Aligner`): the run's
    pipeline, from its checkpoint, over the log's end now, reading the joins' other streams to
    exactly the offsets given (the serving pipeline's, held)."""
    from aggregates.batch_gate import remove_listeners
    from sketchboard.wiring import build_pipeline

    def align(run: ReprocessRun, offsets: dict[str, dict[int, int]]) -> None:
        pipeline = build_pipeline(settings, spark, name=run.id, starting_offsets="earliest",
                                  catalog=stream_catalog(catalog, run.stream), end_offsets=offsets)
        try:
            pipeline.run_until_drained()
        finally:
            remove_listeners(pipeline.spark, [pipeline.progress_recorder])
            if pipeline.store is not root:
                pipeline.store.close()

    return align


def switch_run(settings: Settings, service: ReprocessService, run: ReprocessRun, spark, root) -> dict:
    """Switch to a run's output, in step with the serving pipeline when the stream feeds a join."""
    return service.switch(run.id, align=aligner(settings, spark, service.full_catalog(), root))


def auto_switch(settings: Settings, service: ReprocessService, run: ReprocessRun, out: TextIO,
                align=None) -> dict | None:
    """With `reprocess_auto_switch` on, a run that has caught up becomes the served output at once
    (what POST /api/v1/reprocess/{id}/switch does); a refused switch is said and the run stays
    caught up for a switch by hand. Returns the switch's answer, or None."""
    if not settings.reprocess_auto_switch:
        return None
    from aggregates.reprocess import SwitchRefused

    try:
        switched = service.switch(run.id, align=align)
    except SwitchRefused as exc:  # e.g. the stream feeds a join: said, the run stays for a switch by hand
        print(f"reprocess_auto_switch: not switched: {exc}", file=out, flush=True)
        return None
    print(f"reprocess_auto_switch: stream {run.stream!r} is now served from version {short_version(run.version)};"
          f" the replaced output is kept as {switched['previous']!r} (switch to it to switch back)",
          file=out, flush=True)
    return switched


def run_reprocess(settings: Settings, stream: str, *, run_id: str | None = None, spark=None,
                  out: TextIO = sys.stderr, interval_s: float = 1.0, switch: bool = False,
                  launched: bool = False, line_every_s: float = LINE_EVERY_S) -> ReprocessRun:
    """Start a run of `stream` (or carry out or resume `run_id`: recorded by the API, `launched`,
    or one that failed or caught up) and process the log up to its end as it was at the start;
    returns the run as recorded at the end (caught_up, or failed: then the error is raised).
    `switch`: then switch to its output (in step with the serving pipeline when the stream feeds a
    window join: `switch_run`). What would be refused is refused before Spark starts
    (ReprocessService.plan, resume, refuse_unswitchable)."""
    from aggregates.batch_gate import remove_listeners
    from sketchboard.wiring import build_pipeline, open_catalog, open_log, open_store

    catalog = open_catalog(settings)
    root = open_store(settings)
    log = open_log(settings, catalog)
    service = build_reprocess_service(settings, catalog, root, log)
    if switch:  # a switch this run could never make: said now, not after the whole run
        service.refuse_unswitchable(stream)
    definitions = service.definitions
    stop = threading.Event()
    bar = ProgressOutput(out, line_every_s)

    def report() -> None:  # and the heartbeat that tells the run's process is alive (fail_stale)
        beat = 0.0
        while not stop.wait(interval_s):
            bar.show(progress_line(run, service.progress(run)))
            if time.monotonic() - beat >= RUN_HEARTBEAT_MS / 1000:
                definitions.heartbeat(run.id, int(time.time() * 1000))
                beat = time.monotonic()

    reporter = threading.Thread(target=report, name="reprocess-progress", daemon=True)
    pipeline = None
    # The claim and the `try` that records a failure are one step for a stop signal: one between
    # them left the run `starting`, refused as going until it was stale (5 minutes).
    _deferred.clear()
    _deferring.set()
    try:
        run = (service.resume(stream, run_id, launched=launched, launch_token=os.environ.get(LAUNCH_TOKEN_ENV))
               if run_id is not None else service.start(stream))
    except BaseException:
        _deferring.clear()
        raise
    try:  # from the claim on: a signal or any failure records the run failed, never left `starting`
        _deferring.clear()
        if _deferred:  # came during the claim
            raise Interrupted(_deferred[0])
        print(f"reprocessing {stream!r} with definition {short_version(run.version)} into {run.id!r}: the new output"
              f" is complete from {format_time(run.complete_from_ms)} (older events are gone from the log or older"
              f" than the stream's retention)", file=out, flush=True)
        bar.__enter__()
        full = service.full_catalog()
        pipeline = build_pipeline(settings, spark, name=run.id, starting_offsets="earliest",
                                  catalog=stream_catalog(full, stream),
                                  end_offsets=run_end_offsets(settings, full, stream, definitions, log))
        if pipeline.store is not root:  # the tables' versions as the live run kept them (docs/tables.md)
            seed_table_versions(full, stream, root, pipeline.store, log)
        definitions.set_state(run.id, "running", int(time.time() * 1000))
        # A resumed run's checkpoint holds what an earlier process read: not read at this one's rate
        # (here and in GET /api/v1/reprocess).
        service.record_resume(run)
        reporter.start()
        pipeline.run_until_drained()
    except BaseException as exc:
        definitions.set_state(run.id, "failed", int(time.time() * 1000), error=failure_text(exc, run))
        if isinstance(exc, Interrupted):
            exc.run = run
        raise
    finally:
        stop.set()
        if reporter.is_alive():
            reporter.join()
        bar.__exit__()
        if pipeline is not None:
            # Off the listener bus before Spark stops, as the serving pipeline's (sketchboard/live.py):
            # left on, the bus's last events reached a Python process on its way out (an ERROR
            # StreamingQueryListenerBus ... Py4JException at every run's exit).
            remove_listeners(pipeline.spark, [pipeline.progress_recorder])
            if pipeline.store is not root:
                pipeline.store.close()
    definitions.set_state(run.id, "caught_up", int(time.time() * 1000))
    bar.show(progress_line(run, service.progress(run)), final=True)
    print(f"{run.id!r} has caught up with the log's end as of its start; its output is in the store's namespace"
          f" {run.id!r}", file=out, flush=True)
    align = aligner(settings, pipeline.spark, service.full_catalog(), root)
    if switch:
        switched = service.switch(run.id, align=align)
        print(f"stream {stream!r} is now served from version {short_version(run.version)}; the replaced output is"
              f" kept as {switched['previous']!r}", file=out, flush=True)
    else:
        auto_switch(settings, service, run, out, align)
    done = service.run(run.id)
    log.close()
    root.close()
    return done
