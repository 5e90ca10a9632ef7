"""Changelog tables (kind: table): write rows, delete keys, read the current state.

- POST /api/v1/tables/{name}: a JSON array or NDJSON of rows, each an upsert of its key's row,
  or a delete with `"_deleted": true`; validated one by one (ingest/tables.py), the accepted
  ones appended to the log with the key as the record key (one key, one partition, in order).
- DELETE /api/v1/tables/{name}/{key}: one delete (a tombstone); the key is the rest of the path.
- GET /api/v1/tables/{name}?key=K: the key's current row; without `key`, the rows in key
  order, `limit` at a time, the next page after `cursor` (the last key of the page before; null
  when no row follows).
Both writes take an Idempotency-Key as POST /api/v1/events does (api/idempotency.py).
The state is what the pipeline has committed (store/table_state.py): a change shows there
once its batch is committed, as a change shows in panes. A view (catalog/views.py: a join of two
tables the pipeline maintains, store/view_state.py) is read by the same GET; a write to one is a
409 naming the tables to write instead. GET /api/v1/views/{view}/changes is a view's changelog:
each change of a view row with its old and new row, in commit order, paged by a cursor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.bodies import MalformedLine, parse_events, read_capped
from api.context import ApiContext
from api.errors import ParamHTTPError, bad_request, errors
from api.idempotency import HEADER, KEY_MAX_LENGTH, KEY_PATTERN, fingerprint, guarded, key_scope, replayed_header_doc
from api.ingest_routes import RejectedEvent, ValidationIssue, rate_limit_events, too_large
from catalog import StreamDef
from ingest.events import Event
from ingest.json_limits import violation
from ingest.log import LogUnavailable, RecordTooLarge
from ingest.tables import DELETED_FLAG, TableRowValidator, is_tombstone
from store.table_state import TableRow
from store.view_state import ChangesGone

MAX_PAGE = 1000


class TableWriteAnswer(BaseModel):
    table: str
    upserts: int = Field(description="rows accepted as upserts")
    deletes: int = Field(description="rows accepted as deletes (tombstones)")
    rejected: list[RejectedEvent]
    ingest_time_ms: int
    partitions: dict[int, tuple[int | None, int]] = Field(
        description="partition -> (first offset, records written); the first offset is null where Kafka"
                    " acknowledged a retried record without its offset")


class TableWrite422(BaseModel):
    """422: a header outside its schema (FastAPI's list of issues), or an Idempotency-Key used
    before for a different request (a message, `param` names the header)."""

    detail: list[ValidationIssue] | str
    param: str | None = None


def _idempotency_key(what: str) -> Any:
    """The Idempotency-Key header of a write, as POST /api/v1/events declares it (`what`: what makes
    two requests the same)."""
    return Header(None, alias=HEADER, min_length=1, max_length=KEY_MAX_LENGTH, pattern=KEY_PATTERN,
                  description=f"makes a retry safe: the same request ({what}) repeated with the same key within"
                              " `idempotency_key_ttl` is not appended again and gets the first answer back")


def _write_responses(e400: str, e409: str, **more: str) -> dict[int | str, dict[str, Any]]:
    """The answers of a write to a table: its errors, and those of an Idempotency-Key."""
    return {**errors(400, 404, 409, 503, e400=e400, e404="unknown table",
                     e409=f"{e409}; or a request with the same {HEADER} still being processed (Retry-After)",
                     e503="the log did not acknowledge the write", **more),
            200: replayed_header_doc(),
            422: {"model": TableWrite422, "description": f"a header outside its schema, or the {HEADER} used for a"
                                                         " different request"}}


class TableRowOut(BaseModel):
    key: str
    row: dict[str, Any] = Field(description="the row's columns: its dimensions (strings) and values (numbers)")
    event_time_ms: int = Field(description="the time of the change that set the row")
    partition: int
    offset: int = Field(description="where that change is in the log")
    updated_at_ms: int = Field(description="when the pipeline committed it")


class TableRowAnswer(BaseModel):
    table: str
    key: str
    row: TableRowOut


class TablePage(BaseModel):
    table: str
    rows: list[TableRowOut]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null: no more rows")


class ViewChangeOut(BaseModel):
    key: str
    old: dict[str, Any] | None = Field(description="the view row before the change; null: the row is new")
    new: dict[str, Any] | None = Field(description="the view row after the change; null: the row is gone")
    event_time_ms: int = Field(description="the time of the table change that caused it")
    partition: int
    offset: int = Field(description="where that table change is in its table's log")
    cursor: str = Field(description="the change's position in the view's changelog (opaque; a cursor of the"
                                    " older form \"batch.seq\" is still read)")
    committed_at_ms: int = Field(description="when the pipeline committed it")


class ViewChangesPage(BaseModel):
    view: str
    changes: list[ViewChangeOut]
    next_cursor: str = Field(description="pass as `cursor` to read on; the same cursor again when nothing is new")


_ROWS_BODY = {"requestBody": {
    "required": True,
    "description": "rows: a JSON array, or NDJSON (one row per line); a row is an object with the table's key, its"
                   f" dimensions and values (and optionally its time field); `\"{DELETED_FLAG}\": true` with the key"
                   " deletes the row",
    "content": {"application/json": {"schema": {"type": "array", "items": {"description": "a row"}}},
                "application/x-ndjson": {"schema": {"type": "string", "description": "one row per line"}}},
}}


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1/tables", tags=["tables"])
    validators = {name: TableRowValidator(s) for name, s in ctx.catalog.streams.items() if s.kind == "table"}

    views = ctx.catalog.views

    def table(name: str) -> StreamDef:
        if name in views:
            view = views[name]
            raise HTTPException(409, f"{name!r} is a view (a {view.kind} join of tables {view.left!r} and"
                                     f" {view.right!r}): its rows are maintained from theirs, write to those")
        stream = ctx.catalog.streams.get(name)
        if stream is None or stream.kind != "table":
            raise HTTPException(404, f"unknown table {name!r}; tables: {', '.join(sorted(validators)) or 'none'}"
                                     f"; views: {', '.join(sorted(views)) or 'none'}")
        return stream

    def writable(name: str) -> StreamDef:
        stream = table(name)
        if stream.source is not None:  # a second writer would break the follower's exactly-once
            raise HTTPException(409, f"table {name!r} is fed by change data capture from {stream.source.table}"
                                     " (source:): change the rows in that PostgreSQL table instead")
        return stream

    async def append(stream: StreamDef, events: list[Event], rejected: list[RejectedEvent],
                     now: int, where: list[int] | None = None) -> TableWriteAnswer:
        """`where`: each appended row's index in the request (None: the same)."""
        try:
            result = await run_in_threadpool(ctx.log.append, stream, events, now) if events else None
        except LogUnavailable as exc:
            raise HTTPException(503, f"the log did not take the rows, none is reported accepted: {exc}") from None
        except RecordTooLarge as exc:  # never storable: a 413 naming the row, not a 503 to retry
            raise too_large(exc, exc.index if where is None else where[exc.index]) from None
        deletes = sum(1 for e in events if is_tombstone(stream, e))
        return TableWriteAnswer(table=stream.name, upserts=len(events) - deletes, deletes=deletes, rejected=rejected,
                                ingest_time_ms=now, partitions=result.ranges if result else {})

    async def once(request: Request, name: str, key: str | None, what: tuple[str | bytes, ...],
                   work: Callable[[], Awaitable[TableWriteAnswer]]) -> TableWriteAnswer | Response:
        """`work`'s answer; with an Idempotency-Key, a repeat of the request (the same `what`: method,
        body...) gets the first answer back (`Idempotent-Replayed: true`) instead of appending again
        (api/idempotency.py, as for events)."""
        if ctx.idempotency is None or key is None:
            return await work()
        # The request's hash only when a key asks for it: it is what tells a retry from new rows.
        request_fingerprint = fingerprint(*what)

        async def recorded() -> dict:
            return (await work()).model_dump(mode="json")

        answer = await guarded(ctx.idempotency, key, key_scope(request, name), request_fingerprint, ctx.now_ms(),
                               recorded)
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    @r.post("/{name}", response_model=TableWriteAnswer, openapi_extra=_ROWS_BODY,
            responses=_write_responses("malformed body (not UTF-8, not JSON, not an array)",
                                       "a view (write to its tables), or a table fed by change data capture",
                                       e413="body or row count over the configured limit, or a row over what the"
                                            " log stores as one record (Kafka's message.max.bytes)"),
            summary="Upsert or delete rows of a changelog table (JSON array or NDJSON)")
    async def post_rows(request: Request, name: str,
                        idempotency_key: str | None = _idempotency_key("same table and body")) -> Response:
        stream = writable(name)
        body = await read_capped(request, ctx.max_body_bytes)
        content_type = request.headers.get("content-type", "")

        async def work() -> TableWriteAnswer:
            return await write_rows(request, stream, body, content_type)

        return await once(request, name, idempotency_key, ("POST", content_type, body), work)

    async def write_rows(request: Request, stream: StreamDef, body: bytes, content_type: str) -> TableWriteAnswer:
        """Validate the rows one by one and append the accepted ones (the bad ones rejected with their reasons)."""
        name = stream.name
        raws = parse_events(body, content_type)
        if len(raws) > ctx.max_events_per_request:
            raise HTTPException(413, f"{len(raws)} rows exceed the limit of {ctx.max_events_per_request} per request")
        rate_limit_events(ctx, request, len(raws))
        now = ctx.now_ms()
        validator = validators[name]
        events, rejected, where = [], [], []  # where: each accepted row's index in the request
        for index, raw in enumerate(raws):
            if isinstance(raw, MalformedLine):
                rejected.append(RejectedEvent(index=index, reason=raw.reason))
                continue
            try:
                events.append(validator.validate(raw, now))
            except ValueError as exc:
                rejected.append(RejectedEvent(index=index, reason=str(exc)))
                continue
            problem = violation(raw, ctx.security.json_limits)
            if problem:
                events.pop()
                rejected.append(RejectedEvent(index=index, reason=problem))
                continue
            where.append(index)
        return await append(stream, events, rejected, now, where)

    # `key:path`: a key may hold "/", which a server decodes from %2F before routing (uvicorn
    # routes on the decoded path), so a plain {key} would not match "team%2F42".
    @r.delete("/{name}/{key:path}", response_model=TableWriteAnswer,
              responses=_write_responses("an empty key, or one no key can be (over 1 024 characters or 2 048 bytes,"
                                         " a NUL, a lone surrogate)",
                                         "a view (write to its tables), or a table fed by change data capture"),
              summary="Delete one row of a changelog table (appends a tombstone)")
    async def delete_row(request: Request, name: str, key: str,
                         idempotency_key: str | None = _idempotency_key("same table and key")) -> Response:
        stream = writable(name)

        async def work() -> TableWriteAnswer:
            rate_limit_events(ctx, request, 1)
            now = ctx.now_ms()
            try:  # the key meets the rules a POSTed delete's does (not empty, its length, no NUL nor lone surrogate)
                event = validators[name].validate({stream.key_field: key, DELETED_FLAG: True}, now)
            except ValueError as exc:
                raise bad_request("key", str(exc)) from None
            return await append(stream, [event], [], now)

        return await once(request, name, idempotency_key, ("DELETE", key), work)

    # Under /api/v1/views, not /api/v1/tables/{name}/changes, which would overlap DELETE
    # /api/v1/tables/{name}/{key} (a row keyed "changes").
    views_router = APIRouter(prefix="/api/v1/views", tags=["tables"])

    @views_router.get("/{name}/changes", response_model=ViewChangesPage,
           responses=errors(400, 404, 410, e400="a table (its changes are its log), a malformed cursor, or one past"
                                                " the view's last change",
                            e404="unknown view",
                            e410="the changes after the cursor are gone (past the view's retention, or dropped by a"
                                 " rebuild): re-read the view's rows, then its changes from the cursor the detail"
                                 " names"),
           summary="A view's changelog: each change of a view row with its old and new row, in commit order")
    def get_changes(name: str,
                    limit: int = Query(100, ge=1, le=MAX_PAGE, description="changes per page"),
                    cursor: str = Query("", description="the next_cursor of the page before; empty: from the oldest"
                                                        " change kept")) -> ViewChangesPage:
        if name not in views:
            table(name)  # 404 for an unknown name
            raise HTTPException(400, f"{name!r} is a table: its changes are its log (a metric over it counts"
                                     f" them); a changelog with old and new rows is a view's"
                                     f" (views: {', '.join(sorted(views)) or 'none'})")
        try:
            changes = ctx.store.view_changes(name, after=cursor, limit=limit)
        except ValueError as e:  # malformed, or past the last change
            raise bad_request("cursor", str(e)) from None
        except ChangesGone as e:
            # Reading on would skip changes. The rows read now are the view at or after the end `last`
            # (which only grows), and applying the changes after it to them gives the view again.
            raise ParamHTTPError(410, "cursor", f"{e}: re-read the view's rows (GET /api/v1/tables/{name}), then"
                                                f" read its changes on from cursor '{e.last}'") from None
        return ViewChangesPage(view=name, changes=[ViewChangeOut(
            key=c.key, old=c.old, new=c.new, event_time_ms=c.event_time_ms, partition=c.partition, offset=c.offset,
            cursor=c.cursor, committed_at_ms=c.committed_at_ms) for c in changes],
            next_cursor=changes[-1].cursor if changes else cursor)

    @r.get("/{name}", response_model=TableRowAnswer | TablePage,
           responses=errors(400, 404, e404="unknown table or view, or no row with this key"),
           summary="A changelog table's or a view's current state: one row (?key=) or a page of rows")
    def get_rows(name: str,
                 key: str | None = Query(None, description="the row's key: answer that row only"),
                 limit: int = Query(100, ge=1, le=MAX_PAGE, description="rows per page"),
                 cursor: str = Query("", description="the next_cursor of the page before")) -> TableRowAnswer | TablePage:
        is_view = name in views
        if not is_view:
            table(name)
        if key is not None:
            found = ctx.store.view_row(name, key) if is_view else ctx.store.table_row(name, key)
            if found is None:
                raise HTTPException(404, f"{'view' if is_view else 'table'} {name!r} has no row with key {key!r}")
            return TableRowAnswer(table=name, key=key, row=_out(found))
        read = ctx.store.view_rows if is_view else ctx.store.table_rows
        page, more = _page(read(name, after=cursor or None, limit=limit + 2), limit)
        return TablePage(table=name, rows=[_out(row) for row in page], next_cursor=page[-1].key if more else None)

    both = APIRouter()
    both.include_router(r)
    both.include_router(views_router)
    return both


def _page(rows: list[TableRow], limit: int) -> tuple[list[TableRow], bool]:
    """The page of `limit` rows out of up to `limit + 2` read after its cursor, and whether more
    follow: known by reading past the page, so a last page of exactly `limit` rows says no more
    (null next_cursor) rather than send the reader for an empty one. A row keyed "" (stored before
    empty keys were refused) comes first on the first page and is not counted: its key as the
    next cursor would read as "from the start" again."""
    size = limit + (1 if rows and rows[0].key == "" else 0)
    return rows[:size], len(rows) > size


def _out(row) -> TableRowOut:
    return TableRowOut(key=row.key, row=row.row, event_time_ms=row.event_time_ms, partition=row.partition,
                       offset=row.offset, updated_at_ms=row.updated_at_ms)
