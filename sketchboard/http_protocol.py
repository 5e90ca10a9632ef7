"""The API's HTTP/1.1 protocol: uvicorn's httptools protocol with a cap on a request's headers.

httptools (llhttp, Node's C parser) reads a 10 000-event body with less of the event loop's CPU than
h11, which copies each chunk through its receive buffer twice (docs/benchmarks.md, session 102).
But it has no limit of its own on headers: uvicorn's httptools protocol buffers a header line of
any length until it ends, so anyone reaching the port could make the API hold as much as they send.
h11 gives up past 16 KiB of unfinished headers; this protocol does the same, counting the bytes
that come while a request's headers are still unfinished, and answers 431 then closes."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEADER_BYTES = 16 * 1024  # h11's default max_incomplete_event_size, which the API had before


class HeadersTooLarge(Exception):
    """A request's headers, whole, past the cap."""


class HeaderCappedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request whose headers run past MAX_HEADER_BYTES.

    Unfinished headers: the bytes received while no request's headers are complete are counted,
    from the connection's start or from the end of the previous request on it. A read holding the
    end of one request and the start of the next is not counted for the next, so a request may send
    at most one socket read (256 KiB) more before it is refused: still bounded. Headers that end
    within the read that brought them are measured whole when the parser has them."""

    max_header_bytes = MAX_HEADER_BYTES

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._in_headers = True
        self._header_bytes = 0
        self._headers_too_large = False
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._in_headers and self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._refuse_headers()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        # Headers that came whole within one read were never seen unfinished: measured here. The
        # exception stops the parser, and uvicorn answers it through send_400_response (below).
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self._headers_too_large = True
            raise HeadersTooLarge(size)
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._headers_too_large:
            self._refuse_headers()
        else:
            super().send_400_response(msg)

    def on_message_complete(self) -> None:
        self._in_headers = True
        self._header_bytes = 0
        super().on_message_complete()

    def _refuse_headers(self) -> None:
        self.logger.warning("Request headers past %d bytes refused (431).", self.max_header_bytes)
        message = f"request headers exceed {self.max_header_bytes} bytes".encode("ascii")
        content = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: text/plain; charset=utf-8\r\n",
                        b"content-length: " + str(len(message)).encode("ascii") + b"\r\n",
                        b"connection: close\r\n", b"\r\n", message])
        self.transport.write(b"".join(content))
        self.transport.close()


def served_as_the_api() -> dict:
    """uvicorn.Config's protocol options as the API serves (sketchboard.cli `server_config`), for
    every server that should behave as it does (the benchmarks', the websocket tests')."""
    return {"http": HeaderCappedHttpToolsProtocol, "loop": "uvloop"}
