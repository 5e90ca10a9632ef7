"""What uvicorn refuses before the app sees a request, as the API serves it (sketchboard.cli
`server_config`, sketchboard/http_protocol.py): headers that never end are cut off, not buffered;
headers past the cap get a 431; requests within it are served, one after another on a connection
and pipelined."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request

from sketchboard.cli import server_config
from sketchboard.http_protocol import MAX_HEADER_BYTES
from sketchboard.settings import Settings


@pytest.fixture
def served(tmp_path):
    """The address of a uvicorn server configured as the API's, serving a small app."""
    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {"ok": True}

    @app.post("/size")
    async def size(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    @app.get("/loop")
    async def loop() -> dict:
        return {"module": type(asyncio.get_running_loop()).__module__}

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    config = server_config(app, Settings(data_dir=tmp_path, host="127.0.0.1", port=listening.getsockname()[1]))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield listening.getsockname()
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()


def request(path: str = "/", header_bytes: int = 0) -> bytes:
    padding = b"X-Pad: " + b"p" * header_bytes + b"\r\n" if header_bytes else b""
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding + b"\r\n"


def answers(client: socket.socket, count: int) -> list[bytes]:
    """`count` whole HTTP answers read from the connection (each with a content-length)."""
    data, found = b"", []
    while len(found) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(data) >= head_end + 4 + length:
                found.append(data[:head_end + 4 + length])
                data = data[head_end + 4 + length:]
                continue
        chunk = client.recv(65536)
        assert chunk, f"the server closed after {len(found)} answers"
        data += chunk
    return found


def test_a_request_whose_headers_never_end_is_cut_off_not_buffered(served):
    with socket.create_connection(served, timeout=5) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        try:
            while sent < 4 * 1024 * 1024:  # a header of 4 MiB, 8 KiB at a time
                client.sendall(b"x" * 8192)
                sent += 8192
                time.sleep(0.0005)
            client.sendall(b"\r\n\r\n")
            answer = client.recv(100)
        except OSError:  # the server closed the connection: the write failed
            answer = b""
    # Refused past 16 KiB of unfinished headers (what it read before the close: a few socket
    # buffers more); a parser without a cap reads all 4 MiB and answers 200.
    assert not answer.startswith(b"HTTP/1.1 200"), answer
    assert sent < 4 * 1024 * 1024


def test_headers_past_the_cap_are_answered_431_and_the_connection_closed(served):
    with socket.create_connection(served, timeout=5) as client:
        client.sendall(request(header_bytes=MAX_HEADER_BYTES + 1024))
        answer = client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431 "), answer
        assert answer.endswith(f"request headers exceed {MAX_HEADER_BYTES} bytes".encode())
        assert client.recv(100) == b""  # closed


def test_requests_within_the_cap_are_served_one_after_another_and_pipelined(served):
    near_cap = MAX_HEADER_BYTES - 200
    with socket.create_connection(served, timeout=5) as client:
        # One after another on a kept-alive connection: each request's headers are counted alone.
        for _ in range(3):
            client.sendall(request(header_bytes=near_cap))
            assert answers(client, 1)[0].startswith(b"HTTP/1.1 200 ")
        # Three pipelined in one write: together past the cap, each within it.
        client.sendall(request(header_bytes=near_cap) * 3)
        assert [a[:13] for a in answers(client, 3)] == [b"HTTP/1.1 200 "] * 3


def test_a_post_body_far_past_the_header_cap_is_read(served):
    body = b"x" * (4 * MAX_HEADER_BYTES)
    with socket.create_connection(served, timeout=5) as client:
        client.sendall(b"POST /size HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: %d\r\n\r\n" % len(body))
        for start in range(0, len(body), 4096):  # in pieces: read while no headers are unfinished
            client.sendall(body[start:start + 4096])
        assert answers(client, 1)[0].endswith(b'{"bytes":%d}' % len(body))
        client.sendall(request())
        assert answers(client, 1)[0].startswith(b"HTTP/1.1 200 ")


def test_the_api_is_served_on_uvloop(served):
    with socket.create_connection(served, timeout=5) as client:
        client.sendall(request("/loop"))
        answer = answers(client, 1)[0]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"module": "uvloop"}
