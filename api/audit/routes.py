"""GET /api/v1/audit: who changed what, newest first (scope admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.errors import MAX_ID


class AuditEntryOut(BaseModel):
    id: int
    at_ms: int
    actor: str = Field(description="the token's name; 'anonymous' on an open service; 'cli:<user>' for the CLI")
    client: str | None = Field(description="the client's address (HTTP changes)")
    action: str = Field(description="'PUT /api/v1/alerts/rules/x', 'token.create', 'token.revoke', ...")
    target: str | None
    status: int | None = Field(description="the HTTP status answered")
    detail: Any = Field(None, description="the request body (JSON, cut at 64 KiB) or a token's scopes")


class AuditOut(BaseModel):
    entries: list[AuditEntryOut]
    count: int


def router(store) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["audit"])

    @r.get("/audit", summary="Changes to alert rules, silences and tokens, with who made them",
           responses={200: {"model": AuditOut}}, response_model=None)
    def audit(limit: int = Query(100, ge=1, le=10_000, description="entries to return"),
              after_id: int | None = Query(None, ge=0, le=MAX_ID,
                                           description="only entries after this id, oldest first (to tail the log)")):
        entries = [entry.to_dict() for entry in store.entries(limit=limit, after_id=after_id)]
        return {"entries": entries, "count": len(entries)}

    return r
