"""How pane-shaped rows (panes and tier rows) are stored, whatever the backend: the exact
stats as JSON text, {value field: [n, sum, min, max]}, all the row's sketches in one blob (its
`sketches` column, encoded below), and the stored pieces put back together as Panes. Pure: no I/O.

The sketches blob: a version byte (1), then per sketch its kind (b"k" KLL, b"h" HLL), the
field name's length (2 bytes, big-endian) and UTF-8 bytes, the sketch's length (4 bytes,
big-endian) and its DataSketches bytes. A few lines of struct packing rather than msgpack
(not a dependency) or Arrow IPC (a stream carries its schema: a pane's three sketches, 61
bytes, are 656 bytes as an Arrow IPC stream, 105 here); big-endian so PostgreSQL's int2send/int4send write the same
bytes when an old store is migrated in SQL (store/postgres/schema.py).

The stats stay JSON text (not PostgreSQL jsonb) so both backends keep the same bytes and a
float comes back bit for bit (jsonb would also reject an infinite sum). A field's four numbers
are an array, not an object {n, sum, min, max} as before: a demo pane's stats are 80 bytes
(124 as objects). Text rather than struct-packed numbers: both stores sum the exact stats in
SQL (json_extract, ->>), which neither could do from a blob, and a backfill's numbers are short
(its panes hold one or two events: four 8-byte numbers per field and the field's name would be
~86 bytes)."""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence

from store import dim_sets
from store.panes import Pane, PaneData, PaneKey, ValueStats
from store.rollup import BucketStats, SketchRow

KLL = "kll"  # the sketch of a value field
HLL = "hll"  # the sketch of a distinct field


_STATS_JSON = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps would build one per row


def stats_text(data: PaneData) -> str:
    """The JSON text of a row's exact stats, written field by field: the text the encoder writes
    for {name: [n, sum, min, max]} (tests pin it), at a third of its cost, for every row a commit writes."""
    fields = []
    for name, v in sorted(data.values.items()):
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = _STATS_JSON.encode(name)
        n, total, lo, hi = v.n, v.sum, v.min, v.max
        # Nearly always an int and three finite floats (x - x is 0.0 only for a finite x): their
        # reprs are what the encoder writes, without a call per number.
        if (type(n) is int and type(total) is float and type(lo) is float and type(hi) is float
                and total - total == 0.0 and lo - lo == 0.0 and hi - hi == 0.0):
            fields.append(f"{key}:[{n!r},{total!r},{lo!r},{hi!r}]")
        else:
            fields.append(f'{key}:[{_number(n)},{_number(total)},{_number(lo)},{_number(hi)}]')
    return "{" + ",".join(fields) + "}"


_KEYS: dict[str, str] = {}  # field name -> its JSON string (field names are few)
_INF = float("inf")


_LARGEST = float.__repr__(sys.float_info.max)


def _number(x) -> str:
    """What the JSON encoder writes for a number or None; a sum past a double (only from values
    stored before ingest bounded them: store/exact_sum.py) as the largest double of its sign, NaN as
    null: JSON has neither, and "Infinity" was text SQLite's json_extract and PostgreSQL's jsonb
    refused, so every read of the row's stats failed for as long as it was kept."""
    if type(x) is float:
        if x != x:
            return "null"
        if x == _INF or x == -_INF:
            return _LARGEST if x > 0 else "-" + _LARGEST
        return float.__repr__(x)
    if type(x) is int:
        return int.__repr__(x)
    if x is None:
        return "null"
    return _STATS_JSON.encode(x)  # anything else (a bool, a numpy number): the encoder's own text


SKETCHES_VERSION = 1
_VERSION = bytes([SKETCHES_VERSION])
NO_SKETCHES = _VERSION  # a row without sketches
_CODE = {KLL: b"k", HLL: b"h"}
_KIND = {ord("k"): KLL, ord("h"): HLL}
_LENGTH = struct.Struct(">I")
_NAMES: dict[str, bytes] = {}  # field name -> its length and UTF-8 bytes (names are few)
_FIELDS: dict[bytes, str] = {}  # the other way


def _name(name: str) -> bytes:
    out = _NAMES.get(name)
    if out is None:
        raw = name.encode()
        out = _NAMES[name] = struct.pack(">H", len(raw)) + raw
    return out


def encoded_rows(rows: Iterable[tuple]) -> list[tuple]:
    """Rows (key, end_ms, PaneData, revision) as the stores' save_rows take them: (key, end_ms,
    count, stats text, revision, sketches blob)."""
    return [(key, end_ms, data.count, stats_text(data), revision, sketches_blob(data)) for key, end_ms, data, revision in rows]


def stats_key(name: str) -> str:
    """A value field's name as the stats text writes it (a JSON string)."""
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _STATS_JSON.encode(name)
    return key


def sketch_head(kind: str, name: str) -> bytes:
    """What precedes a sketch's length in the blob: its kind's code, the field name's length and bytes."""
    return _CODE[kind] + _name(name)


def sketches_blob(data: PaneData) -> bytes:
    """Every sketch of a row, in one blob (the format is in this module's docstring)."""
    parts = [_VERSION]
    pack = _LENGTH.pack
    for name, v in data.values.items():
        kll = v.kll
        if kll is not None:
            head = _KLL_HEADS.get(name)
            if head is None:
                head = _KLL_HEADS[name] = b"k" + _name(name)
            parts += (head, pack(len(kll)), kll)
    for name, hll in data.distincts.items():
        if hll is not None:
            head = _HLL_HEADS.get(name)
            if head is None:
                head = _HLL_HEADS[name] = b"h" + _name(name)
            parts += (head, pack(len(hll)), hll)
    return b"".join(parts)


_KLL_HEADS: dict[str, bytes] = {}  # field name -> a KLL's kind code, name length and name (names are few)
_HLL_HEADS: dict[str, bytes] = {}


def encode_sketches(sketches: Iterable[tuple[str, str, bytes]]) -> bytes:
    """The blob of (field, kind, sketch bytes) triples (a store migrated from one row per sketch)."""
    parts = [_VERSION]
    for name, kind, blob in sketches:
        blob = bytes(blob)
        parts += (_CODE[kind], _name(name), _LENGTH.pack(len(blob)), blob)
    return b"".join(parts)


def unpack_sketches(blob: bytes | None) -> Iterator[tuple[str, str, bytes]]:
    """(field, kind, sketch bytes) of every sketch in a blob."""
    if not blob:
        return
    blob = bytes(blob)  # memoryview (psycopg) or bytes
    if blob[0] != SKETCHES_VERSION:
        raise ValueError(f"sketches blob of version {blob[0]}: this Sketchboard reads version {SKETCHES_VERSION}")
    i, end = 1, len(blob)
    while i < end:
        kind = _KIND[blob[i]]
        n = (blob[i + 1] << 8) | blob[i + 2]
        raw = blob[i + 3:i + 3 + n]
        name = _FIELDS.get(raw)
        if name is None:
            name = _FIELDS[raw] = raw.decode()
        i += 3 + n
        size = _LENGTH.unpack_from(blob, i)[0]
        i += 4
        yield name, kind, blob[i:i + size]
        i += size


class SketchesAggregate:
    """encode_sketches as an SQL aggregate over (field, kind, data) rows: what SQLite's
    migration from one row per sketch registers (sqlite3 create_aggregate)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, bytes]] = []

    def step(self, name: str, kind: str, blob: bytes) -> None:
        self.rows.append((name, kind, blob))

    def finalize(self) -> bytes:
        return encode_sketches(self.rows)


def load_data(count: int, stats: str, sketches: bytes | None) -> PaneData:
    """A stored row's data with all its sketches (what a merge into it needs)."""
    klls: dict[str, bytes] = {}
    hlls: dict[str, bytes] = {}
    for name, kind, blob in unpack_sketches(sketches):
        (klls if kind == KLL else hlls)[name] = blob
    values = {name: ValueStats(n, _sum(total), lo, hi, klls.get(name))
              for name, (n, total, lo, hi) in json.loads(stats).items()}
    return PaneData(count=count, values=values, distincts=hlls)


def _sum(total: float | None) -> float:
    """A stored sum; null is a NaN one (_number writes it so), which merges into NaN as before."""
    return math.nan if total is None else total


def wanted_sketches(with_sketches: bool, value_field: str | None, distinct_field: str | None) -> list[tuple[str, str]]:
    """The (field, kind) sketches a read asks for."""
    if not with_sketches:
        return []
    return [(f, k) for f, k in ((value_field, KLL), (distinct_field, HLL)) if f]


def sketches_column(sketches: Sequence[tuple[str, str]] | None) -> str:
    """What a read selects for the sketches: the column, or NULL when none is asked for."""
    return "NULL" if sketches is not None and not sketches else "sketches"


def assemble(stream: str, rows: Iterable[tuple], sketches: Sequence[tuple[str, str]] | None) -> list[Pane]:
    """Panes from stored rows (start, dims, end, count, stats text or None, revision, updated,
    last batch, sketches blob or None), with the sketches asked for ((field, kind) pairs; None:
    all). Rows read without their stats (None) carry only the KLLs asked for."""
    wanted = None if sketches is None else set(sketches)
    out = []
    for s, d, e, count, text, revision, updated, batch, blob in rows:
        klls: dict[str, bytes] = {}
        distincts: dict[str, bytes] = {}
        for name, kind, data in unpack_sketches(blob):
            if wanted is None or (name, kind) in wanted:
                (klls if kind == KLL else distincts)[name] = data
        if text is not None:
            values = {name: ValueStats(n, _sum(total), lo, hi, klls.get(name))
                      for name, (n, total, lo, hi) in json.loads(text).items()}
        else:
            values = {name: ValueStats(0, 0.0, None, None, kll) for name, kll in klls.items()}
        out.append(Pane(PaneKey(stream, s, d), e, PaneData(count, values, distincts), revision, updated, batch))
    return out


# A field's stats as the rows written before held them, {"n":..,"sum":..,"min":..,"max":..}: the
# encoder wrote these keys in this order, and numbers, null, NaN and infinities hold none of ',{}:'
# (a value field named "n" made '{"n":{"n":0,...' match from its outer brace when '{' was allowed).
_OBJECT_STATS = re.compile(r'\{"n":([^,{}:]*),"sum":([^,{}:]*),"min":([^,{}:]*),"max":([^,{}:]*)\}')
OBJECT_STATS_PATTERN = _OBJECT_STATS.pattern  # PostgreSQL's regexp_replace migrates with the same one


def array_stats(text: str) -> str:
    """Stats text as rows written before held it -> this layout's: the same numbers, as written."""
    return _OBJECT_STATS.sub(r"[\1,\2,\3,\4]", text)


def bucket_stats(rows: Iterable[tuple], group_by: Sequence[str]) -> list[BucketStats]:
    """BucketStats from a store's grouped sums: rows of (bucket, dims text, count, highest
    revision, n, sum, min, max, newest batch, rows summed), grouped by the stored dimensions
    text (no JSON parsing per row); each distinct text is parsed once and mapped to its group."""
    groups: dict[str, tuple[str, ...]] = {}
    out = []
    for bucket, dims, count, revision, n, total, lo, hi, last_batch, summed in rows:
        group = groups.get(dims)
        if group is None:
            parsed = json.loads(dims)
            group = groups[dims] = tuple(parsed.get(name, "") for name in group_by)
        out.append(BucketStats(group, bucket, count, revision, int(n or 0), float(total or 0.0), lo, hi,
                               last_batch, summed))
    return out


def sketch_of(blob: bytes | None, name: str, kind: str) -> bytes | None:
    """The bytes of one (field, kind) sketch in a sketches blob, None when the row has none: what a
    sketch query reads from each row (a minute row of the demo holds three sketches, ~11 KB; this
    skips the others without decoding their names, ~1 us a row)."""
    if not blob:
        return None
    key = _KEY.get((name, kind))
    if key is None:
        key = _KEY[(name, kind)] = _CODE[kind] + _name(name)
    blob = bytes(blob)  # memoryview (psycopg) or bytes
    if blob[0] != SKETCHES_VERSION:
        raise ValueError(f"sketches blob of version {blob[0]}: this Sketchboard reads version {SKETCHES_VERSION}")
    head = len(key)
    i, end = 1, len(blob)
    while i < end:
        at = i + 3 + ((blob[i + 1] << 8) | blob[i + 2])  # the sketch's length, after the kind and the name
        size = _LENGTH.unpack_from(blob, at)[0]
        if at - i == head and blob.startswith(key, i):
            return blob[at + 4:at + 4 + size]
        i = at + 4 + size
    return None


_KEY: dict[tuple[str, str], bytes] = {}  # (field, kind) -> its kind code, name length and name, as the blob holds them


def sketch_rows(rows: Iterable[tuple], field: str, kind: str) -> list[SketchRow]:
    """SketchRows from stored rows (start, dims text, count, revision, sketches blob, newest batch)
    with the `kind` sketch of `field` (PaneStore.read_tier_sketch)."""
    return [SketchRow(start, dims, count, revision, sketch_of(blob, field, kind), last_batch)
            for start, dims, count, revision, blob, last_batch in rows]


def sketch_rows_select(table: str, span: str) -> str:
    """The SELECT of sketch_rows' input from `table`'s rows matching `span`, both stores' SQL."""
    return ("SELECT t.start_ms, d.dims, t.count, t.revision, t.sketches, t.last_batch FROM "
            + dim_sets.joined(f"SELECT stream, dims_id, start_ms, count, revision, sketches, last_batch FROM {table}"
                              f" WHERE {span}")
            + " ORDER BY t.start_ms")
