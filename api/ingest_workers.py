"""The ingest API's columnar path in worker processes, off the API process's GIL.

A 1 000-event body costs ~4 ms of parsing, checking and appending (ingest/columnar.py, the log's
append_columns). In the API process that work runs in threads beside the event loop, and they
share one GIL: Arrow's kernels and SQLite release it dozens of times a body, so the threads and
the loop pass it back and forth, and the process does not get past ~1.1-1.3 cores however many
requests wait (docs/benchmarks.md, session 82). A worker process has its own interpreter and its
own connection to the embedded log (SQLite: an append is a `BEGIN IMMEDIATE` transaction, so
processes take turns on the file as threads do), and the event loop only moves the body down a
socket and the answer back.

The API process keeps everything else: HTTP, tokens, rate limits, idempotency, the per-event
path. Where an events rate limit is set, a body goes to a worker in two steps, so the limit is charged
before anything is written, as in the API process:

    API -> worker   ("parse", stream, body, content type, -1, None)
    worker -> API   ("count", rows)  | ("declined",): the per-event path decides
    API -> worker   ("append", ingest time) | ("drop",): over a limit, answered 413/429
    worker -> API   ("appended", rows, ranges) | ("unavailable", reason) | ("too_large", index, reason, written)

Without one, the API admits up to `max_events_per_request` rows unasked, and a body within it
is appended in one step (a round trip less): ("parse", stream, body, content type, admitted rows,
ingest time), answered "appended" (or "count" for a body over them, then as above).

Until a worker is ready (a fresh interpreter imports Arrow: a second or two), the body is
handled in the API process as before. A worker that dies is replaced. One found dead before it
is handed a body, or that dies before it may append (two steps: before the API's "append"), leaves
the body to the API process (nothing was written); one that dies once it may append makes the
request a 503 (the append may or may not have committed, as with a lost Kafka acknowledgement).
A worker exits when its socket closes, so it ends with the API process, even a killed one.

Frames are a 4-byte length and a pickle: both ends are ours (the worker is api/ingest_worker.py),
in processes this one started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from api.ingest_worker import LENGTH
from catalog import StreamDef
from ingest.json_limits import JsonLimits
from ingest.log import LogUnavailable, RecordTooLarge

log = logging.getLogger("sketchboard.api")


class _Worker:
    def __init__(self, process: subprocess.Popen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.process = process
        self.reader = reader
        self.writer = writer

    async def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(LENGTH.pack(len(data)))
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self) -> tuple:
        size = LENGTH.unpack(await self.reader.readexactly(LENGTH.size))[0]
        return pickle.loads(await self.reader.readexactly(size))

    def close(self) -> None:
        self.writer.close()  # the worker reads the end of its socket and exits


# Bodies up to this size go to a worker. A larger one spends its time in Arrow's kernels over long
# columns, which release the GIL for most of it, so threads of the API process already run them side
# by side; moving 1.3 MB down a socket and back out of a pickle then cost more than the GIL did:
# 10 000-event bodies ran at 410 000-480 000 events/s through workers against 490 000-550 000 in
# threads, where 1 000-event bodies (~130 KB) ran faster through them (docs/benchmarks.md, session 82).
BODY_BYTES_MAX = 512 * 1024

DECLINED = "declined"  # IngestWorkers.ingest: the columnar path declined the body


class IngestWorkers:
    """`processes` worker processes appending to the embedded log at `log_path`."""

    def __init__(self, log_path: Path, log_sync: str, limits: JsonLimits, processes: int, *,
                 environment: dict[str, str] | None = None):
        """`environment`: variables a worker gets beside this process's (the allocators' settings)."""
        self._environment = environment or {}
        self._hello = {"log_path": str(Path(log_path).resolve()), "log_sync": log_sync, "limits": limits}
        self.processes = processes
        self._idle: asyncio.Queue[_Worker | None] | None = None
        self._all: set[_Worker] = set()
        self._starting: set[asyncio.Task] = set()
        self._stopped = False
        self.handled = 0  # bodies the workers appended (tests and benchmarks read it)

    @staticmethod
    def takes(body: bytes) -> bool:
        """Whether a body goes to a worker (BODY_BYTES_MAX)."""
        return len(body) <= BODY_BYTES_MAX

    @property
    def ready(self) -> int:
        """Workers started and not stopped (busy or idle)."""
        return len(self._all)

    @property
    def starting(self) -> int:
        """Workers being started."""
        return len(self._starting)

    def running(self) -> list[subprocess.Popen]:
        """The processes of the workers started and not stopped."""
        return [worker.process for worker in self._all]

    async def start(self) -> None:
        """Start the workers in the background: the API serves meanwhile, in its own process."""
        self._stopped = False
        self._idle = asyncio.Queue()
        for _ in range(self.processes):
            self._spawn_later()

    def _spawn_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self._spawn())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen([sys.executable, "-m", "api.ingest_worker", str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()],
                                       env=_worker_environment(self._environment))
        except OSError:
            ours.close()
            log.exception("an ingest worker process did not start; bodies are handled in the API process")
            self._release_waiters()
            return
        finally:
            theirs.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=2 ** 31 - 1)
        except BaseException:
            ours.close()
            _kill(process)
            raise
        worker = _Worker(process, reader, writer)
        try:
            await worker.send(("hello", self._hello))
            answer = await worker.receive()
            if answer[0] != "ready":
                raise RuntimeError(f"unexpected first message {answer[0]!r}")
        except (OSError, EOFError, asyncio.IncompleteReadError, RuntimeError, pickle.UnpicklingError,
                asyncio.CancelledError) as exc:
            worker.close()
            _kill(process)
            if isinstance(exc, asyncio.CancelledError):  # stopped while it started
                raise
            log.exception("an ingest worker process did not start; bodies are handled in the API process")
            self._release_waiters()
            return
        if self._stopped:
            worker.close()
            return
        self._all.add(worker)
        self._idle.put_nowait(worker)

    def _release_waiters(self) -> None:
        """After a worker failed to start: with none left or coming, the requests waiting for one
        are handled in the API process (the None passes from waiter to waiter)."""
        if not self._all and len(self._starting) <= 1 and self._idle is not None:  # only the failed one
            self._idle.put_nowait(None)

    def _discard(self, worker: _Worker) -> None:
        """A worker whose conversation broke off: stopped, and another started in its place."""
        self._all.discard(worker)
        worker.close()
        _kill(worker.process)  # one that still runs is in an unknown state
        if not self._stopped:
            self._spawn_later()

    async def ingest(self, stream: StreamDef, body: bytes, content_type: str, admit: Callable[[int], int], *,
                     admitted: int = -1, now_ms: Callable[[], int] | None = None,
                     ) -> tuple[int, int, dict[int, tuple[int | None, int]]] | str | None:
        """The body parsed, checked and appended by a worker: (rows appended, their ingest time,
        the log's ranges); DECLINED where the columnar path declined it (the per-event path
        decides), or None where the API process must handle it (no worker ready, or it died). `admit(rows)` runs before
        the append: it raises to refuse it (413, 429; nothing is written), else gives the ingest
        time to stamp. A body of at most `admitted` rows (with `now_ms`, the ingest time) is
        appended without asking. Raises LogUnavailable and RecordTooLarge as the log's append does."""
        worker = await self._idle_worker()
        if worker is None:
            return None
        appending = False
        ingest_time_ms = now_ms() if admitted >= 0 else None
        try:
            await worker.send(("parse", stream, body, content_type, admitted, ingest_time_ms))
            appending = admitted >= 0  # from here the worker may append unasked
            answer = await worker.receive()
            if answer[0] not in ("count", "appended"):
                self._idle.put_nowait(worker)
                if answer[0] == "failed":  # not expected: said here, since the worker's error stays there
                    log.error("an ingest worker's columnar parse failed (%s); the per-event path decides", answer[1])
                return DECLINED  # the per-event path explains what it can
        except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError, asyncio.CancelledError) as exc:
            return self._lost(worker, exc, appending)
        if answer[0] == "appended":
            self._idle.put_nowait(worker)
            return self._appended(answer, ingest_time_ms)
        try:
            try:
                ingest_time_ms = admit(answer[1])
            except BaseException:  # refused (413, 429): the worker forgets the body
                try:
                    await worker.send(("drop",))
                except OSError:
                    self._discard(worker)
                else:
                    self._idle.put_nowait(worker)
                raise
            appending = True
            await worker.send(("append", ingest_time_ms))
            answer = await worker.receive()
        except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError, asyncio.CancelledError) as exc:
            return self._lost(worker, exc, appending)
        self._idle.put_nowait(worker)
        return self._appended(answer, ingest_time_ms)

    async def _idle_worker(self) -> _Worker | None:
        """The next idle worker (waiting for one while all are busy) that has not died meanwhile; None
        when there is none left (_release_waiters) or none yet."""
        while self._idle is not None and self._all:
            worker = await self._idle.get()
            if worker is None:  # the next waiter learns it too
                self._idle.put_nowait(None)
                return None
            # One that died while idle is found before it is handed a body: otherwise, sent a body
            # it may append unasked, its death would make the request a 503.
            if worker.process.poll() is None and not worker.reader.at_eof():
                return worker
            log.error("an ingest worker process exited while idle (%s); another is started", worker.process.returncode)
            self._discard(worker)
        return None

    def _lost(self, worker: _Worker, exc: BaseException, appending: bool) -> None:
        """A worker whose conversation broke off: None (the API process handles the body) before its
        append, LogUnavailable during it (the append may or may not have committed)."""
        self._discard(worker)
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        log.error("an ingest worker process exited (%s); another is started", exc)
        if appending:
            raise LogUnavailable("the worker appending the events exited; the append may or may not have"
                                 " been committed") from None
        return None

    def _appended(self, answer: tuple, ingest_time_ms: int) -> tuple[int, int, dict[int, tuple[int | None, int]]]:
        kind = answer[0]
        if kind == "appended":
            self.handled += 1
            return answer[1], ingest_time_ms, answer[2]
        if kind == "unavailable":
            raise LogUnavailable(answer[1])
        if kind == "too_large":
            raise RecordTooLarge(answer[1], answer[2], answer[3])
        raise LogUnavailable(f"the ingest worker answered {kind!r}")

    async def stop(self) -> None:
        self._stopped = True
        for task in list(self._starting):
            task.cancel()
        for worker in list(self._all):
            worker.close()
        for worker in list(self._all):
            try:
                await asyncio.to_thread(worker.process.wait, 10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
        self._all.clear()
        self._idle = None


def _kill(process: subprocess.Popen) -> None:
    """Killed and reaped (a few milliseconds after SIGKILL)."""
    process.kill()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _worker_environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment and `extra`, with the project on the path: the worker imports it
    as this process does, whatever the working directory."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
