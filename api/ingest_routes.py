"""POST /api/v1/events: validate, then append the accepted events to the log atomically."""

from __future__ import annotations

from fastapi import APIRouter, Header, HTTPException, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.bodies import MalformedLine, columnar_body, parse_events, read_capped
from api.context import ApiContext
from api.errors import ParamHTTPError, errors
from api.idempotency import HEADER, KEY_MAX_LENGTH, KEY_PATTERN, REPLAYED_HEADER, fingerprint, guarded
from ingest.json_limits import violation
from api.security.middleware import Denied, charge
from api.security.ratelimit import client_key
from ingest.events import Rejection
from ingest.log import LogUnavailable


class RejectedEvent(BaseModel):
    index: int = Field(description="position of the event in the body (0-based; NDJSON: non-blank line number - 1)")
    reason: str


class IngestAnswer(BaseModel):
    stream: str
    accepted: int
    rejected: list[RejectedEvent]
    ingest_time_ms: int = Field(description="the ingest time stamped on every accepted event")
    partitions: dict[int, tuple[int, int]] = Field(description="partition -> (first offset, records written)")


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


def rate_limit_events(ctx: ApiContext, request: Request, count: int) -> None:
    """429 when the caller (its token, or its address when open) is over its events per second,
    charged to the same key as its requests (api/security/middleware.py)."""
    key = getattr(request.state, "rate_key", None) or client_key(None, request.scope.get("client"))
    try:
        charge(ctx.security.event_limit, key, count, what="events")
    except Denied as exc:
        error = ParamHTTPError(429, None, exc.detail)
        error.headers = {"Retry-After": exc.retry_after}
        raise error from None


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["ingest"])

    @r.post(
        "/events",
        response_model=IngestAnswer,
        responses={
            **errors(400, 404, 409, 413, 503, e400="malformed body (not UTF-8, not JSON, not an array), or a derived stream",
                     e404="unknown stream", e413="body or event count over the configured limit",
                     e409=f"a request with the same {HEADER} is still being processed (Retry-After)",
                     e503="the log (Kafka) did not acknowledge the events; none is reported accepted, though on"
                          " Kafka some may have been written (a retry may duplicate them)"),
            200: {"headers": {REPLAYED_HEADER: {
                "description": f"`true` when this is the recorded answer of an earlier request with the same {HEADER}",
                "schema": {"type": "string", "enum": ["true"]}}}},
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
    ) -> IngestAnswer:
        if stream not in ctx.catalog.streams:
            raise HTTPException(404, f"unknown stream {stream!r}; defined: {', '.join(sorted(ctx.catalog.streams))}")
        if ctx.catalog.streams[stream].derived_from:
            raise HTTPException(400, f"stream {stream!r} is derived from {ctx.catalog.streams[stream].derived_from!r}"
                                     " by the pipeline; it cannot receive events")
        if ctx.catalog.streams[stream].kind == "table":
            raise HTTPException(400, f"stream {stream!r} is a table: send its rows to POST /api/v1/tables/{stream}")
        body = await read_capped(request, ctx.max_body_bytes)
        token = getattr(request.state, "token", None)
        scope = f"{token.name if token else 'anonymous'} {stream}"
        request_fingerprint = fingerprint(stream, str(atomic), request.headers.get("content-type", ""), body)
        return await guarded(ctx.idempotency, idempotency_key, scope, request_fingerprint, ctx.now_ms(),
                             lambda: ingest(request, stream, atomic, body))

    async def ingest(request: Request, stream: str, atomic: bool, body: bytes) -> IngestAnswer:
        content_type = request.headers.get("content-type", "")
        # The common case first: a body whose events are all valid and plain is parsed and
        # checked as columns (ingest/columnar.py) and appended as such. Anything else, or
        # anything it cannot tell, takes the per-event path below with its reasons.
        columns = await run_in_threadpool(columnar_body, ctx.catalog.streams[stream], body, content_type,
                                          ctx.security.json_limits) if ctx.columnar_ingest else None
        if columns is not None:
            return await ingest_columns(request, stream, columns)
        raws = parse_events(body, content_type)
        check_count(request, len(raws))
        validator = ctx.validators[stream]
        limits = ctx.security.json_limits
        accepted, rejected = [], []
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
        answer_rejected = [RejectedEvent(index=r.index, reason=r.reason) for r in rejected]
        if atomic and rejected:
            raise HTTPException(422, {"message": "atomic request with invalid events: nothing was written",
                                      "rejected": [r.model_dump() for r in answer_rejected]})
        return await append(stream, ctx.log.append, accepted, len(accepted), answer_rejected)

    async def ingest_columns(request: Request, stream: str, columns) -> IngestAnswer:
        check_count(request, columns.num_rows)
        return await append(stream, ctx.log.append_columns, columns, columns.num_rows, [])

    def check_count(request: Request, count: int) -> None:
        if count > ctx.max_events_per_request:
            raise HTTPException(413, f"{count} events exceed the limit of {ctx.max_events_per_request} per request")
        rate_limit_events(ctx, request, count)

    async def append(stream: str, write, events, count: int, answer_rejected: list[RejectedEvent]) -> IngestAnswer:
        now = ctx.now_ms()
        # The append waits on SQLite (and fsync) or on the Kafka brokers' acks: keep it off the event loop.
        try:
            result = await run_in_threadpool(write, ctx.catalog.streams[stream], events, now)
        except LogUnavailable as exc:
            raise HTTPException(503, f"the log did not take the events, none is reported accepted: {exc}") from None
        return IngestAnswer(stream=stream, accepted=count, rejected=answer_rejected,
                            ingest_time_ms=now, partitions=result.ranges)

    return r
