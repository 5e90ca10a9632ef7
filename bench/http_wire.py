"""A load generator's HTTP/1.1 client: a request written whole on one keep-alive socket, its answer
read by Content-Length. What wrk or oha do, in a few lines of Python.

Why by hand: the ingest bar (issue 28) counts the clients' CPU on the same two cores as the
service's, and httpx spends 2.3-3.9 ms of CPU on a 1 000-event POST (its request and response
models, h11's state machine), a third of what the bar leaves the whole request. A benchmark of a
server is run with a client that costs next to nothing; none of the well-kept Python clients is
one (http.client still parses headers into objects line by line), and wrk is not on every
machine. It speaks only what the benchmarks need: POST with a body, answers with a
Content-Length (uvicorn's JSON answers), keep-alive.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import urlsplit

RECV_BYTES = 65_536


class WireClient:
    """One keep-alive connection to `url`'s host and port; reconnects after the server closed it."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"WireClient speaks plain http to a host: {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request_head(self, method: str, target: str, headers: dict[str, str]) -> Callable[[int], bytes]:
        """The request's head for a body of n bytes, built once but for its Content-Length."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        start = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        return lambda length: b"%s%d\r\n\r\n" % (start, length)

    def send(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        """The request written, its answer read: (status, body). OSError (ConnectionError) when the
        connection fails or the server closes it before answering: the request may or may not
        have been handled, as with any client."""
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        try:
            self._sock.sendmsg([head, body])
            return self._answer()
        except BaseException:
            self.close()  # a half-read answer would be taken for the next one
            raise

    def _answer(self) -> tuple[int, bytes]:
        buffer = self._buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            buffer += self._recv()
        lines = buffer[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        if "content-length" not in fields:
            raise ConnectionError(f"an answer without a Content-Length (HTTP {status}): not read by this client")
        length = int(fields["content-length"])
        rest = buffer[end + 4:]
        while len(rest) < length:
            rest += self._recv()
        self._buffer = rest[length:]
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, rest[:length]

    def _recv(self) -> bytes:
        chunk = self._sock.recv(RECV_BYTES)
        if not chunk:
            raise ConnectionError("the server closed the connection before its answer")
        return chunk
