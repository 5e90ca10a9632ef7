"""What is audited and how a change is described. Pure."""

from __future__ import annotations

import json
from typing import Any

from api.security.media import WRITE_METHODS
from api.security.policy import required_scope
from api.security.scopes import Scope

MAX_DETAIL_BYTES = 64 * 1024  # a rule or a silence is far smaller; a bigger body is cut, not dropped


def audited(method: str, path: str) -> bool:
    """Every change that needs the admin scope (rules, silences, and whatever admin routes come
    later: dashboards, reprocessing). Ingested events are data, not changes: not audited."""
    return method in WRITE_METHODS and required_scope(method, path) == Scope.ADMIN


def actor(token_name: str | None) -> str:
    return token_name if token_name is not None else "anonymous"


def detail(body: bytes) -> Any:
    """The request body as JSON when it is, else its text; cut at MAX_DETAIL_BYTES."""
    if not body:
        return None
    if len(body) > MAX_DETAIL_BYTES:
        return {"truncated": True, "bytes": len(body), "head": body[:1024].decode("utf-8", "replace")}
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
