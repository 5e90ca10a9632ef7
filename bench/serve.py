"""What several benchmarks share: an ASGI app served by uvicorn on a free loopback port, in a
thread of the benchmark's process, and the one percentile rule of their figures."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app, port: int | None = None, *, join_s: float = 30.0) -> Iterator[int]:
    """Serve `app` until the block ends (then wait for the server to stop: the websocket hub's
    tailer stops before the caller closes the store); yields the port."""
    import uvicorn

    from sketchboard.http_protocol import served_as_the_api

    port = port or free_port()
    # As the service serves by default (sketchboard/cli.py `server_config`: its HTTP protocol and
    # loop; websocket compression only with ws_compression)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_per_message_deflate=False, **served_as_the_api()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(join_s)


def nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile of `values` by the nearest-rank rule (the smallest value with at least
    q of them at or below it): every benchmark reports its p50/p99 this way."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
