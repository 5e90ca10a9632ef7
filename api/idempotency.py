"""The `Idempotency-Key` header of POST /api/v1/events and of a changelog table's writes
(POST /api/v1/tables/{name}, DELETE /api/v1/tables/{name}/{key}), over store/idempotency.py.

`guarded` wraps the work of one request: without a key (or without a store) it just runs it;
with one, the first request runs and its answer is recorded, a retry of the same request gets
that answer back (`Idempotent-Replayed: true`), a retry while the first still runs gets 409,
and the same key on a different request gets 422. Only an answer that wrote something (200) is
kept: a refused request or a 503 changed nothing, so its key is released and a retry is free to
do the work.

Once the work succeeded (the events are in the log) its answer is returned whatever recording
it does: a failure to record (the store full or away) is logged, counted
(`sketchboard_idempotency_record_failures_total`) and tried once more, never turned into a 503
that would tell the client nothing was changed. The key then stays claimed (`in_flight`): a
retry gets 409 until the in-flight takeover timeout, and after it appends again (the window
docs/robustness.md names; a stream's event id closes it)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable

from fastapi import Request
from prometheus_client import Counter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api import http_metrics
from api.errors import ParamHTTPError
from store.idempotency import IdempotencyStore, Verdict

HEADER = "Idempotency-Key"
# RFC 9110 token-ish: visible ASCII, no spaces; long enough for a UUID or a producer's own
# batch id, short enough to keep the table small.
KEY_PATTERN = r"^[\x21-\x7e]+$"
KEY_MAX_LENGTH = 255
REPLAYED_HEADER = "Idempotent-Replayed"

log = logging.getLogger("sketchboard.idempotency")

# Answers that could not be recorded after their work succeeded (process-level, as the HTTP metrics).
RECORD_FAILURES = Counter("sketchboard_idempotency_record_failures",
                          "Answers to a request with an Idempotency-Key whose work succeeded but could not be"
                          " recorded (the key stays claimed until the in-flight timeout)",
                          registry=http_metrics.REGISTRY)
RECORD_ATTEMPTS = 2


def replayed_header_doc() -> dict:
    """The 200 answer's `Idempotent-Replayed` header, as the OpenAPI document describes it."""
    return {"headers": {REPLAYED_HEADER: {
        "description": f"`true` when this is the recorded answer of an earlier request with the same {HEADER}",
        "schema": {"type": "string", "enum": ["true"]}}}}


def key_scope(request: Request, stream: str) -> str:
    """Whose keys a key is one of: the caller's (its token's name) for one stream or table, so
    two producers' keys never meet."""
    token = getattr(request.state, "token", None)
    return f"{token.name if token else 'anonymous'} {stream}"


def fingerprint(*parts: str | bytes) -> str:
    """A hash of everything that makes the request what it is (stream, flags, body)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


async def guarded(store: IdempotencyStore | None, key: str | None, scope: str, request_fingerprint: str,
                  now_ms: int, work: Callable[[], Awaitable[dict]]):
    """`work`'s answer is the 200 answer's JSON body (a dict), recorded as is for a replay."""
    if store is None or key is None:
        return await work()
    decision = await run_in_threadpool(store.claim, scope, key, request_fingerprint, now_ms)
    if decision.verdict is Verdict.REPLAY:
        return JSONResponse(decision.record.answer, status_code=decision.record.status,
                            headers={REPLAYED_HEADER: "true"})
    if decision.verdict is Verdict.MISMATCH:
        raise ParamHTTPError(422, HEADER, f"{HEADER} {key!r} was used for a different request (another stream, flags"
                                          " or body); use a new key for new events")
    if decision.verdict is Verdict.IN_PROGRESS:
        error = ParamHTTPError(409, HEADER, f"a request with {HEADER} {key!r} is still being processed; retry later")
        error.headers = {"Retry-After": "1"}
        raise error
    # Shielded: a client that hangs up mid-request must not leave the key claimed while the
    # append it started still finishes in its thread; the answer is recorded either way.
    return await asyncio.shield(asyncio.ensure_future(_run_and_record(store, key, scope, decision.token, work)))


async def _run_and_record(store: IdempotencyStore, key: str, scope: str, token: str | None,
                          work: Callable[[], Awaitable[dict]]):
    # `token` is this request's claim: were it taken over meanwhile (a first try slower than the
    # in-flight timeout), releasing or recording changes nothing of the takeover's claim.
    try:
        answer = await work()
    except Exception:
        await run_in_threadpool(store.release, scope, key, token)
        raise
    # The work is done (appended): its answer is the client's whatever recording it does.
    for attempt in range(1, RECORD_ATTEMPTS + 1):
        try:
            if not await run_in_threadpool(store.complete, scope, key, 200, answer, token):
                log.warning("%s %r (%s): the claim was taken over by a retry while this request ran (slower than"
                            " the in-flight timeout); its answer is not recorded", HEADER, key, scope)
            break
        except Exception as exc:  # the store is full or away: the events are in the log regardless
            if attempt == RECORD_ATTEMPTS:
                RECORD_FAILURES.inc()
                log.warning("%s %r (%s): the work succeeded but its answer could not be recorded (%s); the key"
                            " stays claimed until the in-flight timeout", HEADER, key, scope, exc)
    return answer
