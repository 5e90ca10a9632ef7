"""Waking API replicas on new changes: every batch commit NOTIFYs a channel of the store's
schema (delivered when the transaction commits, so a listener never wakes before the rows are
visible), and each API process LISTENs on one dedicated connection and sets an event its
websocket hub waits on. One listener per process, whatever the number of clients.

NOTIFY is best effort for a listener that is disconnected: while the connection is down (and
until it is back) `listening` is False and the hub reads the change feed on its poll interval
instead, so nothing is missed, only later."""

from __future__ import annotations

import hashlib
import logging
import threading

import psycopg
from psycopg import sql

log = logging.getLogger("sketchboard.store.notify")

_MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1: a longer channel name is refused


def channel_for(schema: str) -> str:
    """The change channel of a store schema; a schema name too long for a channel is hashed."""
    name = f"sketchboard_changes.{schema}"
    if len(name.encode()) > _MAX_IDENTIFIER:
        name = "sketchboard_changes." + hashlib.sha256(schema.encode()).hexdigest()[:32]
    return name


def notify_commit(conn: psycopg.Connection, channel: str, last_seq: int | None) -> None:
    """In the commit's transaction: tell listeners a batch committed (payload: its last change seq, or
    empty when it changed no pane, e.g. only a watermark)."""
    conn.execute("SELECT pg_notify(%s, %s)", (channel, "" if last_seq is None else str(last_seq)))


class ChangeListener:
    """A thread holding one connection that LISTENs on a channel; `wait(timeout)` returns True as soon
    as a commit was notified since the previous wait (False after `timeout` without one)."""

    def __init__(self, dsn: str, channel: str, *, reconnect_s: float = 1.0):
        self.dsn = dsn
        self.channel = channel
        self.reconnect_s = reconnect_s
        self.notifications = 0
        self.listening = False
        self.last_error: str | None = None
        # A count under a condition, not an Event: clearing an Event after wait() timed out would lose
        # a notification that arrived between the two.
        self._cond = threading.Condition()
        self._pending = 0
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="store-listen", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            woken, self._pending = self._pending > 0, 0
        return woken

    def _wake(self) -> None:
        with self._cond:
            self._pending += 1
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    self._conn = conn
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.listening, self.last_error = True, None
                    self._wake()  # changes may have come while not listening: read the feed once
                    while not self._stop.is_set():
                        # notifies() returns after `timeout` with none, so a stop is seen promptly.
                        for _ in conn.notifies(timeout=1.0):
                            self.notifications += 1
                            self._wake()
            except Exception as exc:  # the server went away: poll until the connection is back
                if not self._stop.is_set():
                    if self.last_error != str(exc):
                        log.warning("listening for store changes failed (polling instead): %s", exc)
                    self.last_error = str(exc)
            finally:
                self.listening = False
                self._conn = None
            self._stop.wait(self.reconnect_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
