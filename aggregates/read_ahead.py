"""The embedded log's next batch read in another process while this one runs the batch before.

A catch-up in batches of the pipeline's own (aggregates/bounded_batches.py) knows each batch's range
before the batch before it ends, and a batch on the driver is Python from its read to its commit:
one core of a two-core machine. Its read (the log's segments decoded into source rows,
ingest/spark_source.py `read_batch`, ~13 % of a batch) can run on the other core. A thread cannot
do it: the read holds the GIL between its C calls, and beside a busy thread it ran 5 times slower
and slowed that thread to a quarter of its pace (measured here). So one worker process reads the
range with the very same function and hands the rows over as an Arrow IPC file in shared memory,
which this process maps without copying.

Nothing depends on it: a range it was not asked for, or one whose read failed in the worker (a
worker that died, a log it cannot open), is read here as before, and any error it raises is the
one this process meets reading it itself. The rows are the same either way (one function, an
exact IPC round trip).

The worker is started for a backlog of at least two batches after the one running
(`WORTH_STARTING`): a spawned Python importing Arrow and the log takes ~0.5 s of a core here
(longer beside a busy API) and ~160 MB resident (~70 MB of its own), more than the read of the one
batch it could read ahead of a shorter backlog (~0.3 s for 1 M events). Once started, it reads
every next batch of a backlog.

Nor does a batch wait for a read the worker has not begun: the batch before is often done sooner
than the worker starts. A range asked of a worker that has not started yet, or that is still busy
with a read the pipeline gave up on (the one before, for that reason), is read here at once; a
read begun is waited for no longer than reading it here would take (the pipeline's own last read,
per record: `read_here`), since a worker beside a busy API may read slower than the pipeline
itself. The worker's copy of a range given up is thrown away when its read ends. In issue 28's end
to end, the last batches otherwise waited up to 1.3 s for the worker, for rows the pipeline reads
itself in ~0.1-0.5 s (docs/benchmarks.md, session 105)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import tempfile
import uuid
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path

import pyarrow as pa

from catalog import Catalog
from ingest.log import SqliteEventLog
from ingest.spark_source import read_batch, records_between

log = logging.getLogger("sketchboard.pipeline")

Offsets = dict[str, dict[int, int]]

_WORKER: dict = {}  # in the worker process: its log and catalog, opened once
_PREFIX = "sketchboard-read-ahead-"  # then the pipeline process's pid, a dash, a random name
WORTH_STARTING = 2  # a worker is started for a backlog of at least this many batches after the running one
OWN_PACE_S = 0.5e-6  # seconds a record the pipeline takes to read a range itself, until it has read one
SHM_NEEDED = 2 * 2**30  # a batch of 1 M events is a few hundred MiB of rows: shared memory only with room to spare


def _folder() -> str:
    """Shared memory where there is room (the file is mapped, never written to disk), else the temp
    folder (Docker gives a container 64 MiB of /dev/shm unless told otherwise)."""
    try:
        stat = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and stat.f_bavail * stat.f_frsize >= SHM_NEEDED:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def _worker_start(parent: int, started) -> None:
    """The worker dies with the pipeline's process, even one killed with SIGKILL (Linux: the kernel
    sends it SIGKILL then, `prctl(PR_SET_PDEATHSIG)`): it would otherwise wait on its task queue
    for ever, since it holds that queue's write end itself. Then it sets `started`: it has imported
    this module, so what a read needs, and from then on a read asked of it is worth waiting for."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the worker ends when the pool is shut down
        pass
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(0)
    started.set()


def _remove_orphans(folder: str) -> None:
    """The files of read-ahead workers whose pipeline process was killed between a read and its take."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith(_PREFIX) and len(parts) >= 4 and parts[3].isdigit() and not _alive(int(parts[3])):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_to_file(log_path: str, catalog_json: str, start: Offsets, end: Offsets, path: str) -> str:
    """In the worker: the range's source rows (`read_batch`) written to `path` as an Arrow IPC file."""
    if _WORKER.get("key") != (log_path, catalog_json):
        if _WORKER.get("log") is not None:
            _WORKER["log"].close()
        _WORKER.update(key=(log_path, catalog_json), log=SqliteEventLog(log_path),
                       catalog=Catalog.model_validate_json(catalog_json))
    table = read_batch(_WORKER["log"], _WORKER["catalog"], start, end)
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    return path


def _key(start: Offsets, end: Offsets) -> tuple:
    return tuple(sorted((s, int(p), int(start.get(s, {}).get(p, 0)), int(o)) for s, parts in end.items()
                        for p, o in parts.items()))


class ReadAhead:
    """One worker process reading the next range while the current batch runs; `take` gives a
    range's rows if it was asked for, with the same catalog, and read, else None (the caller reads
    it itself)."""

    def __init__(self, log_path):
        self.log_path = str(log_path)
        self.pool: ProcessPoolExecutor | None = None
        self.pending: dict[tuple, tuple[object, Future, str]] = {}
        self.taken = 0  # batches whose rows came from the worker
        self.given_up_count = 0  # batches read here after all: the worker had not begun them, or was slower
        self.started = None  # set by the worker once it can read (an Event of its process context)
        self.given_up: list[Future] = []  # reads the pipeline made itself, which the worker may still be making
        self.own_pace_s = OWN_PACE_S  # seconds a record of the pipeline's own last read (`read_here`)
        self.failed = False  # a read or a start failed: the rest is read in the pipeline, not tried again

    def ask(self, catalog, start: Offsets, end: Offsets, left: int | None = None) -> None:
        """Start reading [start, end) of `catalog`'s streams in the worker, started on the first ask
        with `left` (the records of the backlog from `start` on; None: as many as it takes) at
        least WORTH_STARTING times the range's."""
        key = _key(start, end)
        if key in self.pending or self.failed:
            return
        if self.pool is None and left is not None and left < WORTH_STARTING * records_between(start, end):
            return  # a short backlog: read in the pipeline, as soon as a worker would start
        folder = _folder()
        path = os.path.join(folder, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.arrow")
        try:  # never fails the batch: whatever goes wrong here, the pipeline reads the range itself
            if self.pool is None:
                _remove_orphans(folder)
                context = multiprocessing.get_context("spawn")
                self.started = context.Event()
                self.pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_worker_start,
                                                initargs=(os.getpid(), self.started))
            future = self.pool.submit(_read_to_file, self.log_path, catalog.model_dump_json(), start, end, path)
        except Exception as exc:  # no process to start, a broken pool: read here
            log.warning("reading ahead failed (%s): batches are read in the pipeline's process", exc)
            self.failed = True
            return
        self.pending[key] = (catalog, future, path)

    def read_here(self, records: int, seconds: float) -> None:
        """The pipeline read `records` itself in `seconds`: how long a read begun in the worker is
        worth waiting for."""
        if records > 0:
            self.own_pace_s = seconds / records

    def take(self, catalog, start: Offsets, end: Offsets) -> pa.Table | None:
        """The rows of [start, end) read by the worker, or None: not asked for, asked with another
        catalog (a pattern defined since: its stream is read too), its read failed, or not done as
        soon as the pipeline reads it itself (the module doc)."""
        key = _key(start, end)
        asked = self.pending.pop(key, None)
        if asked is None:
            return None
        asked_catalog, future, path = asked
        self.given_up = [f for f in self.given_up if not f.done()]
        if not future.done():
            # Not begun (the worker starting, or still on a read given up): read here at once;
            # begun: waited for as long as the pipeline's own read would take, then read here.
            begun = self.started.is_set() and not self.given_up
            if not begun or not wait([future], timeout=records_between(start, end) * self.own_pace_s).done:
                future.cancel()
                future.add_done_callback(lambda _, path=path: Path(path).unlink(missing_ok=True))
                self.given_up.append(future)
                self.given_up_count += 1
                return None
        try:
            future.result()
            if asked_catalog is not catalog:
                return None
            # Mapped, not copied: the buffers keep the mapping alive after the file is unlinked.
            table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        except Exception as exc:  # not tried again: whatever failed (room, the log) would likely fail again
            log.warning("reading ahead failed (%s): this and the next batches are read in the pipeline's process", exc)
            self.failed = True
            return None
        finally:
            Path(path).unlink(missing_ok=True)
        self.taken += 1
        return table

    def close(self) -> None:
        for _, future, path in self.pending.values():
            future.cancel()
            try:
                future.result()
            except BaseException:  # cancelled, or failed: nothing to hand over
                pass
            Path(path).unlink(missing_ok=True)
        self.pending.clear()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


__all__ = ["ReadAhead"]
