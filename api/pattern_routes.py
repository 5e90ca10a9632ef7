"""Patterns (complex event processing): what is declared, and the matches the pipeline stored.

- GET /api/v1/patterns: the declared patterns (configuration `patterns:`), each with its derived
  stream and metrics (`<pattern>_matches`, `<pattern>_matches_<measure>`).
- GET /api/v1/patterns/{name}/matches: the pattern's matches in the order they were decided,
  `limit` at a time, the next page after `cursor`; filtered by `key` and by decided time
  (`from` inclusive, `to` exclusive). A match shows once its batch is committed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from api.context import ApiContext
from api.errors import bad_request, errors, optional_range
from catalog.patterns import match_metric_names, matches_stream_name

MAX_PAGE = 1000


class PatternOut(BaseModel):
    name: str
    description: str
    key: str = Field(description="matching runs per value of this field")
    streams: list[str] = Field(description="the streams whose events the pattern reads")
    matches_stream: str = Field(description="the derived stream with one row per match, at its decided time")
    metrics: list[str] = Field(description="the match count (and rate), then each measure as a value")
    definition: dict[str, Any] = Field(description="the declaration as configured (docs/patterns.md)")


class PatternsOut(BaseModel):
    patterns: list[PatternOut]


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


class MatchesPage(BaseModel):
    pattern: str
    matches: list[MatchOut]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null: no more matches")


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1/patterns", tags=["patterns"])
    declared = {p.name: p for p in ctx.catalog.patterns}

    @r.get("", response_model=PatternsOut, summary="The declared patterns, with their derived stream and metrics")
    def list_patterns() -> PatternsOut:
        return PatternsOut(patterns=[
            PatternOut(name=p.name, description=p.description, key=p.key, streams=list(p.streams),
                       matches_stream=matches_stream_name(p.name), metrics=list(match_metric_names(p)),
                       definition=p.model_dump(mode="json", exclude_defaults=True))
            for p in ctx.catalog.patterns])

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
        if name not in declared:
            raise HTTPException(404, f"unknown pattern {name!r}; patterns: {', '.join(sorted(declared)) or 'none'}")
        after = 0
        if cursor:
            if not cursor.isdigit() or len(cursor) > 18:
                raise bad_request("cursor", f"cursor: {cursor!r} is not a cursor this route gave (next_cursor)")
            after = int(cursor)
        now = ctx.now_ms()
        start_ms, end_ms = optional_range(start, end, now)
        found = ctx.store.pattern_matches(name, key=key, start_ms=start_ms, end_ms=end_ms, after_id=after, limit=limit)
        return MatchesPage(pattern=name, matches=[MatchOut(id=m.id, key=m.key, decided_at_ms=m.decided_at_ms,
                                                           events=m.events, measures=m.measures, late=m.late,
                                                           batch_id=m.batch_id, committed_at_ms=m.committed_at_ms,
                                                           retracts=m.retracts)
                                                  for m in found],
                           next_cursor=str(found[-1].id) if len(found) == limit else None)

    return r
