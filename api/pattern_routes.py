"""Patterns (complex event processing): what is declared, and the matches the pipeline stored.

- GET /api/v1/patterns: the patterns, those of the configuration (`provisioned`, read-only here)
  and those defined through the API, each with its derived stream and metrics
  (`<pattern>_matches`, `<pattern>_matches_<measure>`); GET /api/v1/patterns/{name}: one.
- POST /api/v1/patterns, PUT and DELETE /api/v1/patterns/{name} (scope admin; with
  ctx.pattern_definitions): define, replace and delete patterns, checked as the configuration's
  (api/pattern_definitions.py); the pipeline picks the change up at its next batch.
- GET /api/v1/patterns/{name}/matches: the pattern's matches in the order they were decided,
  `limit` at a time, the next page after `cursor`; filtered by `key` and by decided time
  (`from` inclusive, `to` exclusive). A match shows once its batch is committed; the matches of
  a deleted pattern stay readable.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.bodies import body_schema, inline_defs, read_json_object
from api.context import ApiContext
from api.errors import answered, bad_request, errors, optional_range
from catalog.defined_patterns import PatternInvalid
from catalog.patterns import PatternDef, match_metric_names, matches_stream_name
from store.pattern_definitions import PatternConflict

MAX_PAGE = 1000
# A pattern is a few hundred bytes; a body past this is refused (413) before it is parsed.
MAX_PATTERN_BODY_BYTES = 64 * 1024
PATTERN_SCHEMA = inline_defs(PatternDef.model_json_schema())


class PatternOut(BaseModel):
    name: str
    description: str
    key: str = Field(description="matching runs per value of this field")
    streams: list[str] = Field(description="the streams whose events the pattern reads")
    matches_stream: str = Field(description="the derived stream with one row per match, at its decided time")
    metrics: list[str] = Field(description="the match count (and rate), then each measure as a value")
    dimensions: list[str] = Field(default_factory=list, description="the metrics' dimensions: the pattern's own"
                                  " (declared, or its first step's stream's but the key), then `late`")
    definition: dict[str, Any] = Field(description="the declaration as configured (docs/patterns.md)")
    provisioned: bool = Field(True, description="declared in the configuration: read-only through the API")
    version: int | None = Field(None, description="defined through the API: the store's version of its last change")
    created_ms: int | None = None
    updated_ms: int | None = None


class InvalidPatternOut(BaseModel):
    name: str
    reason: str


class PatternsOut(BaseModel):
    patterns: list[PatternOut]
    invalid: list[InvalidPatternOut] = Field(
        [], description="patterns defined through the API that the configuration no longer accepts (left out)")


class MatchOut(BaseModel):
    id: int = Field(description="increasing in the order matches were decided and committed")
    key: str
    decided_at_ms: int = Field(description="event time: the last matched event's, or the absence's deadline")
    events: list[dict[str, Any]] = Field(description="{step, stream, partition, offset, time} in matching order")
    measures: dict[str, Any]
    late: bool = Field(description="a correction a late event brought: a match it completed, or a retraction")
    batch_id: int
    committed_at_ms: int
    retracts: int | None = Field(None, description="set on a retraction: the id of the match a late event broke"
                                 " (withdrawn); null on a match")
    dims: dict[str, str] = Field(default_factory=dict, description="the match's dimensions, as in its"
                                 " `<pattern>_matches` panes (a retraction: its match's); `late` is the flag above")


class MatchesPage(BaseModel):
    pattern: str
    matches: list[MatchOut]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null: no more matches")


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1/patterns", tags=["patterns"])
    defined = ctx.pattern_definitions  # api.pattern_definitions.PatternDefinitions, or None: read-only

    def pattern_out(p: PatternDef) -> PatternOut:
        stored = defined.stored.get(p.name) if defined is not None else None
        extra = {} if stored is None else {"provisioned": False, "version": stored.version,
                                           "created_ms": stored.created_ms, "updated_ms": stored.updated_ms}
        return PatternOut(name=p.name, description=p.description, key=p.key, streams=list(p.streams),
                          matches_stream=matches_stream_name(p.name), metrics=list(match_metric_names(p)),
                          dimensions=list(ctx.catalog.streams[matches_stream_name(p.name)].dimensions),
                          definition=p.model_dump(mode="json", exclude_defaults=True), **extra)

    def declared() -> dict[str, PatternDef]:
        return {p.name: p for p in ctx.catalog.patterns}

    @r.get("", response_model=PatternsOut, summary="The patterns (provisioned and defined through the API), with"
           " their derived stream and metrics")
    def list_patterns() -> PatternsOut:
        if defined is not None:
            defined.refresh()
        return PatternsOut(patterns=[pattern_out(p) for p in ctx.catalog.patterns],
                           invalid=[InvalidPatternOut(name=s.name, reason=s.reason)
                                    for s in (defined.skipped if defined is not None else ())])

    @r.get("/{name}", response_model=PatternOut, responses=errors(404, e404="unknown pattern"),
           summary="One pattern, with its derived stream and metrics")
    def get_pattern(name: str) -> PatternOut:
        found = declared().get(name)
        if found is None:
            raise HTTPException(404, f"unknown pattern {name!r}; patterns: {', '.join(sorted(declared())) or 'none'}")
        return pattern_out(found)

    def rules_watching(name: str) -> list[str]:
        """The alert rules that read the pattern (kind `pattern`) or one of its metrics."""
        pattern = declared().get(name)
        if ctx.alerts is None or pattern is None:
            return []
        metrics = set(match_metric_names(pattern))
        return sorted(loaded.stored.name for loaded in ctx.alerts.rules() if loaded.rule is not None and (
            getattr(loaded.rule, "pattern", None) == name or getattr(loaded.rule, "metric", None) in metrics))

    if defined is not None:
        def guarded(call, *args):
            return answered(call, *args, invalid=PatternInvalid, conflict=PatternConflict)

        def saved(name: str) -> PatternOut:
            found = declared().get(name)
            if found is None:  # written, yet not in the catalog: another replica deleted it meanwhile
                raise HTTPException(404, f"pattern {name!r} was deleted meanwhile")
            return pattern_out(found)

        @r.post("", status_code=201, response_model=PatternOut,
                responses=errors(400, 409, 413, e400="an invalid declaration (the reason names the field)",
                                 e409="the name is taken (a provisioned or a defined pattern)"),
                summary="Define a pattern (docs/patterns.md); the pipeline runs it from its next batch on",
                openapi_extra=body_schema(PATTERN_SCHEMA, "the pattern's declaration, as in the configuration"))
        async def create_pattern(request: Request) -> PatternOut:
            data = await read_json_object(request, MAX_PATTERN_BODY_BYTES)
            stored = await run_in_threadpool(guarded, defined.create, data)
            return saved(stored.name)

        @r.put("/{name}", response_model=PatternOut,
               responses=errors(400, 404, 409, 413, e400="an invalid declaration", e404="no such pattern",
                                e409="provisioned: declared in the configuration"),
               summary="Replace a pattern defined through the API (it starts again from nothing; its matches stay)",
               openapi_extra=body_schema(PATTERN_SCHEMA, "the pattern's new declaration; its name is the path's"))
        async def replace_pattern(name: str, request: Request) -> PatternOut:
            data = await read_json_object(request, MAX_PATTERN_BODY_BYTES)
            if await run_in_threadpool(guarded, defined.replace, name, data) is None:
                raise HTTPException(404, f"no pattern defined through the API named {name!r}")
            return saved(name)

        @r.delete("/{name}", status_code=204, responses=errors(404, 409, e404="no such pattern",
                                                               e409="provisioned: declared in the configuration"),
                  summary="Delete a pattern defined through the API (its state goes, its matches stay readable);"
                          " 409 while alert rules watch it")
        async def delete_pattern(name: str) -> Response:
            if name in defined.stored and (watching := await run_in_threadpool(rules_watching, name)):
                raise HTTPException(409, f"alert rules watch pattern {name!r} or its metrics: {', '.join(watching)};"
                                    " delete or change them first")
            if not await run_in_threadpool(guarded, defined.delete, name):
                raise HTTPException(404, f"no pattern defined through the API named {name!r}")
            return Response(status_code=204)

    @r.get("/{name}/matches", response_model=MatchesPage,
           responses=errors(400, 404, e400="a bad cursor, from or to", e404="unknown pattern"),
           summary="A pattern's matches in the order they were decided, paged, by key and time")
    def matches(name: str,
                key: str | None = Query(None, description="only this key's matches"),
                start: str | None = Query(None, alias="from", description="decided at or after this instant"
                                          " ('now-1h', RFC 3339, epoch ms or s)"),
                end: str | None = Query(None, alias="to", description="decided before this instant"),
                limit: int = Query(100, ge=1, le=MAX_PAGE, description="matches per page"),
                cursor: str = Query("", description="the next_cursor of the page before")) -> MatchesPage:
        known = declared()
        # A deleted pattern's matches stay readable (docs/patterns.md, "Patterns defined through the API").
        if name not in known and ctx.store.pattern_newest_match_id(name) is None:
            raise HTTPException(404, f"unknown pattern {name!r}; patterns: {', '.join(sorted(known)) or 'none'}")
        after = 0
        if cursor:
            if not cursor.isdigit() or len(cursor) > 18:
                raise bad_request("cursor", f"cursor: {cursor!r} is not a cursor this route gave (next_cursor)")
            after = int(cursor)
        now = ctx.now_ms()
        start_ms, end_ms = optional_range(start, end, now)
        # One past the page: a last page of exactly `limit` matches says no more (null next_cursor)
        # rather than send the reader for an empty one (as the tables' pages do: api/table_routes.py).
        found = ctx.store.pattern_matches(name, key=key, start_ms=start_ms, end_ms=end_ms, after_id=after,
                                          limit=limit + 1)
        page = found[:limit]
        return MatchesPage(pattern=name, matches=[MatchOut(id=m.id, key=m.key, decided_at_ms=m.decided_at_ms,
                                                           events=m.events, measures=m.measures, late=m.late,
                                                           batch_id=m.batch_id, committed_at_ms=m.committed_at_ms,
                                                           retracts=m.retracts, dims=m.dims)
                                                  for m in page],
                           next_cursor=str(page[-1].id) if len(found) > limit else None)

    return r
