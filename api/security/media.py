"""Which request bodies a write may carry. Pure.

A web page on another origin can make the browser send a POST without asking first (no CORS
preflight) only with text/plain, application/x-www-form-urlencoded or multipart/form-data.
Accepting nothing but JSON and NDJSON therefore means a foreign page cannot write at all:
anything it could send is refused, and what we accept needs a preflight that fails (no CORS
headers unless cors_origins is set)."""

from __future__ import annotations

ACCEPTED = ("application/json", "application/x-ndjson")
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def media_type(content_type: str | None) -> str | None:
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip().lower() or None


def unsupported_body(method: str, content_type: str | None, has_body: bool) -> str | None:
    """Why the request is refused (415), or None. A write with no body and no Content-Type
    passes to the route (DELETE of a rule needs none; a route that needs a body refuses an
    empty one itself)."""
    if method not in WRITE_METHODS:
        return None
    media = media_type(content_type)
    if media is None and not has_body:
        return None
    if media in ACCEPTED:
        return None
    got = f"Content-Type {content_type!r}" if media else "no Content-Type"
    return f"{method} bodies must be {' or '.join(ACCEPTED)}; got {got}"
