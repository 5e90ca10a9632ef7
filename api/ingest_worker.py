"""An ingest worker process (api/ingest_workers.py starts it): parses, checks and appends the
bodies the API process sends down its socket, a group at a time, until the socket ends (the API
process closed it, or died). The conversation is described in api/ingest_workers.py.

    python -m api.ingest_worker FD
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import sys

import pyarrow as pa

from ingest.log import LogUnavailable

LENGTH = struct.Struct("!I")  # a frame: its length, then a pickle



def _read(sock: socket.socket) -> tuple | None:
    """The next message, or None at the end of the socket (the API process closed it or died)."""
    head = _read_exactly(sock, LENGTH.size)
    if head is None:
        return None
    data = _read_exactly(sock, LENGTH.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None at the end of the socket. MSG_WAITALL: mostly one call, into the bytes
    object it returns (no copy into another)."""
    data = sock.recv(size, socket.MSG_WAITALL) if size else b""
    if len(data) == size:
        return data
    parts, got = [data], len(data)
    while data and got < size:  # cut short by a signal
        data = sock.recv(size - got, socket.MSG_WAITALL)
        parts.append(data)
        got += len(data)
    return b"".join(parts) if got == size else None


def _write(sock: socket.socket, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(LENGTH.pack(len(data)) + data)


def serve(sock: socket.socket) -> None:
    """A worker's loop: one group of bodies at a time, until the socket ends."""
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
    streams = {}  # the definitions the API process sent, by name: each comes once, or again when changed
    while (message := _read(sock)) is not None:
        _, name, definition, sizes, ingest_time_ms = message
        if definition is not None:
            streams[name] = definition
        items = []
        for size, content_type, admitted in sizes:  # the bodies follow the message
            body = _read_exactly(sock, size)
            if body is None:
                break
            items.append((body, content_type, admitted))
        if len(items) < len(sizes) or not _group(sock, event_log, limits, streams[name], items, ingest_time_ms):
            break
    event_log.close()


def _group(sock: socket.socket, event_log, limits, stream, items: list[tuple[bytes, str, int]],
           ingest_time_ms: int) -> bool:
    """A group (api/ingest_workers.py): each body parsed and checked on its own; those within their
    admitted rows appended together at once, the others held until the API process says which of
    them to append. False when the socket ended meanwhile."""
    from api.bodies import columnar_body

    answers: list[tuple] = [("declined",)] * len(items)
    now: dict[int, pa.Table] = {}  # appended unasked
    held: list[pa.Table] = []  # the API process decides
    for index, (body, content_type, admitted) in enumerate(items):
        try:
            # The API process's reader (our scanner, then Arrow's), until session 99 msgspec's here.
            columns = columnar_body(stream, body, content_type, limits)
        except Exception as exc:  # never expected: the API process logs it and takes the per-event path
            answers[index] = ("failed", repr(exc))
            continue
        if columns is None:
            continue
        if columns.num_rows > admitted:
            answers[index] = ("count", columns.num_rows)
            held.append(columns)
        else:
            now[index] = columns
    for index, answer in zip(now, _append(event_log, stream, list(now.values()), ingest_time_ms)):
        answers[index] = answer
    _write(sock, ("group", answers))
    if not held:
        return True
    go = _read(sock)
    if go is None:
        return False
    _, ingest_time_ms, indices = go
    _write(sock, ("group", _append(event_log, stream, [held[index] for index in indices], ingest_time_ms)))
    return True


def _append(event_log, stream, tables: list[pa.Table], ingest_time_ms: int) -> list[tuple]:
    """The tables appended together (`append_column_groups`: one transaction, one segment a
    partition): ("appended", rows, ranges) for each, or ("unavailable", why) for all."""
    if not tables:
        return []
    try:
        results = event_log.append_column_groups(stream, tables, ingest_time_ms)
    except LogUnavailable as exc:
        return [("unavailable", str(exc))] * len(tables)
    return [("appended", table.num_rows, result.ranges) for table, result in zip(tables, results, strict=True)]


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole foreground process group: the API process stops its workers by
    # closing their sockets, so a worker's KeyboardInterrupt would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(socket.socket(fileno=int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
