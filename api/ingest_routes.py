"""POST /api/v1/events: validate, then append the accepted events to the log atomically."""

from __future__ import annotations

import functools

import anyio
import pyarrow as pa
from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from api.bodies import MalformedLine, columnar_body, few_events, parse_events, read_capped
from api.context import ApiContext
from api.errors import ParamHTTPError, errors
from api.idempotency import HEADER, KEY_MAX_LENGTH, KEY_PATTERN, fingerprint, guarded, key_scope, replayed_header_doc
from api.ingest_workers import DECLINED
from catalog import StreamDef
from ingest.columnar import columnar_events
from ingest.partitioner import assign_partitions_columnar
from ingest.json_limits import violation
from api.security.middleware import Denied, charge
from api.security.ratelimit import client_key
from ingest.events import Rejection
from ingest.log import LogUnavailable, RecordTooLarge


class RejectedEvent(BaseModel):
    index: int = Field(description="position of the event in the body (0-based; NDJSON: non-blank line number - 1)")
    reason: str


class IngestAnswer(BaseModel):
    stream: str
    accepted: int
    rejected: list[RejectedEvent]
    ingest_time_ms: int = Field(description="the ingest time stamped on every accepted event")
    partitions: dict[int, tuple[int | None, int]] = Field(
        description="partition -> (first offset, records written); the first offset is null where Kafka"
                    " acknowledged a retried record without its offset")


class AtomicRejection(BaseModel):
    message: str
    rejected: list[RejectedEvent]


class ValidationIssue(BaseModel):
    """FastAPI's request-validation error entry (a missing or mistyped query parameter)."""

    loc: list[str | int]
    msg: str
    type: str


class Ingest422(BaseModel):
    """422: `atomic=true` with invalid events (nothing was written), a query parameter or
    header outside its schema (FastAPI's list of issues), or an Idempotency-Key used before for
    a different request (a message, `param` names the header)."""

    detail: AtomicRejection | list[ValidationIssue] | str
    param: str | None = None


# The body is read by the route itself (size-capped, JSON array or NDJSON); documented here.
# Each event is validated on its own and a bad one is rejected in the 200 answer (422 with
# atomic=true), so the document accepts any item, and NDJSON as any text: only a body that is
# not an array (JSON) or not UTF-8 is refused whole, with a 400.
_EVENT = {"description": "an event: an object with the stream's time field, dimensions and values;"
          " anything else is rejected on its own in the answer"}
EVENTS_BODY = {"requestBody": {
    "required": True,
    "description": "the events: a JSON array, or NDJSON (one JSON value per line, blank lines ignored)",
    "content": {"application/json": {"schema": {"type": "array", "items": _EVENT}},
                "application/x-ndjson": {"schema": {"type": "string", "description": "one event per line"}}},
}}


def too_large(exc: RecordTooLarge, index: int) -> HTTPException:
    """413 for an event the log cannot store as one record (over Kafka's message.max.bytes): the
    whole append refused, nothing written (unless a broker with a lower limit than the
    producer's refused it after others had been: then the message says how many were)."""
    written = (f"{exc.written} of the request's events were written before the log refused it" if exc.written
               else "nothing was written")
    return HTTPException(413, {"message": f"an event is too large for the log: {written}",
                               "rejected": [{"index": index, "reason": exc.reason}]})


def unavailable(exc: LogUnavailable) -> HTTPException:
    return HTTPException(503, f"the log did not take the events, none is reported accepted: {exc}")


def rate_key(request: Request) -> str:
    """Whom a request's events are charged to: the key its requests are charged to (its token,
    or its address when open; api/security/middleware.py)."""
    return getattr(request.state, "rate_key", None) or client_key(None, request.scope.get("client"))


def rate_limit_events(ctx: ApiContext, request: Request, count: int) -> None:
    """429 when the caller is over its events per second."""
    charge_events(ctx, rate_key(request), count)


def charge_events(ctx: ApiContext, key: str, count: int) -> None:
    """rate_limit_events for a key read before (the columnar path charges from a worker thread)."""
    try:
        charge(ctx.security.event_limit, key, count, what="events")
    except Denied as exc:
        error = ParamHTTPError(429, None, exc.detail)
        error.headers = {"Retry-After": exc.retry_after}
        raise error from None


def answer_body(stream: str, accepted: int, rejected: list[dict], ingest_time_ms: int,
                ranges: dict[int, tuple[int | None, int]]) -> dict:
    """IngestAnswer as the JSON it is sent as (and recorded for an Idempotency-Key): built as a
    dict, as FastAPI's validation and serialization of the model cost more than the rest of a
    1 000-event request's Python work. tests/api/test_ingest.py pins it against the model."""
    return {"stream": stream, "accepted": accepted, "rejected": rejected, "ingest_time_ms": ingest_time_ms,
            "partitions": {str(p): [first, count] for p, (first, count) in ranges.items()}}


class AnswerResponse(JSONResponse):
    """The 200 answer (JSONResponse's compact encoding, as FastAPI's for the model)."""


WARM_STREAM = StreamDef(name="warm_up", time_field="t", key_field="k", dimensions=("k",), values=("v",))


def warm_columnar_path() -> None:
    """Run the columnar reader and checks once, in a worker thread, as the server starts (the
    app's lifespan): their first call imports pandas (pyarrow.compute looks for it) and the
    first trip to a worker thread imports anyio's backend, 0.3-1 s that the first client
    waited (a benchmark of 200 requests counted it); and our scanner's kernels and the partitions'
    hash are loaded from Numba's cache (~0.2 s), or compiled where there is none yet (~5 s, once
    per checkout)."""
    columnar_events(WARM_STREAM, b'{"t": 1700000000000, "k": "a", "v": 1.5}\n')
    columnar_events(WARM_STREAM, b'[{"t": 1700000000000, "k": "a", "v": 1.5}]', ndjson=False)
    assign_partitions_columnar(pa.array(["a"]), 1, 1, 0)


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["ingest"])
    # A body's work runs in a worker thread, at most `ingest_slots` at once. Arrow's reader and
    # kernels, LZ4 and SQLite release the GIL dozens of times a request: with more runnable threads
    # than cores they pass it back and forth. Unbounded, 1 000-event bodies from 4 clients on two
    # cores took 10-26 % more of the API's CPU a request (docs/benchmarks.md, session 81).
    # None: anyio's default limiter, which every worker-thread trip of the app shares.
    slots = None if ctx.ingest_slots is None else anyio.CapacityLimiter(ctx.ingest_slots)

    async def in_worker(fn, *args):
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=slots)

    @r.post(
        "/events",
        response_model=IngestAnswer,
        responses={
            **errors(400, 404, 409, 413, 503, e400="malformed body (not UTF-8, not JSON, not an array), or a derived stream",
                     e404="unknown stream", e413="body or event count over the configured limit, or an event"
                     " over what the log stores as one record (Kafka's message.max.bytes)",
                     e409=f"a request with the same {HEADER} is still being processed (Retry-After)",
                     e503="the log (Kafka) did not acknowledge the events; none is reported accepted, though on"
                          " Kafka some may have been written (a retry may duplicate them)"),
            200: replayed_header_doc(),
            422: {"model": Ingest422, "description": "atomic=true and some events were invalid: nothing was written;"
                  f" or a query parameter or header is missing or mistyped; or the {HEADER} was used for a"
                  " different request"},
        },
        openapi_extra=EVENTS_BODY,
        summary="Send events to a stream (JSON array or NDJSON)",
    )
    async def post_events(
        request: Request,
        stream: str = Query(..., description="the stream the events belong to"),
        atomic: bool = Query(False, description="all-or-nothing: reject the whole request if any event is invalid"),
        idempotency_key: str | None = Header(
            None, alias=HEADER, min_length=1, max_length=KEY_MAX_LENGTH, pattern=KEY_PATTERN,
            description="makes a retry safe: a request repeated with the same key (same stream, flags and body) within"
                        " `idempotency_key_ttl` is not appended again and gets the first answer back"),
    ) -> Response:
        if stream not in ctx.catalog.streams:
            raise HTTPException(404, f"unknown stream {stream!r}; defined: {', '.join(sorted(ctx.catalog.streams))}")
        if ctx.catalog.streams[stream].derived_from:
            raise HTTPException(400, f"stream {stream!r} is derived from {ctx.catalog.streams[stream].derived_from!r}"
                                     " by the pipeline; it cannot receive events")
        if ctx.catalog.streams[stream].kind == "table":
            raise HTTPException(400, f"stream {stream!r} is a table: send its rows to POST /api/v1/tables/{stream}")
        body = await read_capped(request, ctx.max_body_bytes)
        content_type = request.headers.get("content-type", "")
        key = rate_key(request)

        async def work() -> dict:
            return await ingest(stream, atomic, body, content_type, key)

        if ctx.idempotency is None or idempotency_key is None:
            return AnswerResponse(await work())
        # The body's hash only when a key asks for it: it is what tells a retry from new events.
        request_fingerprint = fingerprint(stream, str(atomic), content_type, body)
        answer = await guarded(ctx.idempotency, idempotency_key, key_scope(request, stream), request_fingerprint,
                               ctx.now_ms(), work)
        return answer if isinstance(answer, Response) else AnswerResponse(answer)

    async def ingest(stream: str, atomic: bool, body: bytes, content_type: str, rate_key: str) -> dict:
        # The common case first: a body whose events are all valid and plain is parsed, checked
        # as columns (ingest/columnar.py) and appended as such, in one trip to a worker thread.
        # Anything else, or anything it cannot tell, takes the per-event path below with its reasons;
        # so does a body of a few events, which it takes faster (`few_events`).
        if ctx.columnar_ingest and not few_events(body):
            answer = None
            if ctx.ingest_workers is not None and ctx.ingest_workers.takes(body):  # api/ingest_workers.py
                answer = await in_ingest_process(stream, body, content_type, rate_key)
            if answer is None:  # no worker took it
                answer = await in_worker(ingest_columns, stream, body, content_type, rate_key)
            if answer is not None and answer is not DECLINED:
                return answer
        # In a worker thread too: a body the columnar path declined may hold 100 000 events (seconds
        # of parsing and validating, which would hold up every other request on the event loop).
        return await in_worker(ingest_events, stream, atomic, body, content_type, rate_key)

    async def in_ingest_process(stream: str, body: bytes, content_type: str, rate_key: str) -> dict | str | None:
        """The columnar path in a worker process: the answer, DECLINED (the per-event path decides),
        or None where no worker took the body."""
        def admit(rows: int) -> None:
            check_count(rate_key, rows)

        # A body the worker may append unasked needs no second word from here (a round trip less,
        # in which the worker would wait: 4-7 % of the 1 000-event bodies' rate, docs/benchmarks.md
        # session 84). Without an events rate limit, that is one within max_events_per_request.
        # With one, the events are set aside from the caller's bucket before the body goes: as many
        # as the body has opening braces (every event the columnar path takes is an object, so no
        # fewer than its events), and what it did not append is given back once it answers. Only
        # when the bucket cannot spare them is the body counted first and charged exactly (admit).
        limit = ctx.security.event_limit
        reserved = 0
        if limit is None:
            admitted = ctx.max_events_per_request
        else:
            bound = body.count(b"{")
            if bound <= ctx.max_events_per_request and limit.reserve(rate_key, bound):
                reserved = bound
            admitted = reserved or -1
        try:
            done = await ctx.ingest_workers.ingest(ctx.catalog.streams[stream], body, content_type, admit,
                                                   admitted=admitted, now_ms=ctx.now_ms)
        except LogUnavailable as exc:
            if reserved:
                limit.refund(rate_key, reserved)  # none is reported accepted
            raise unavailable(exc) from None
        if done is None or done is DECLINED:
            if reserved:
                limit.refund(rate_key, reserved)  # the path that takes it charges its events
            return done
        rows, now, ranges = done
        if reserved:
            limit.refund(rate_key, reserved - rows)
        return answer_body(stream, rows, [], now, ranges)

    def ingest_events(stream: str, atomic: bool, body: bytes, content_type: str, rate_key: str) -> dict:
        """The per-event path: each event validated on its own, the bad ones rejected with their
        reasons, the rest appended (the append waits on SQLite or on the Kafka brokers' acks)."""
        raws = parse_events(body, content_type)
        check_count(rate_key, len(raws))
        validator = ctx.validators[stream]
        limits = ctx.security.json_limits
        accepted, rejected, where = [], [], []  # where: each accepted event's index in the request
        for index, raw in enumerate(raws):
            if isinstance(raw, MalformedLine):
                rejected.append(Rejection(index, raw.reason))
                continue
            try:
                event = validator.validate(raw)
            except ValueError as exc:
                rejected.append(Rejection(index, str(exc)))
                continue
            # After the validator, whose messages about declared fields say more; the undeclared
            # fields are kept as sent, so they are bounded here.
            problem = violation(raw, limits)
            if problem:
                rejected.append(Rejection(index, problem))
                continue
            accepted.append(event)
            where.append(index)
        answer_rejected = [{"index": r.index, "reason": r.reason} for r in rejected]
        if atomic and rejected:
            raise HTTPException(422, {"message": "atomic request with invalid events: nothing was written",
                                      "rejected": answer_rejected})
        return append(stream, ctx.log.append, accepted, len(accepted), answer_rejected, where)

    def ingest_columns(stream: str, body: bytes, content_type: str, rate_key: str) -> dict | None:
        """In a worker thread: the columnar parse (Arrow's reader releases the GIL), the count
        checks and the append; None when the per-event path must decide."""
        columns = columnar_body(ctx.catalog.streams[stream], body, content_type, ctx.security.json_limits)
        if columns is None:
            return None
        check_count(rate_key, columns.num_rows)
        return append(stream, ctx.log.append_columns, columns, columns.num_rows, [])

    def check_count(rate_key: str, count: int) -> None:
        if count > ctx.max_events_per_request:
            raise HTTPException(413, f"{count} events exceed the limit of {ctx.max_events_per_request} per request")
        charge_events(ctx, rate_key, count)

    def append(stream: str, write, events, count: int, answer_rejected: list[dict],
               where: list[int] | None = None) -> dict:
        """`where`: each appended event's index in the request (None: the same)."""
        now = ctx.now_ms()
        try:
            result = write(ctx.catalog.streams[stream], events, now)
        except LogUnavailable as exc:
            raise unavailable(exc) from None
        except RecordTooLarge as exc:  # never storable: not a 503 to retry, and the request's index
            raise too_large(exc, exc.index if where is None else where[exc.index]) from None
        return answer_body(stream, count, answer_rejected, now, result.ranges)
    return r
