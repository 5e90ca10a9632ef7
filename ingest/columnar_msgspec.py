"""A body's events read into columns by msgspec, for ingest/columnar.py where holding the GIL
costs nothing (the ingest worker processes, api/ingest_worker.py). Pure.

msgspec decodes a body straight into typed objects, one type a stream: its time field an integer,
its labels strings, its values numbers, each label and value null or missing, and no other field.
Anything else fails the decode, and the body is left to the per-event path, as Arrow's reader
leaves what it cannot type. For a 1 000-event demo body the decode and the columns take ~1.1 ms
where Arrow's reader takes ~1.6-2.4 (docs/benchmarks.md, session 86); but the decode holds the
GIL all along, where Arrow's reader releases it, so threads of the API process keep Arrow's.

NDJSON becomes one array: a comma after each newline. A newline may only stand between tokens
(a raw one inside a string is malformed JSON, as the per-event reader finds too), so the comma
lands either between two events or where the decode fails; and with as many events decoded as
the body has object lines (`lines`), each line was exactly one event.
"""

from __future__ import annotations

import operator
from functools import lru_cache

import msgspec
import pyarrow as pa

from catalog import StreamDef


def msgspec_fields(stream: StreamDef, body: bytes, ndjson: bool, lines: int | None) -> tuple[dict, int] | None:
    """(the declared fields' columns, rows) of a body (NDJSON of `lines` object lines, or a JSON
    array), or None when the per-event path must decide: the decode failed, the event count is
    not the line count, no event, or a value past what a column holds (an integer past int64)."""
    if ndjson:
        text = body[:-1] if body.endswith(b"\n") else body
        text = b"".join((b"[", text.replace(b"\n", b"\n,"), b"]"))
    else:
        text = body
    names, decoder = _decoder(stream.time_field, tuple(stream.string_fields), tuple(stream.values))
    try:
        events = decoder.decode(text)
    except msgspec.MsgspecError:  # malformed JSON, or a value of another type than its field's
        return None
    if not events or (ndjson and len(events) != lines):
        return None
    types = _types(stream)
    try:
        fields = {name: pa.array(list(map(operator.attrgetter(attribute), events)), types[name])
                  for attribute, name in names}
    except (OverflowError, pa.ArrowException):  # an integer past int64, a string that is no UTF-8
        return None
    return fields, len(events)


def _types(stream: StreamDef) -> dict[str, pa.DataType]:
    return {stream.time_field: pa.int64(), **{name: pa.string() for name in stream.string_fields},
            **{name: pa.float64() for name in stream.values}}


@lru_cache(maxsize=64)
def _decoder(time_field: str, labels: tuple[str, ...], values: tuple[str, ...]):
    """((attribute, field name) pairs, a decoder of a JSON array of the stream's events). The
    attributes are f0, f1, ...: a field's name need not be a Python identifier. The time field is
    required; a label or a value may be missing or null."""
    names = (time_field, *labels, *values)
    attributes = [f"f{index}" for index in range(len(names))]
    event = msgspec.defstruct(
        "Event",
        [(attributes[0], int)] + [(attribute, str | None, None) for attribute in attributes[1:1 + len(labels)]]
        + [(attribute, float | None, None) for attribute in attributes[1 + len(labels):]],
        rename=dict(zip(attributes, names, strict=True)), forbid_unknown_fields=True, gc=False)
    return list(zip(attributes, names, strict=True)), msgspec.json.Decoder(list[event])
