"""Reading an ingest body: size-capped, JSON array or NDJSON, with errors that say where."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect

from api.errors import bad_request
from catalog import StreamDef
from ingest.columnar import columnar_events, limits_allow
from ingest.events import has_surrogate
from ingest.json_limits import JsonLimits, violation

BODY_LIMITS = JsonLimits()  # a rule or a silence: far inside these


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to exceed the limit (before reading it all)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Gone mid-body (a producer stopped with Ctrl-C): nothing was appended; no one reads this
        # answer, but it is a 400 in the request metrics and logs, not an ASGI traceback and a 500.
        raise HTTPException(400, f"the client disconnected after {size} bytes of the body") from None
    return b"".join(chunks)


def _decode(text: str | bytes) -> Any:
    """json.loads, with what it raises besides JSONDecodeError made a ValueError: a value nested
    thousands deep (RecursionError) and an integer of over 4300 digits (Python's int limit,
    a plain ValueError). Either used to escape as a 500."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def loads_json(body: bytes) -> Any:
    """A JSON body (a rule, a silence), or 400 saying why it is not one, or which bound of
    ingest/json_limits.py it crosses."""
    try:
        value = _decode(body)
    except json.JSONDecodeError as exc:
        raise bad_request(None, f"the body is not valid JSON: {exc}") from None
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise bad_request(None, f"the body is not valid JSON: {exc}") from None
    problem = violation(value, BODY_LIMITS)
    if problem:
        raise bad_request(None, f"the body crosses a limit: {problem}")
    return value


NDJSON_MEDIA_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines")


def read_as_ndjson(content_type: str, starts_with_bracket: bool) -> bool:
    """NDJSON by its media type; a JSON array by application/json; with no or another content
    type, an array is JSON and anything else is read as NDJSON."""
    media = content_type.split(";")[0].strip().lower()
    if media in NDJSON_MEDIA_TYPES:
        return True
    if media == "application/json":
        return False
    return not starts_with_bracket


SMALL_BODY_BYTES = 16 * 1024
SMALL_BODY_OBJECTS = 32


def few_events(body: bytes) -> bool:
    """Whether a body holds so few events that the per-event path takes it faster than the columnar
    one, whose Arrow reader and column checks cost about 1.5 ms a request whatever its size, where
    the per-event validator costs about 25 us an event (thread CPU, parse and append of demo
    events: 1 event 0.45 against 1.9 ms, 30 events 1.1 against 1.8, 100 events 3.7 against 3.4).
    Its opening braces bound its events from above (nested objects count too: such a body goes
    the columnar way, which is never wrong either)."""
    return len(body) <= SMALL_BODY_BYTES and body.count(b"{") <= SMALL_BODY_OBJECTS


def columnar_body(stream: StreamDef, body: bytes, content_type: str, limits: JsonLimits, *,
                  reader: str = "scan") -> pa.Table | None:
    """The body's events as validated columns when every one of them is valid and plain
    (ingest/columnar.py), else None: `parse_events` and the per-event validator then decide,
    with their reasons. `reader`: one of ingest/columnar.py READERS; our scanner (then Arrow's
    reader) releases the GIL, so it serves the API process's threads and the worker processes."""
    if not limits_allow(limits):
        return None
    head = body.removeprefix(b"\xef\xbb\xbf").lstrip()
    ndjson = read_as_ndjson(content_type, head.startswith(b"["))
    return columnar_events(stream, body.removeprefix(b"\xef\xbb\xbf"), ndjson=ndjson, reader=reader)


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """A route's JSON object body (a rule, a dashboard, a silence): 413 past `limit` bytes, 400
    when it is not JSON, crosses a bound, or is not an object."""
    data = loads_json(await read_capped(request, limit) or b"null")
    if not isinstance(data, dict):
        raise bad_request(None, "the body must be a JSON object")
    # A "\\ud800" escape without its pair decodes to no Unicode text: neither stored nor answered.
    if has_surrogate(data):
        raise bad_request(None, "the body holds a lone surrogate (a \\ud800..\\udfff escape without its pair),"
                                " which is no Unicode text")
    return data


def body_schema(model_schema: dict, description: str) -> dict:
    """openapi_extra for a route that reads its JSON body itself (to answer 400s that name the
    field, in the model's own words) yet documents the body's model."""
    return {"requestBody": {"required": True, "description": description,
                            "content": {"application/json": {"schema": model_schema}}}}


def inline_defs(schema: dict) -> dict:
    """A model's JSON Schema with its $defs inlined: openapi_extra is copied into the document
    as is, where '#/$defs/...' would not resolve. The discriminator's mapping points into
    $defs too, so it goes; the oneOf with each kind's `const` says the same."""
    defs = schema.pop("$defs", {})
    schema.pop("discriminator", None)

    def resolve(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(dict(defs[ref.removeprefix("#/$defs/")]))
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


class MalformedLine:
    """An NDJSON line that is not JSON: rejected as that one event, the others still count."""

    def __init__(self, reason: str):
        self.reason = reason


def parse_events(body: bytes, content_type: str) -> list[Any]:
    """A JSON array (malformed -> 400 for the whole body), or NDJSON: one JSON value per
    line, blank lines ignored, a malformed line rejected on its own (MalformedLine)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPException(400, f"body is not UTF-8 (byte {exc.start})") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark is not content
    stripped = text.lstrip()
    if not stripped:
        raise HTTPException(400, "body is empty; send a JSON array or NDJSON of events")
    if not read_as_ndjson(content_type, stripped.startswith("[")):
        try:
            events = _decode(text)
        except json.JSONDecodeError as exc:
            raise HTTPException(400, f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        except ValueError as exc:
            raise HTTPException(400, f"malformed JSON: {exc}") from None
        if not isinstance(events, list):
            raise HTTPException(400, "the body must be a JSON array of events or NDJSON")
        return events
    events = []
    # Split on \n only: str.splitlines() would also split at U+2028 etc., which JSON strings may hold.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            events.append(_decode(line))
        except json.JSONDecodeError as exc:
            events.append(MalformedLine(f"malformed JSON on line {lineno}, column {exc.colno}: {exc.msg}"))
        except ValueError as exc:
            events.append(MalformedLine(f"malformed JSON on line {lineno}: {exc}"))
    return events
