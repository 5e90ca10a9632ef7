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
        text = body.replace(b"\n", b"\n,")
        end = len(text) - 1 if body.endswith(b"\n") else len(text)  # no comma after the last line
        text = b"".join((b"[", memoryview(text)[:end], b"]"))
    else:
        text = body
    columns, decoder = _decoder(stream.time_field, tuple(stream.string_fields), tuple(stream.values))
    try:
        events = decoder.decode(text)
    except msgspec.MsgspecError:  # malformed JSON, or a value of another type than its field's
        return None
    if not events or (ndjson and len(events) != lines):
        return None
    try:
        fields = {name: pa.array(list(map(operator.attrgetter(attribute), events)), kind)
                  for attribute, name, kind in columns}
    except (OverflowError, pa.ArrowException):  # an integer past int64, a string that is no UTF-8
        return None
    return fields, len(events)


@lru_cache(maxsize=64)
def _decoder(time_field: str, labels: tuple[str, ...], values: tuple[str, ...]):
    """((attribute, field name, column type) triples, a decoder of a JSON array of the stream's
    events). The attributes are f0, f1, ...: a field's name need not be a Python identifier. The
    time field is required; a label or a value may be missing or null."""
    fields = [(time_field, int, pa.int64())] + [(name, str | None, pa.string()) for name in labels] \
        + [(name, float | None, pa.float64()) for name in values]
    attributes = [f"f{index}" for index in range(len(fields))]
    event = msgspec.defstruct(
        "Event",
        [(attribute, kind) if index == 0 else (attribute, kind, None)
         for index, (attribute, (_, kind, _)) in enumerate(zip(attributes, fields, strict=True))],
        rename={attribute: name for attribute, (name, _, _) in zip(attributes, fields, strict=True)},
        forbid_unknown_fields=True, gc=False)
    columns = [(attribute, name, column) for attribute, (name, _, column) in zip(attributes, fields, strict=True)]
    return columns, msgspec.json.Decoder(list[event])
