"""A real HTTP receiver on loopback for webhook tests: a ThreadingHTTPServer on a free port in
a thread, recording every POST, and answering as a test scripts it.

    from tests.receiver import Receiver

    with Receiver(fail_first=2, fail_status=503) as rx:       # 503, 503, then 200
        notifier = WebhookNotifier(rx.url, ...)
        ...
        got = rx.wait_for(lambda reqs: len(reqs) >= 3, timeout=5)
        assert [r.status for r in got] == [503, 503, 200]
        assert rx.delivered[0]["alerts"][0]["status"] == "firing"

- `rx.url`: http://127.0.0.1:<port>/ (any path is accepted and recorded).
- `rx.requests`: a snapshot list of `Received` (body = parsed JSON, or None when it was not
  JSON; raw bytes; path; headers; status answered; received_at (time.time()) and
  monotonic (time.monotonic()), both taken on arrival, before any delay).
- `rx.bodies`: every JSON body received; `rx.delivered`: those answered 2xx (a delayed
  answer counts even if the client stopped waiting: check `delay_s` or the client's side).
- `rx.fail_next(n, status)`: answer the next n requests with `status` (then 200 again).
- `rx.delay_next(seconds, n=None)`: wait `seconds` before answering the next n requests
  (None: every request from now on). The request is recorded on arrival, so a client that
  times out still shows up in `requests`.
- `rx.trickle_next(seconds, n=None)`: answer the next n requests' headers at once, then their
  body one byte every `seconds` (a receiver that is slow in its answer, never idle long enough
  for a per-read timeout).
- `rx.wait_for(predicate, timeout)`: wait until predicate(requests) is truthy and return the
  requests; on timeout an AssertionError that shows what arrived.

A body that is not valid JSON is recorded (body None) and answered 400.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any  # parsed JSON, None if the body was not JSON
    status: int  # what the receiver answered
    delay_s: float  # how long it waited before answering
    received_at: float  # time.time() on arrival
    monotonic: float  # time.monotonic() on arrival


class Receiver:
    def __init__(self, *, fail_first: int = 0, fail_status: int = 503, delay_s: float = 0.0,
                 delay_first: int | None = None):
        """fail_first/fail_status: answer the first requests with that status; delay_s: wait
        before answering the first `delay_first` requests (None: all of them)."""
        self._cond = threading.Condition()
        self._requests: list[Received] = []
        self._fail_left = 0
        self._fail_status = 200
        self._delay_s = 0.0
        self._delay_left: int | None = 0
        self._trickle_s = 0.0
        self._trickle_left: int | None = 0
        self._closed = threading.Event()  # wakes delayed answers at close
        if fail_first:
            self.fail_next(fail_first, fail_status)
        if delay_s:
            self.delay_next(delay_s, delay_first)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True  # close() must not wait for a delayed answer
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test-receiver", daemon=True)
        self._thread.start()

    # -- scripting -------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 503) -> None:
        with self._cond:
            self._fail_left, self._fail_status = n, status

    def delay_next(self, seconds: float, n: int | None = None) -> None:
        with self._cond:
            self._delay_s, self._delay_left = seconds, n

    def trickle_next(self, seconds: float, n: int | None = None) -> None:
        with self._cond:
            self._trickle_s, self._trickle_left = seconds, n

    def _trickle(self) -> float:
        with self._cond:
            if not self._trickle_s or (self._trickle_left is not None and self._trickle_left <= 0):
                return 0.0
            if self._trickle_left is not None:
                self._trickle_left -= 1
            return self._trickle_s

    # -- what arrived ----------------------------------------------------------------------

    @property
    def requests(self) -> list[Received]:
        with self._cond:
            return list(self._requests)

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.body is not None]

    @property
    def delivered(self) -> list[Any]:
        return [r.body for r in self.requests if r.body is not None and 200 <= r.status < 300]

    def wait_for(self, predicate: Callable[[list[Received]], Any], timeout: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._requests)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"receiver: condition not met in {timeout} s; got "
                                         f"{[(r.status, r.body) for r in self._requests]}")
                self._cond.wait(left)
            return list(self._requests)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- serving ---------------------------------------------------------------------------

    def _arrived(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, float]:
        """Record one request; return the status to answer and how long to wait first."""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._cond:
            status = 200
            if body is None:
                status = 400
            elif self._fail_left > 0:
                self._fail_left -= 1
                status = self._fail_status
            delay = 0.0
            if self._delay_s and (self._delay_left is None or self._delay_left > 0):
                delay = self._delay_s
                if self._delay_left is not None:
                    self._delay_left -= 1
            self._requests.append(Received(path, headers, raw, body, status, delay, time.time(), time.monotonic()))
            self._cond.notify_all()
        return status, delay

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver behind a proxy would

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, delay = receiver._arrived(self.path, dict(self.headers.items()), raw)
                if delay and receiver._closed.wait(delay):
                    return
                answer = json.dumps({"status": "ok" if status < 300 else "error"}).encode()
                trickle = receiver._trickle()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    if trickle:
                        self.wfile.flush()
                        for i in range(len(answer)):
                            if receiver._closed.wait(trickle):
                                return
                            self.wfile.write(answer[i:i + 1])
                            self.wfile.flush()
                    else:
                        self.wfile.write(answer)
                except OSError:  # the client gave up (timed out) while we were delaying
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

        return Handler
