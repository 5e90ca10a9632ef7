"""An ingest worker process (api/ingest_workers.py starts it): parses, checks and appends the
bodies the API process sends down its socket, one at a time, until the socket ends (the API process
closed it, or died). The conversation is described in api/ingest_workers.py.

    python -m api.ingest_worker FD
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import sys

from ingest.log import LogUnavailable, RecordTooLarge

LENGTH = struct.Struct("!I")  # a frame: its length, then a pickle


def _read(sock: socket.socket) -> tuple | None:
    """The next message, or None at the end of the socket (the API process closed it or died)."""
    head = _read_exactly(sock, LENGTH.size)
    if head is None:
        return None
    data = _read_exactly(sock, LENGTH.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def _read_exactly(sock: socket.socket, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            return None
        got += n
    return buffer


def _write(sock: socket.socket, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(LENGTH.pack(len(data)) + data)


def serve(sock: socket.socket) -> None:
    """A worker's loop: one body at a time, until the socket ends."""
    from api.bodies import columnar_body
    from api.ingest_routes import warm_columnar_path
    from ingest.log import SqliteEventLog

    hello = _read(sock)
    if hello is None:
        return
    settings = hello[1]
    event_log = SqliteEventLog(settings["log_path"], synchronous=settings["log_sync"])
    limits = settings["limits"]
    warm_columnar_path()
    _write(sock, ("ready",))
    while (message := _read(sock)) is not None:
        _, stream, body, content_type, admitted, ingest_time_ms = message
        try:
            columns = columnar_body(stream, body, content_type, limits)
        except Exception as exc:  # never expected: the API process logs it and takes the per-event path
            _write(sock, ("failed", repr(exc)))
            continue
        if columns is None:
            _write(sock, ("declined",))
            continue
        if columns.num_rows > admitted:
            _write(sock, ("count", columns.num_rows))
            go = _read(sock)
            if go is None:
                break
            if go[0] != "append":
                continue
            ingest_time_ms = go[1]
        try:
            result = event_log.append_columns(stream, columns, ingest_time_ms)
        except LogUnavailable as exc:
            _write(sock, ("unavailable", str(exc)))
        except RecordTooLarge as exc:
            _write(sock, ("too_large", exc.index, exc.reason, exc.written))
        else:
            _write(sock, ("appended", columns.num_rows, result.ranges))
    event_log.close()


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole foreground process group: the API process stops its workers by
    # closing their sockets, so a worker's KeyboardInterrupt would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(socket.socket(fileno=int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
