"""What uvicorn refuses before the app sees a request, as the API serves it (sketchboard.cli
`server_config`): headers that never end are cut off, not buffered, whichever HTTP parsers the
environment has installed (uvicorn picks httptools, which has no such limit, when it is there)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from sketchboard.cli import server_config
from sketchboard.settings import Settings


def test_a_request_whose_headers_never_end_is_cut_off_not_buffered(tmp_path):
    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {"ok": True}

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    config = server_config(app, Settings(data_dir=tmp_path, host="127.0.0.1", port=listening.getsockname()[1]))
    assert config.http == "h11"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        with socket.create_connection(listening.getsockname(), timeout=5) as client:
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
        # h11 gives up past ~16 KiB of unfinished headers (what it read before the close: a few
        # socket buffers more); a parser without a limit reads all 4 MiB and answers 200.
        assert not answer.startswith(b"HTTP/1.1 200"), answer
        assert sent < 4 * 1024 * 1024
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()
