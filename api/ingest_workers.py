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
path. Bodies go to the workers in groups: the bodies of a stream that waited while every worker
was busy go to the next idle one together, at most GROUP_BODIES_MAX, and it appends them in one
transaction, one segment a partition (a group commit: what an append costs is mostly the same
whatever its size). Each body is still parsed and checked on its own and gets its own answer:

    API -> worker   ("group", stream name, its definition or None, [(body's bytes, content type, admitted rows),
                     ...], ingest time), then the bodies
    worker -> API   ("group", [per body: ("appended", rows, ranges) | ("declined",) | ("failed", why)
                               | ("unavailable", why) | ("count", rows)])

A stream's definition goes to a worker once, and again only when the catalog's object for it
changes (pickling it cost ~50 us of the event loop a group, and unpickling it ~40 us of the worker).

A body within its admitted rows is appended unasked, with the others of the group so admitted. One
over them is held ("count"): the API process charges its rows to the events rate limit (429) and
checks `max_events_per_request` (413), as it does for a body it appends itself, so a refused body
writes nothing; then it says which of the held bodies to append:

    API -> worker   ("append", ingest time, [indices among the held bodies])
    worker -> API   ("group", [per body appended: ("appended", rows, ranges) | ("unavailable", why)])

The API process says how many rows each body is admitted (api/ingest_routes.py): without an events
rate limit, `max_events_per_request`; with one, the events it could set aside from the caller's
bucket for the body (its opening braces, no fewer than its events), else none (the body is counted
and charged first). So a body mostly takes one round trip.

Until a worker is ready (a fresh interpreter imports Arrow: a second or two), the body is
handled in the API process as before. A worker that dies is replaced. One found dead before it
is handed a group, or that dies before it may append a body (a held one: before the API's
"append"), leaves the body to the API process (nothing was written); one that dies once it may
append makes the request a 503 (the append may or may not have committed, as with a lost Kafka
acknowledgement). A worker exits when its socket closes, so it ends with the API process, even a
killed one.

Frames are a 4-byte length and a pickle: both ends are ours (the worker is api/ingest_worker.py),
in processes this one started. A group's bodies follow its frame as they are, each as long as the
frame says: pickled with it, a 1 000-event body (~157 KB) cost ~140 us of the event loop (the
pickle grows its buffer, a copy each time, on fresh pages).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from api.ingest_worker import LENGTH
from catalog import StreamDef
from ingest.json_limits import JsonLimits
from ingest.log import LogUnavailable

log = logging.getLogger("sketchboard.api")


class _Worker:
    def __init__(self, process: subprocess.Popen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.process = process
        self.reader = reader
        self.writer = writer
        self.streams: dict[str, StreamDef] = {}  # the definitions it was sent, by name

    async def send(self, message: tuple, payloads: tuple[bytes, ...] | list[bytes] = ()) -> None:
        """The message's frame, then `payloads` as they are (the socket takes them from the request's
        own bytes: no copy while it has room)."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(LENGTH.pack(len(data)) + data)
        for payload in payloads:
            self.writer.write(payload)
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

# Bodies of a stream that waited for a worker go to it together, at most this many, and are appended
# in one transaction (a group commit). An append's transaction and segments, the reader's and the
# checks' calls cost about the same for 1 000 events as for 8 000: a 1 000-event body took 4.1 ms of
# a worker's CPU in groups of 8 against 5.6 alone (docs/benchmarks.md, session 84).
GROUP_BODIES_MAX = 8


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
        self._waiting: deque[_Waiting] = deque()  # bodies for the dispatcher, in their order
        self._wake: asyncio.Event | None = None  # set when a body starts waiting
        self._dispatcher: asyncio.Task | None = None
        self._groups: set[asyncio.Task] = set()  # the groups' conversations under way
        self.handled = 0  # bodies the workers appended (tests and benchmarks read it)
        self.groups = 0  # groups of bodies handed to them (bodies a group: benchmarks print it)
        self.replaced = 0  # workers whose conversation broke off, and another started in their place

    @staticmethod
    def takes(body: bytes) -> bool:
        """Whether a body goes to a worker (BODY_BYTES_MAX)."""
        return len(body) <= BODY_BYTES_MAX

    @property
    def ready(self) -> int:
        """Workers started and not stopped (busy or idle)."""
        return len(self._all)

    @property
    def waiting(self) -> int:
        """Bodies waiting for an idle worker."""
        return len(self._waiting)

    @property
    def busy(self) -> int:
        """Groups of bodies handed to a worker and not yet answered."""
        return len(self._groups)

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
        self._wake = asyncio.Event()
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
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
            self.replaced += 1
            self._spawn_later()

    async def ingest(self, stream: StreamDef, body: bytes, content_type: str, admit: Callable[[int], object], *,
                     admitted: int = -1, now_ms: Callable[[], int],
                     ) -> tuple[int, int, dict[int, tuple[int | None, int]]] | str | None:
        """The body parsed, checked and appended by a worker: (rows appended, their ingest time,
        the log's ranges); DECLINED where the columnar path declined it (the per-event path
        decides), or None where the API process must handle it (no worker ready, or it died
        before it could append). A body of at most `admitted` rows is appended unasked; above,
        `admit(rows)` runs first and raises to refuse it (413, 429: nothing is written). `now_ms`
        gives the ingest time. Raises LogUnavailable as the log's append does.

        The body waits for the dispatcher, which hands it to the next idle worker with the other
        bodies of its stream waiting by then (`_run_group`)."""
        if self._idle is None or not self._all:
            return None  # none ready yet, or none left
        waiting = _Waiting(stream, body, content_type, admitted, admit, now_ms,
                           asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        self._wake.set()
        return await waiting.answer

    async def _dispatch(self) -> None:
        """Hands the waiting bodies to the workers as they become idle, a group at a time. It must
        outlive any failure: the requests waiting on it would wait for ever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._hand_out()
            except Exception:  # not expected: the waiting bodies go to the API process
                log.exception("the ingest workers' dispatcher failed; the bodies waiting are handled here")
                while self._waiting:
                    _settle(self._waiting.popleft().answer, None)

    async def _hand_out(self) -> None:
        """Every waiting body handed to an idle worker (waiting for one), or to the API process
        when none is left."""
        while self._waiting:
            worker = await self._idle_worker()
            if worker is None:  # none left: the API process handles every waiting body
                while self._waiting:
                    _settle(self._waiting.popleft().answer, None)
                return
            group = self._next_group()
            if not group:  # their requests went away meanwhile
                self._idle.put_nowait(worker)
                return
            self.groups += 1
            task = asyncio.get_running_loop().create_task(self._run_group(worker, group))
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    def _next_group(self) -> list[_Waiting]:
        """The first waiting body and, up to GROUP_BODIES_MAX, the ones of its stream behind it."""
        group: list[_Waiting] = []
        others: list[_Waiting] = []
        while self._waiting and len(group) < GROUP_BODIES_MAX:
            waiting = self._waiting.popleft()
            if waiting.answer.done():  # its request was cancelled
                continue
            if group and waiting.stream.name != group[0].stream.name:
                others.append(waiting)
            else:
                group.append(waiting)
        self._waiting.extendleft(reversed(others))  # they keep their turn
        return group

    async def _run_group(self, worker: _Worker, group: list[_Waiting]) -> None:
        """One group's conversation (the module's docstring): the bodies go in one message, those
        admitted are appended together, each answered on its own."""
        maybe_written: list[_Waiting] = []  # handed over with leave to append
        try:
            ingest_time_ms = group[0].now_ms()
            stream = group[0].stream
            known = worker.streams.get(stream.name) is stream
            await worker.send(("group", stream.name, None if known else stream,
                               [(len(w.body), w.content_type, w.admitted) for w in group], ingest_time_ms),
                              [w.body for w in group])
            worker.streams[stream.name] = stream
            maybe_written = [w for w in group if w.admitted >= 0]
            answers = (await worker.receive())[1]
            held = [(waiting, answer[1]) for waiting, answer in zip(group, answers, strict=True)
                    if answer[0] == "count"]
            self._settle_group(group, answers, ingest_time_ms)
            if held:
                go = [index for index, (waiting, rows) in enumerate(held) if _admitted(waiting, rows)]
                ingest_time_ms = group[0].now_ms()
                await worker.send(("append", ingest_time_ms, go))
                maybe_written = [held[index][0] for index in go]
                answers = (await worker.receive())[1]
                self._settle_group(maybe_written, answers, ingest_time_ms)
        except BaseException as exc:  # the conversation broke off (the worker died, the app stops)
            self._discard(worker)
            for waiting in group:  # those it could not have appended go to the API process
                _settle(waiting.answer, error=_lost_append() if waiting in maybe_written else None)
            if isinstance(exc, (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError)):
                log.error("an ingest worker process exited (%s); another is started", exc)
                return
            if isinstance(exc, Exception):  # not expected: a bug here, not a request's fault
                log.exception("an ingest worker's conversation failed; another worker is started")
                return
            raise  # cancelled
        self._idle.put_nowait(worker)

    def _settle_group(self, group: list[_Waiting], answers: list[tuple], ingest_time_ms: int) -> None:
        for waiting, answer in zip(group, answers, strict=True):
            kind = answer[0]
            if kind == "count":
                continue  # held: admitted or refused next
            if kind == "appended":
                self.handled += 1
                _settle(waiting.answer, (answer[1], ingest_time_ms, answer[2]))
            elif kind == "unavailable":
                _settle(waiting.answer, error=LogUnavailable(answer[1]))
            else:
                if kind == "failed":  # not expected: said here, since the worker's error stays there
                    log.error("an ingest worker's columnar parse failed (%s); the per-event path decides", answer[1])
                _settle(waiting.answer, DECLINED)  # the per-event path explains what it can

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

    async def stop(self) -> None:
        self._stopped = True
        for task in list(self._starting):
            task.cancel()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            self._dispatcher = None
        while self._waiting:  # not handed to a worker: the API process handles them
            _settle(self._waiting.popleft().answer, None)
        for worker in list(self._all):
            worker.close()
        for worker in list(self._all):
            try:
                await asyncio.to_thread(worker.process.wait, 10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
        self._all.clear()
        self._idle = None


@dataclass(eq=False)
class _Waiting:
    """A body waiting for the dispatcher (`IngestWorkers.ingest`); `answer` is its request's."""

    stream: StreamDef
    body: bytes
    content_type: str
    admitted: int
    admit: Callable[[int], object]
    now_ms: Callable[[], int]
    answer: asyncio.Future


def _admitted(waiting: _Waiting, rows: int) -> bool:
    """Whether `waiting.admit` lets its rows in; its refusal (413, 429) is its request's answer."""
    if waiting.answer.done():
        return False  # its request went away: nothing to answer, nothing to write
    try:
        waiting.admit(rows)
    except BaseException as exc:  # the request's own error (413, 429), raised there
        waiting.answer.set_exception(exc)
        return False
    return True


def _settle(answer: asyncio.Future, result=None, *, error: BaseException | None = None) -> None:
    """A waiting body's answer, unless its request went away (cancelled) meanwhile."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)


def _lost_append() -> LogUnavailable:
    return LogUnavailable("the worker appending the events exited; the append may or may not have been committed")


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
