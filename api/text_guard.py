"""Requests whose path or query holds a NUL character (U+0000, `%00`) are refused with a 400.

No name, key or label the service stores can hold one: ingest refuses it in labels
(ingest/events.py), and PostgreSQL's text cannot hold it at all, so a lookup of such a name
there raised psycopg.DataError (a 500) where SQLite found nothing. Refused here, before any
route, both backends answer alike, with the reason, and nothing reaches a store. A pure ASGI
middleware inside the security one: a caller without a token still gets its 401 first.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from ingest.events import NUL
from ingest.events import NUL_REASON as REASON


def nul_in_request(path: str, query_string: bytes) -> tuple[str | None, str] | None:
    """(the parameter at fault or None, why) when the decoded path or a query parameter holds a
    NUL; None otherwise. Pure."""
    if NUL in path:
        return None, f"the path {REASON}"
    if b"%00" not in query_string and b"\x00" not in query_string:
        return None
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if NUL in name:
            return None, f"a query parameter's name {REASON}"
        if NUL in value:
            return name, f"{name}: {REASON}"
    return None


class NulGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        found = nul_in_request(scope.get("path", ""), scope.get("query_string", b"")) \
            if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        param, detail = found
        body = json.dumps({"detail": detail, "param": param}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def document(doc: dict) -> dict:
    """Every operation may answer this 400, since any request may carry a query string (in place)."""
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            op.setdefault("responses", {}).setdefault("400", {
                "description": "a parameter is invalid; `detail` says which and why (a NUL character in"
                               " the path or query is refused on every route)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}})
    return doc
