"""Decoder of PostgreSQL's built-in logical decoding plugin `pgoutput`, protocol version 1
(https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html). Pure, no I/O.

Why our own: the protocol's version 1 is small and stable (the messages below are all of it
but Origin/Type, which we skip), and the PyPI decoders are not a fit: `pypgoutput`
(0.0.3, last release 2022) is tied to psycopg2's replication connection, and `pgoutput-decoder`
(0.1.0, a single release) is a compiled backend with a replication client of its own. We read
the messages with `pg_logical_slot_peek_binary_changes` over an ordinary psycopg 3 connection.

Tuple data: a column is `n` (null), `u` (an unchanged TOASTed value the message does not carry)
or `t` (its text form, as the type's output function writes it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# PostgreSQL's epoch (2000-01-01) in Unix milliseconds: commit times are microseconds since it.
PG_EPOCH_MS = 946_684_800_000
UNCHANGED = object()  # a `u` column: the value is not in the message (TOASTed and not updated)


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    is_key: bool  # part of the replica identity


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time_ms: int
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # where the next transaction starts: what a slot is confirmed up to
    commit_time_ms: int


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # d default (the primary key), f full, i index, n nothing
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class Insert:
    oid: int
    new: tuple


@dataclass(frozen=True)
class Update:
    oid: int
    old: tuple | None  # the old key (K, replica identity) or old row (O, FULL), when sent
    old_kind: str | None  # "K" or "O"
    new: tuple


@dataclass(frozen=True)
class Delete:
    oid: int
    old: tuple
    old_kind: str  # "K": the replica identity's columns only (others null), "O": the whole old row


@dataclass(frozen=True)
class Truncate:
    oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class LogicalMessage:
    """pg_logical_emit_message's record (asked for with 'messages' 'true'): the follower's heartbeat."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Skipped:
    kind: str  # Origin, Type: nothing a table's rows depend on


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | LogicalMessage | Skipped


class PgoutputError(ValueError):
    """A message this decoder does not understand (a newer protocol version, a corrupt message)."""


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise PgoutputError(f"message cut short at byte {self.pos} of {len(self.data)}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def byte(self) -> str:
        return chr(self.take("!B"))

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise PgoutputError("a string without its terminating NUL")
        text = self.data[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return text

    def tuple_data(self) -> tuple:
        values = []
        for _ in range(self.take("!h")):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind == "t":
                size = self.take("!i")
                if self.pos + size > len(self.data):
                    raise PgoutputError("a column value cut short")
                values.append(self.data[self.pos:self.pos + size].decode("utf-8"))
                self.pos += size
            else:  # "b" (binary) exists from protocol version 2 with binary 'on', which we never ask for
                raise PgoutputError(f"unknown tuple column kind {kind!r}")
        return tuple(values)


def _time_ms(pg_micros: int) -> int:
    return PG_EPOCH_MS + pg_micros // 1000


def decode(data: bytes) -> Message:
    """One pgoutput message (protocol version 1)."""
    r = _Reader(bytes(data))
    kind = r.byte()
    if kind == "B":
        lsn, ts, xid = r.take("!QqI")
        return Begin(lsn, _time_ms(ts), xid)
    if kind == "C":
        _flags, lsn, end, ts = r.take("!BQQq")
        return Commit(lsn, end, _time_ms(ts))
    if kind == "R":
        oid = r.take("!I")
        namespace, name = r.string(), r.string()
        identity = r.byte()
        columns = []
        for _ in range(r.take("!h")):
            flags = r.take("!B")
            col_name = r.string()
            type_oid, _typmod = r.take("!Ii")
            columns.append(Column(col_name, type_oid, bool(flags & 1)))
        return Relation(oid, namespace, name, identity, tuple(columns))
    if kind == "I":
        oid = r.take("!I")
        if r.byte() != "N":
            raise PgoutputError("an Insert without its new tuple")
        return Insert(oid, r.tuple_data())
    if kind == "U":
        oid = r.take("!I")
        marker = r.byte()
        old = old_kind = None
        if marker in ("K", "O"):
            old_kind, old = marker, r.tuple_data()
            marker = r.byte()
        if marker != "N":
            raise PgoutputError("an Update without its new tuple")
        return Update(oid, old, old_kind, r.tuple_data())
    if kind == "D":
        oid = r.take("!I")
        marker = r.byte()
        if marker not in ("K", "O"):
            raise PgoutputError("a Delete without its old key or row")
        return Delete(oid, r.tuple_data(), marker)
    if kind == "T":
        count, options = r.take("!iB")
        oids = tuple(r.take("!I") for _ in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    if kind == "M":
        flags, lsn = r.take("!BQ")
        prefix = r.string()
        size = r.take("!i")
        content = r.data[r.pos:r.pos + size]
        if len(content) != size:
            raise PgoutputError("a logical message cut short")
        return LogicalMessage(bool(flags & 1), lsn, prefix, content)
    if kind in ("O", "Y"):
        return Skipped({"O": "Origin", "Y": "Type"}[kind])
    raise PgoutputError(f"unknown pgoutput message {kind!r} (protocol version 1 is asked for)")


def lsn_to_int(text: str) -> int:
    """'16/B374D848' -> the 64-bit position."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_to_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
