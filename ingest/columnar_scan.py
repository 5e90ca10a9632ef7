"""A body's events read into columns by a scanner of our own, compiled by Numba, for
ingest/columnar.py. Pure.

Why our own: the end to end (issue 28) spends more on the parse than on anything else of the
API's, and every library tried reads a 10 000-event body at 0.6-1.4 us an event on this machine
(Arrow's reader, msgspec into columns, Polars, DuckDB, arro3: docs/benchmarks.md). A reader that
knows the stream's fields reads one flat object per event in a single pass, at ~0.2 us, straight
into the columns' buffers. It releases the GIL (`nogil`), so it runs in the API's threads as well
as in the ingest worker processes.

It reads only the plainest JSON, and says None for anything else, which the next reader then
decides (Arrow's; then the per-event path): objects of declared fields, each at most once, in any
order; labels as strings of UTF-8 (checked here as Python's strict decoder does; anything past
ASCII outside a label is malformed) without an escape or a control character; the time as an
integer of at most 18 digits; values as any JSON number (an integer of at most 18 digits) as
Python's float() makes it: here where that is exact to compute (Clinger's fast path: a mantissa
of at most 2**53 and a power of ten of at most 22, so one multiplication or division rounds
once), else by float() of its text (the 17 digits that Python and JavaScript write for most
doubles); nulls; JSON whitespace between tokens (not a newline inside an NDJSON line). Whether a
value is allowed (the label limits, the time's range, the value's magnitude) is checked on the
columns afterwards (ingest/columnar.py `_validated`), as for the other readers.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

TIME, LABEL, VALUE = 0, 1, 2  # a field's kind, as the kernel reads it

# Bytes at which a name's scan stops: its closing quote, a backslash (an escape: left to the next
# reader) and the control characters (malformed inside a JSON string). A label's scan stops at
# every byte past ASCII too, to check its UTF-8 sequence (`_utf8`).
_STOPS = np.zeros(256, np.uint8)
_STOPS[:0x20] = 1
_STOPS[ord('"')] = 1
_STOPS[ord("\\")] = 1
_LABEL_STOPS = _STOPS.copy()
_LABEL_STOPS[0x80:] = 1
_POWERS = np.array([10.0 ** i for i in range(23)])  # exact doubles
_EXACT_MANTISSA = 2 ** 53
_MAX_DIGITS = 18  # an integer of at most 18 digits fits an int64

_SPACE, _TAB, _CR, _NEWLINE = 0x20, 0x09, 0x0D, 0x0A
_QUOTE, _COLON, _COMMA, _MINUS, _DOT = ord('"'), ord(":"), ord(","), ord("-"), ord(".")
_OPEN, _CLOSE, _OPEN_ARRAY, _CLOSE_ARRAY = ord("{"), ord("}"), ord("["), ord("]")
_ZERO, _NINE, _PLUS, _E, _BIG_E = ord("0"), ord("9"), ord("+"), ord("e"), ord("E")
_N, _U, _L = ord("n"), ord("u"), ord("l")

# The small helpers are inlined into the scan by Numba itself (`inline="always"`): 0.40 -> 0.35 us
# an event for the side by side's bodies, where LLVM left them as calls.
#
# The scan and what it calls run without Numba's reference counting (`_nrt=False`, Numba's own flag
# for code that allocates nothing): every array handed to an inlined helper was counted up and down
# again with an atomic instruction, and those were 37 % of the scan's time (perf: `lock incq` and
# `lock decq` in NRT_incref/NRT_decref). ~330 -> ~240 ns an event. So nothing here allocates: the
# caller passes every array, `seen` too.
_NO_REFCOUNTS = {"nogil": True, "cache": True, "_nrt": False}


_WORD_POINTER = ir.IntType(64).as_pointer()


def _address(context, builder, signature, args):
    """In an intrinsic's code: a pointer to array[at], its first two arguments (a 1-d array)."""
    view = context.make_array(signature.args[0])(context, builder, args[0])
    return builder.gep(view.data, [args[1]])


@intrinsic
def _item(typingctx, array, at):
    """array[at] for an `at` known to be in [0, len) of a 1-d array: what Numba's indexing adds for
    a negative index (a compare and a conditional move a read) was ~17 % of the scan, whose every
    read is of a position it has checked (173 -> 144 ns an event)."""
    def codegen(context, builder, signature, args):
        return builder.load(_address(context, builder, signature, args))
    return array.dtype(array, at), codegen


@njit(**_NO_REFCOUNTS, inline="always")
def _space(c, newline):
    return c == _SPACE or c == _TAB or c == _CR or (newline and c == _NEWLINE)


@njit(**_NO_REFCOUNTS, inline="always")
def _skip(data, pos, n, newline):
    while pos < n and _space(_item(data, pos), newline):
        pos += 1
    return pos


@njit(**_NO_REFCOUNTS)
def _utf8(data, pos, n):
    """The position after the UTF-8 sequence starting at data[pos] (a byte past ASCII), or -1 where
    it is not one Python's strict decoder takes (a stray continuation, an overlong form, a
    surrogate, past U+10FFFF, cut short)."""
    lead = _item(data, pos)
    low, high = 0x80, 0xBF  # the first continuation byte's range
    if 0xC2 <= lead <= 0xDF:
        more = 1
    elif 0xE0 <= lead <= 0xEF:
        more = 2
        if lead == 0xE0:
            low = 0xA0  # not overlong
        elif lead == 0xED:
            high = 0x9F  # not a surrogate
    elif 0xF0 <= lead <= 0xF4:
        more = 3
        if lead == 0xF0:
            low = 0x90
        elif lead == 0xF4:
            high = 0x8F  # not past U+10FFFF
    else:
        return -1
    if pos + more >= n:
        return -1
    if _item(data, pos + 1) < low or _item(data, pos + 1) > high:
        return -1
    for k in range(2, more + 1):
        if _item(data, pos + k) < 0x80 or _item(data, pos + k) > 0xBF:
            return -1
    return pos + more + 1


@intrinsic
def _word(typingctx, array, at):
    """The 8 bytes array[at:at + 8] as one little-endian uint64, read unaligned (the caller knows
    they are there)."""
    def codegen(context, builder, signature, args):
        return builder.load(builder.bitcast(_address(context, builder, signature, args), _WORD_POINTER), align=1)
    return types.uint64(array, at), codegen


@intrinsic
def _first_flagged(typingctx, flags):
    """The index of the lowest byte of `flags` (not 0) whose high bit is set, as an int64."""
    def codegen(context, builder, signature, args):
        return builder.lshr(builder.cttz(args[0], ir.Constant(ir.IntType(1), 0)), ir.Constant(ir.IntType(64), 3))
    return types.int64(types.uint64), codegen


_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_BACKSLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_CONTROLS = np.uint64(0x2020202020202020)


@njit(**_NO_REFCOUNTS, inline="always")
def _plain_until(data, pos, n):
    """The first position from `pos` on of a byte in _LABEL_STOPS, or n: 8 bytes at a time, each
    word's stops flagged by their high bit (a byte below 0x20: `x - 0x20` borrows into it; a quote
    or a backslash: that byte of `x ^ it` is 0 and `- 1` borrows; past ASCII: its own high bit). A
    borrow can flag a byte above a flagged one, never below, so the lowest flag is exact."""
    while pos + 8 <= n:
        word = _word(data, pos)
        quotes = word ^ _QUOTES
        backslashes = word ^ _BACKSLASHES
        flags = (((word - _CONTROLS) & ~word) | ((quotes - _ONES) & ~quotes) | ((backslashes - _ONES) & ~backslashes)
                 | word) & _HIGHS
        if flags != 0:
            return pos + _first_flagged(flags)
        pos += 8
    while pos < n and _LABEL_STOPS[_item(data, pos)] == 0:
        pos += 1
    return pos


@njit(**_NO_REFCOUNTS, inline="always")
def _named(data, start, names, first, length):
    """Whether data[start:start + length] is the declared name at names[first:first + length]
    (`names` has 8 bytes of padding past its end), compared 8 bytes at a time."""
    j = 0
    while j + 8 <= length:
        if _word(data, start + j) != _word(names, first + j):
            return False
        j += 8
    if j == length:
        return True
    if start + j + 8 <= data.shape[0]:  # the rest in one word, its bytes past the name masked off
        keep = (np.uint64(1) << np.uint64(8 * (length - j))) - np.uint64(1)
        return ((_word(data, start + j) ^ _word(names, first + j)) & keep) == 0
    for k in range(j, length):
        if _item(data, start + k) != names[first + k]:
            return False
    return True


@njit(**_NO_REFCOUNTS, inline="always")
def _expected(data, start, n, names, name_ends, field):
    """`field` if its name and the closing quote are at data[start:], else -1: events mostly keep
    one order, so the field after the last one is tried first, without finding the quote."""
    if field >= name_ends.shape[0]:
        return -1
    first = 0 if field == 0 else name_ends[field - 1]
    length = name_ends[field] - first
    if start + length >= n or _item(data, start + length) != _QUOTE:
        return -1
    return field if _named(data, start, names, first, length) else -1


@njit(**_NO_REFCOUNTS)
def _field(data, start, length, names, name_ends):
    """The field whose name is data[start:start + length]; -1 for an undeclared name."""
    first = 0
    for index in range(name_ends.shape[0]):
        if name_ends[index] - first == length and _named(data, start, names, first, length):
            return index
        first = name_ends[index]
    return -1


@njit(**_NO_REFCOUNTS)
def _scan(data, array, names, name_ends, kinds, numbers, values, present, ends, seen):
    """The events of `data` (NDJSON, or a JSON array when `array`) into per-field rows: `present`
    1 where the event has a non-null value; a time in `numbers`, a value in `values`, a label as
    its bytes data[numbers:ends]. Returns the event count, or -1 where the next reader decides.
    `seen`: room for a flag a field."""
    n = data.shape[0]
    fields = kinds.shape[0]
    capacity = present.shape[1]
    newline = array  # between an NDJSON line's tokens, a newline would end the line
    pos = _skip(data, 0, n, True)
    if array:
        if pos >= n or _item(data, pos) != _OPEN_ARRAY:
            return -1
        pos = _skip(data, pos + 1, n, True)
    rows = 0
    while True:
        if pos >= n or _item(data, pos) != _OPEN or rows >= capacity:
            return -1
        pos += 1
        for field in range(fields):
            seen[field] = 0
            present[field, rows] = 0
        last = -1
        while True:  # a field: "name": value, then a comma or the closing brace
            pos = _skip(data, pos, n, newline)
            if pos >= n or _item(data, pos) != _QUOTE:
                return -1  # also an empty object: the next reader decides
            start = pos + 1
            field = _expected(data, start, n, names, name_ends, last + 1)
            if field >= 0:
                pos = name_ends[field] - (0 if field == 0 else name_ends[field - 1]) + start
            else:
                pos = start
                while pos < n and _STOPS[_item(data, pos)] == 0:
                    pos += 1
                if pos >= n or _item(data, pos) != _QUOTE:
                    return -1
                field = _field(data, start, pos - start, names, name_ends)
            if field < 0 or seen[field]:
                return -1  # undeclared, or a name twice (the readers differ on which value wins)
            seen[field] = 1
            last = field
            pos = _skip(data, pos + 1, n, newline)
            if pos >= n or _item(data, pos) != _COLON:
                return -1
            pos = _skip(data, pos + 1, n, newline)
            if pos >= n:
                return -1
            c = _item(data, pos)
            kind = kinds[field]
            if c == _N:
                if (pos + 4 > n or _item(data, pos + 1) != _U or _item(data, pos + 2) != _L
                        or _item(data, pos + 3) != _L):
                    return -1
                pos += 4
            elif kind == LABEL:
                if c != _QUOTE:
                    return -1
                start = pos + 1
                pos = start
                while True:
                    pos = _plain_until(data, pos, n)
                    if pos >= n or _item(data, pos) < 0x80:
                        break
                    pos = _utf8(data, pos, n)
                    if pos < 0:
                        return -1
                if pos >= n or _item(data, pos) != _QUOTE:
                    return -1
                numbers[field, rows] = start
                ends[field, rows] = pos
                present[field, rows] = 1
                pos += 1
            else:
                pos = _number(data, pos, n, kind, numbers, values, present, ends, field, rows)
                if pos < 0:
                    return -1
            pos = _skip(data, pos, n, newline)
            if pos >= n:
                return -1
            c = _item(data, pos)
            pos += 1
            if c == _CLOSE:
                break
            if c != _COMMA:
                return -1
        rows += 1
        if array:
            pos = _skip(data, pos, n, True)
            if pos >= n:
                return -1
            c = _item(data, pos)
            if c == _CLOSE_ARRAY:
                return rows if _skip(data, pos + 1, n, True) == n else -1
            if c != _COMMA:
                return -1
            pos = _skip(data, pos + 1, n, True)
        else:
            pos = _skip(data, pos, n, False)
            if pos < n and _item(data, pos) != _NEWLINE:
                return -1  # a second object, or anything else, on the line
            pos = _skip(data, pos, n, True)
            if pos >= n:
                return rows


@njit(**_NO_REFCOUNTS, inline="always")
def _number(data, pos, n, kind, numbers, values, present, ends, field, row):
    """A JSON number at `pos`: a time (an integer) into numbers[field, row]; a value, as Python's
    float() makes it, into values[field, row], or where that is not exact to compute here, its
    text's span into numbers/ends with present 2 (scanned_fields converts it). The position after
    it, or -1 where the next reader decides (a time with a fraction, an exponent or too many
    digits; an integer value of more than 18 digits, which is past the values' range anyway;
    anything malformed)."""
    start = pos
    negative = _item(data, pos) == _MINUS
    if negative:
        pos += 1
    if pos >= n or _item(data, pos) < _ZERO or _item(data, pos) > _NINE:
        return -1
    mantissa = 0
    digits = 0
    if _item(data, pos) == _ZERO:
        pos += 1  # a digit after a leading zero is left where the number ends: not a comma, so malformed
    else:
        while pos < n and _ZERO <= _item(data, pos) <= _NINE:
            if digits < _MAX_DIGITS:
                mantissa = mantissa * 10 + (_item(data, pos) - _ZERO)
            digits += 1
            pos += 1
    fraction = 0
    literal_integer = True  # no fraction, no exponent: an int in Python
    if pos < n and _item(data, pos) == _DOT:
        literal_integer = False
        pos += 1
        if kind == TIME or pos >= n or _item(data, pos) < _ZERO or _item(data, pos) > _NINE:
            return -1
        while pos < n and _ZERO <= _item(data, pos) <= _NINE:
            if digits < _MAX_DIGITS:
                mantissa = mantissa * 10 + (_item(data, pos) - _ZERO)
                fraction += 1
            digits += 1
            pos += 1
    exponent = 0
    if pos < n and (_item(data, pos) == _E or _item(data, pos) == _BIG_E):
        if kind == TIME:
            return -1
        pos += 1
        minus = pos < n and _item(data, pos) == _MINUS
        if pos < n and (_item(data, pos) == _MINUS or _item(data, pos) == _PLUS):
            pos += 1
        if pos >= n or _item(data, pos) < _ZERO or _item(data, pos) > _NINE:
            return -1
        while pos < n and _ZERO <= _item(data, pos) <= _NINE:
            if exponent < 100_000:
                exponent = exponent * 10 + (_item(data, pos) - _ZERO)
            pos += 1
        if minus:
            exponent = -exponent
        literal_integer = False
    if digits > _MAX_DIGITS and (kind == TIME or literal_integer):
        return -1
    if kind == TIME:
        numbers[field, row] = -mantissa if negative else mantissa
        present[field, row] = 1
        return pos
    if literal_integer:
        # Python makes it an int, then the validator a float: rounded once, as here.
        values[field, row] = float(-mantissa if negative else mantissa)
        present[field, row] = 1
        return pos
    power = exponent - fraction
    if digits <= _MAX_DIGITS and mantissa <= _EXACT_MANTISSA and -22 <= power <= 22:
        value = float(mantissa) * _POWERS[power] if power >= 0 else float(mantissa) / _POWERS[-power]
        values[field, row] = -value if negative else value
        present[field, row] = 1
    else:
        numbers[field, row] = start
        ends[field, row] = pos
        present[field, row] = 2
    return pos


@intrinsic
def _put_word(typingctx, array, at, word):
    """array[at:at + 8] = the 8 bytes of `word` (little-endian), written unaligned (the caller
    knows there is room)."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], builder.bitcast(_address(context, builder, signature, args), _WORD_POINTER), align=1)
        return context.get_dummy_value()
    return types.none(array, at, word), codegen


@njit(nogil=True, cache=True)
def _gather(data, starts, ends, present, rows):
    """A label column's Arrow buffers: int32 offsets and the bytes ("" for a missing label), the
    latter with 8 bytes of room past its end. Labels are copied 8 bytes at a time: a word's bytes
    past a label's end are overwritten by the next label's (~43 -> ~28 ns an event for the side by
    side's labels, where a byte at a time cost more per label than per byte)."""
    n = data.shape[0]
    offsets = np.zeros(rows + 1, np.int32)
    total = 0
    for row in range(rows):
        if _item(present, row):
            total += _item(ends, row) - _item(starts, row)
        offsets[row + 1] = total
    out = np.empty(total + 8, np.uint8)
    at = 0
    for row in range(rows):
        if _item(present, row):
            i, end = _item(starts, row), _item(ends, row)
            while i + 8 <= end or (i < end and i + 8 <= n):
                _put_word(out, at, _word(data, i))
                at += min(8, end - i)
                i += 8
            while i < end:  # the body's last bytes: fewer than 8 are left to read
                out[at] = _item(data, i)
                at += 1
                i += 1
    return offsets, out


@lru_cache(maxsize=256)
def _plan(time_field: str, labels: tuple[str, ...], values: tuple[str, ...]):
    """A stream's fields for the kernel: the names (one byte string and where each ends), the kinds."""
    names = (time_field, *labels, *values)
    encoded = [name.encode("utf-8") for name in names]
    blob = np.frombuffer(b"".join(encoded) + bytes(8), np.uint8)  # padded for _named's last word
    name_ends = np.cumsum([len(name) for name in encoded], dtype=np.int64)
    kinds = np.array([TIME] + [LABEL] * len(labels) + [VALUE] * len(values), np.int8)
    return names, blob, name_ends, kinds


def _convert_hard(body: bytes, starts: np.ndarray, ends: np.ndarray, values: np.ndarray, present: np.ndarray) -> None:
    """The values the kernel could not compute exactly (present 2: more digits than a double
    holds, or a large power of ten), by Python's float() of their text, as json.loads does."""
    hard = np.flatnonzero(present == 2)
    for row in hard.tolist():
        values[row] = float(body[starts[row]:ends[row]])
    if len(hard):
        present[hard] = 1


def scanned_fields(stream, body: bytes, ndjson: bool) -> tuple[dict[str, pa.Array], int] | None:
    """(the declared fields' columns, rows) of a body (NDJSON, or a JSON array), or None where the
    next reader must decide. A label offsets into at most 2 GiB of a body's bytes (int32)."""
    if len(body) >= 2 ** 31:
        return None
    names, blob, name_ends, kinds = _plan(stream.time_field, tuple(stream.string_fields), tuple(stream.values))
    # A dimension missing or null is "" in the columns (ingest/columnar.py): written so here, where
    # a fill_null per column cost ~20 us a body. Not the key (it may be a dimension), which must be there.
    blanks = set(stream.dimensions) - {stream.key_field}
    data = np.frombuffer(body, np.uint8)
    capacity = int(np.count_nonzero(data == _OPEN))  # at least the events: each opens with a brace
    fields = len(names)
    numbers = np.empty((fields, capacity), np.int64)
    values = np.empty((fields, capacity), np.float64)
    present = np.empty((fields, capacity), np.uint8)
    ends = np.empty((fields, capacity), np.int64)
    rows = _scan(data, not ndjson, blob, name_ends, kinds, numbers, values, present, ends, np.empty(fields, np.uint8))
    if rows <= 0:
        return None
    columns = {}
    for field, name in enumerate(names):
        mask = present[field, :rows]
        if kinds[field] == VALUE:
            _convert_hard(body, numbers[field], ends[field], values[field], mask)
        missing = 0 if name in blanks else rows - int(np.count_nonzero(mask))
        if missing == rows:
            continue  # no event has it: as a reader that never saw the name
        validity = pa.py_buffer(np.packbits(mask, bitorder="little")) if missing else None
        if kinds[field] == LABEL:
            offsets, text = _gather(data, numbers[field], ends[field], mask, rows)
            columns[name] = pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(text[:-8]),
                                                        validity, missing)
        else:
            kind, source = (pa.int64(), numbers) if kinds[field] == TIME else (pa.float64(), values)
            buffer = pa.py_buffer(np.ascontiguousarray(source[field, :rows]))
            columns[name] = pa.Array.from_buffers(kind, rows, [validity, buffer], missing)
    return columns, rows

