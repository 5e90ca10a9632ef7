"""NDJSON bodies parsed and validated as columns, for the ingest API's common case. Pure.

The per-event validator (ingest/events.py) costs a pydantic model per event and explains every
reason an event is refused. Most bodies have nothing to refuse: every line an object with the
stream's declared fields, of the declared JSON types. For those, our own scanner (compiled by
Numba; it releases the GIL: ingest/columnar_scan.py) reads the body straight into the log's
segment columns, Arrow's JSON reader (C++, also without the GIL) reads what the scanner leaves,
and the rules are checked on whole columns.

This path only ever says "all of these events are valid, here they are" or "I cannot tell"
(None): whatever it cannot decide exactly as the per-event rules would — a string where a number
belongs, an integer as a label, an RFC 3339 time, an undeclared field, a missing key, a value
out of range, two objects on one line, a malformed line — goes to the per-event path, which
accepts, rejects and words its reasons as it always has. So answers never depend on which path
ran; tests/unit/test_columnar_ingest.py checks that, property-based.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from catalog import StreamDef
from catalog.times import EPOCH_MS_THRESHOLD, MAX_EVENT_TIME_MS
from ingest.events import MAX_LABEL_BYTES, MAX_STRING_LENGTH, NUL
from ingest.json_limits import JsonLimits

# An integer literal past int64 is read as a double, so a value column cannot tell 1e45 from a
# 46-digit integer, which the JSON bounds refuse (max_int_digits, at least 19 where this path runs):
# a value this large or larger is left to the per-event path. int64 integers stay below it.
BIG_NUMBER = 1e19

_NEWLINE, _BRACE = ord("\n"), ord("{")


def limits_allow(limits: JsonLimits) -> bool:
    """Whether every event this path takes is also inside the JSON bounds the per-event path
    checks (they can be set tighter than the validator's own: then only that path decides).
    Taken events are one flat object of declared fields: labels of at most MAX_STRING_LENGTH
    characters, 64-bit integers, finite numbers."""
    return limits.max_depth >= 1 and limits.max_string_chars >= MAX_STRING_LENGTH and limits.max_int_digits >= 19


def object_lines(body: bytes) -> int | None:
    """Non-blank lines, as the per-event NDJSON reader counts events (split on \\n only), or
    None if one of them does not start like an object: the per-event path rejects those lines,
    and Arrow 26's reader crashes the process on a body whose first line is `null`."""
    data = np.frombuffer(body, np.uint8)
    line_starts = np.flatnonzero(data == _NEWLINE) + 1
    if body.endswith(b"\n"):
        line_starts = line_starts[:-1]  # the empty piece after the last newline: no line
    if body[:1] == b"{" and bool((data[line_starts] == _BRACE).all()):
        # Compact NDJSON, the common case: every line starts with its brace, none is blank. Then
        # each piece between newlines is one object line, found by one vectorized scan (~0.4 ms of
        # a 10 000-line body) where the walk below costs ~1.7 ms (~10 % of its columnar parse).
        # Anything else walks the lines.
        return len(line_starts) + 1
    count = 0
    for line in body.split(b"\n"):
        start = line.lstrip()[:1]
        if start == b"{":
            count += 1
        elif start:
            return None
    return count


# What reads a body into columns (columnar_events). "scan": our own scanner of the plainest JSON
# (ingest/columnar_scan.py), and Arrow's reader for what it leaves.
READERS = ("scan", "arrow")


def columnar_events(stream: StreamDef, body: bytes, *, ndjson: bool = True, reader: str = "scan") -> pa.Table | None:
    """The body's events (NDJSON, or a JSON array with `ndjson=False`) as columns named like the
    stream's fields — the event time in epoch ms, labels with missing dimensions as "" — or None
    when the per-event path must decide. `reader`: our scanner, then Arrow's reader for what it
    leaves ("scan"); or Arrow's JSON reader alone. Both release the GIL, and take only bodies the
    per-event path accepts whole, into the same columns. (msgspec's typed decoder was the ingest
    workers' reader until session 99: the scanner reads a body in half its time.)"""
    if reader not in READERS:
        raise ValueError(f"reader {reader!r} is not one of {', '.join(READERS)}")
    try:
        return _columnar_events(stream, body, ndjson, reader)
    except pa.ArrowException:
        # Arrow 26 fails on some shapes it produced itself (combining a list<null> or a struct
        # with no fields): never an answer of its own, the per-event path decides.
        return None


def _columnar_events(stream: StreamDef, body: bytes, ndjson: bool, reader: str) -> pa.Table | None:
    if stream.sent_time_field:
        return None  # a second time field, by the device's clock: not read as columns yet
    if not body.strip():
        return None
    if reader == "scan":
        # Imported here: Numba adds ~80 MB to a process (~120 MB with the kernels loaded), which
        # only the processes that read bodies need (the API, its workers, a Kafka source).
        from ingest.columnar_scan import scanned_fields
        scanned = scanned_fields(stream, body, ndjson)  # it checks the labels' UTF-8 itself
        if scanned is not None:
            # A NUL is a control character or an escape in JSON, both of which the scanner leaves.
            return _validated(stream, *scanned, search_nul=False)
        reader = "arrow"
    try:  # Arrow's reader does not check that strings are UTF-8 (measured: 1 ms per 2 MB)
        body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = object_lines(body) if ndjson else None
    if ndjson and not lines:
        return None
    if not ndjson:
        stripped = body.strip()
        if not (stripped.startswith(b"[") and stripped.endswith(b"]")):
            return None  # the wrapper below must hold one array and nothing else
    try:
        # Types inferred, then checked: measured twice as fast here as an explicit schema, and a
        # value of another JSON type than its column's is an error either way. One thread: the
        # reader releases the GIL, so concurrent requests already use every core. The reader
        # takes objects, one per line: an array becomes one object holding it, whose list of
        # structs is then flattened into the events.
        # One join, not two `+`: each `+` made a new copy of the whole body, and on this VM a copy of
        # fresh memory costs its page faults (~2 ms of a 10 000-event body's ~28: docs/benchmarks.md).
        text = body if ndjson else b"".join((b'{"events":', body, b"}"))
        table = pj.read_json(io.BytesIO(text), read_options=pj.ReadOptions(use_threads=False, block_size=len(text) + 1))
    except (pa.ArrowException, ValueError):  # any error of the reader's: the per-event path explains
        return None
    declared = {stream.time_field, *stream.string_fields, *stream.values}
    if ndjson:
        # Two objects on one line are two rows here but one malformed line per event.
        if table.num_rows != lines:
            return None
        names = table.column_names
        if any(name not in declared for name in names):
            return None  # undeclared fields are kept as JSON text by the per-event path
        fields = {name: table.column(name) for name in names}
        rows = table.num_rows
    else:
        if table.column_names != ["events"]:
            return None  # `[...], "x": 1` would have become a second field of the wrapper
        events = table.column("events")
        if table.num_rows != 1 or not pa.types.is_list(events.type) or not pa.types.is_struct(events.type.value_type):
            return None  # not an array of objects (and list<null> is not combined: Arrow 26 fails on it)
        names = [events.type.value_type.field(i).name for i in range(events.type.value_type.num_fields)]
        if any(name not in declared for name in names) or len(set(names)) != len(names):
            return None
        structs = pc.list_flatten(events.combine_chunks())
        if structs.null_count:
            return None  # a null in the array is not an event
        fields = dict(zip(names, structs.flatten(), strict=True))
        rows = len(structs)
    return _validated(stream, fields, rows, search_nul=_may_hold_nul(body))


def _may_hold_nul(body: bytes) -> bool:
    """Whether a string of the body can hold a NUL: JSON writes one only as the escape `\\u0000`
    (Arrow's reader refuses a raw control character in a string; a raw NUL is looked for all the
    same). A scan for a byte (memchr), and for the escape only in a body holding a backslash, answer
    for a whole body where a substring search of every label column cost ~1.4 ms of a 10 000-event
    body; the columns are searched only when the bytes may hold one."""
    return b"\x00" in body or (b"\\" in body and b"\\u0000" in body)


def _validated(stream: StreamDef, fields: dict[str, pa.Array | pa.ChunkedArray], rows: int, *,
               search_nul: bool) -> pa.Table | None:
    # Each check runs once over all the labels, and once over all the values: a kernel call costs
    # tens of microseconds whatever its length, and releases the GIL, which the other requests'
    # threads then take (docs/benchmarks.md, session 81).
    columns: dict[str, pa.Array] = {}
    time_ms = _event_time_ms(_column(fields, rows, stream.time_field, pa.int64()))
    if time_ms is None:
        return None
    columns[stream.time_field] = time_ms
    labels = {}
    for name in stream.string_fields:
        column = _column(fields, rows, name, pa.string())
        if column is None or (name in (stream.key_field, stream.event_id_field) and column.null_count):
            return None  # a key or an event id must be there: the per-event path says which
        labels[name] = column
    if labels:
        every_label = pa.chunked_array(list(labels.values()), pa.string())
        widest = pc.max(pc.binary_length(every_label)).as_py()  # None when all are null
        if widest is not None and widest > MAX_LABEL_BYTES:
            return None  # the per-event path refuses it, saying why
        # Characters are counted only where the bytes could be too many: a label has at most as
        # many characters as bytes.
        if widest is not None and widest > MAX_STRING_LENGTH \
                and pc.max(pc.utf8_length(every_label)).as_py() > MAX_STRING_LENGTH:
            return None
        if search_nul and pc.any(pc.match_substring(every_label, NUL)).as_py():
            return None  # likewise
    for name, column in labels.items():
        columns[name] = pc.fill_null(column, "") if name in stream.dimensions and column.null_count else column
    numbers = {}
    for name in stream.values:
        column = _column(fields, rows, name, pa.float64())
        if column is None:
            return None
        numbers[name] = column
    if numbers and not _plain_numbers(pa.chunked_array(list(numbers.values()), pa.float64())):
        return None
    columns.update(numbers)
    return pa.table(columns)


def _plain_numbers(values: pa.ChunkedArray) -> bool:
    """No NaN or Infinity (the per-event path names the field) and none at or past BIG_NUMBER in
    magnitude (maybe an integer literal past max_int_digits, which Arrow read as a double). Two
    kernel calls: min_max skips NaN, but a NaN makes the sum NaN; an infinity shows in min_max; and
    finite values under BIG_NUMBER cannot add up to an overflow (BIG_NUMBER x any row count here is
    far below a double's range)."""
    low, high = _extremes(values)
    if low is None:
        return True  # every value null
    if not (-BIG_NUMBER < low and high < BIG_NUMBER):
        return False  # also the infinities
    return math.isfinite(pc.sum(values).as_py())


def _extremes(values: pa.Array | pa.ChunkedArray) -> tuple:
    """(min, max) of the values in one kernel call, nulls (and a float's NaN) skipped; (None, None)
    when none is left."""
    extremes = pc.min_max(values)
    return extremes["min"].as_py(), extremes["max"].as_py()


def _column(fields: dict[str, pa.Array], rows: int, name: str, want: pa.DataType) -> pa.Array | None:
    """A declared field's column as `want`, all null when no event has it; None when its
    inferred type is another (a boolean, a number for a label, an object...)."""
    column = fields.get(name)
    if column is None or pa.types.is_null(column.type):
        return pa.nulls(rows, want)
    if column.type == want:
        return _combined(column)
    if want == pa.float64() and pa.types.is_int64(column.type):
        return _combined(column).cast(pa.float64(), safe=False)  # to nearest, as float() of an int rounds
    return None


def _combined(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _event_time_ms(times: pa.Array | None) -> pa.Array | None:
    """Epoch ms from integers (seconds below EPOCH_MS_THRESHOLD, as parse_event_time_ms), or
    None if any is outside 1970..9999."""
    if times is None or times.null_count:
        return None
    values = times
    low, high = _extremes(values)
    if low is not None and low >= EPOCH_MS_THRESHOLD and high <= MAX_EVENT_TIME_MS:
        return values  # the common case, every time in ms already: one kernel call, not six
    try:  # checked arithmetic: abs(-2^63) would wrap around into the valid range
        is_ms = pc.greater_equal(pc.abs_checked(values), EPOCH_MS_THRESHOLD)
        ms = pc.if_else(is_ms, values, pc.multiply_checked(values, 1000))
    except pa.ArrowInvalid:
        return None
    if len(ms) and (pc.min(ms).as_py() < 0 or pc.max(ms).as_py() > MAX_EVENT_TIME_MS):
        return None
    return ms
