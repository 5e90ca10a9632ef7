"""One error body for the 4xx answers the routes raise, and its place in the OpenAPI document.

Every 4xx a route raises is `{"detail": "<what is wrong>", "param": "<the query parameter or
body field at fault>"}` (`param` only where one parameter is at fault). FastAPI's own 422s
(a value outside a parameter's declared schema: a missing `metric`, an `after_id` above
2^63-1) keep FastAPI's shape, `{"detail": [{"loc", "msg", "type"}, ...]}`, whose `loc` names
the parameter; the document describes both.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import psycopg
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.routing import compile_path

from catalog.times import BadParam, parse_instant_ms

# SQLite's INTEGER and Spark's bigint: an id or offset above this cannot exist, and Python
# would raise OverflowError binding it. Declared in the schema (le=) so the contract says so.
MAX_ID = 2**63 - 1


class ErrorOut(BaseModel):
    """The body of every 4xx (but FastAPI's request-validation 422) and of 503."""

    detail: str = Field(description="what is wrong, naming the parameter or field and the bound crossed")
    param: str | None = Field(None, description="the query parameter or body field at fault, where there is one")


class ParamHTTPError(HTTPException):
    """An HTTPException that also names the parameter at fault (rendered by install())."""

    def __init__(self, status_code: int, param: str | None, detail: str):
        super().__init__(status_code, detail)
        self.param = param


def param_error(exc: BadParam, status_code: int = 400) -> ParamHTTPError:
    return ParamHTTPError(status_code, exc.param, str(exc))


def bad_request(param: str | None, detail: str) -> ParamHTTPError:
    return ParamHTTPError(400, param, detail)


def optional_range(start: str | None, end: str | None, now_ms: int) -> tuple[int | None, int | None]:
    """An optional `from`/`to` pair of a listing route as epoch ms (either may be left out), with
    the 400s of a bad instant or a `to` not after `from`."""
    try:
        start_ms = None if start is None else parse_instant_ms(start, now_ms, "from")
        end_ms = None if end is None else parse_instant_ms(end, now_ms, "to")
    except BadParam as exc:
        raise param_error(exc) from None
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise bad_request("to", f"to: 'to' ({end}) must be after 'from' ({start})")
    return start_ms, end_ms


def answered(call, *args, invalid: type[Exception], conflict: type[Exception]):
    """call(*args) for a resource route (alert rules, dashboards): its refusal of the definition
    is a 400 naming the field when the error has one (`field`), a conflict a 409 (naming the field
    likewise: a dashboard changed since the version sent names `updated_ms`)."""
    try:
        return call(*args)
    except invalid as exc:
        raise bad_request(getattr(exc, "field", None), str(exc)) from None
    except conflict as exc:
        field = getattr(exc, "field", None)
        raise (ParamHTTPError(409, field, str(exc)) if field else HTTPException(409, str(exc))) from None


async def _render(request: Request, exc: ParamHTTPError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail, "param": exc.param}, status_code=exc.status_code, headers=exc.headers)


async def _method_not_allowed(request: Request, exc: HTTPException) -> JSONResponse:
    """405 with an Allow header naming every method of the path. Starlette's names only the
    methods of the first route that matched the path, while one path here is often several
    routes (GET, PUT and DELETE /api/v1/alerts/rules/{name} are three functions). The methods
    come from the OpenAPI document, the contract itself (FastAPI's routers nest the routes)."""
    allowed = {method.upper() for pattern, methods in _path_methods(request.app) if pattern.match(request.url.path)
               for method in methods}
    headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(allowed))} if allowed else exc.headers
    return JSONResponse({"detail": exc.detail}, status_code=405, headers=headers)


def _path_methods(app) -> list[tuple[re.Pattern, list[str]]]:
    cached = getattr(app.state, "path_methods", None)
    if cached is None:
        cached = app.state.path_methods = [(compile_path(path)[0], list(ops))
                                           for path, ops in app.openapi().get("paths", {}).items()]
    return cached


async def _storage_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A store that cannot read or write (disk full, I/O error, a lock held past the busy
    timeout, a PostgreSQL server gone): the service is unavailable, the request did not fail on
    its own account. A write is one transaction, so nothing was half-written."""
    where = _store_file(request, exc)
    return JSONResponse({"detail": f"the store{f' ({where})' if where else ''} cannot serve this request now,"
                                   f" nothing was changed: {type(exc).__name__}: {exc}", "param": None},
                        status_code=503, headers={"Retry-After": "5"})


def _store_file(request: Request, exc: Exception) -> str | None:
    """The SQLite file a store error is about, for whoever must make room: the one the error names
    (store/connection.py `naming_file`), else the serving store's file; None on PostgreSQL."""
    if not isinstance(exc, sqlite3.Error):
        return None
    path = getattr(exc, "db_path", None)
    if path is None:
        ctx = getattr(request.app.state, "ctx", None)
        path = getattr(getattr(ctx, "store", None), "path", None)
    return None if path is None else str(path)


def install(app) -> None:
    app.add_exception_handler(ParamHTTPError, _render)
    app.add_exception_handler(405, _method_not_allowed)
    app.add_exception_handler(sqlite3.OperationalError, _storage_unavailable)
    app.add_exception_handler(psycopg.OperationalError, _storage_unavailable)


_DEFAULT_TEXT = {
    400: "a parameter or the body is invalid; `detail` says which and why",
    404: "the stream, metric or rule named does not exist",
    409: "conflicts with the current state",
    413: "the body is over its size or event-count limit",
    503: "a component this route needs is not configured or not ready",
}


def errors(*codes: int, **texts: str) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each code with the ErrorOut body. `texts` override the
    descriptions, keyed `e404="no such rule"`."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"model": ErrorOut, "description": texts.get(f"e{code}", _DEFAULT_TEXT.get(code, "error"))}
    return out
