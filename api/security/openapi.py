"""The security part of the OpenAPI document, from the same policy the middleware enforces."""

from __future__ import annotations

from api.security.media import ACCEPTED, WRITE_METHODS
from api.security.policy import required_scope

_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
_RETRY = {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}}
_CHALLENGE = {"WWW-Authenticate": {"description": "Bearer challenge (RFC 6750)", "schema": {"type": "string"}}}


def document(doc: dict, public: frozenset[str] = frozenset()) -> dict:
    """Adds the bearer scheme, each operation's scope and its 401/403/415 answers (in place)."""
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "A token from `sketchboard token create NAME --scope ingest|read|admin` (admin implies"
        " the others). Needed when tokens are configured or the service listens beyond loopback.",
    }
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            method = method.upper()
            responses = op.setdefault("responses", {})
            scope = required_scope(method, path, public)
            if scope is not None:
                op["security"] = [{"bearer": []}]
                note = f"Scope: `{scope}` (when tokens are required)."
                op["description"] = f"{op['description']}\n\n{note}" if op.get("description") else note
                responses.setdefault("401", {"description": "no token, or one that is unknown or revoked",
                                             "headers": _CHALLENGE, "content": _ERROR})
                responses.setdefault("403", {"description": f"the token lacks the `{scope}` scope",
                                             "headers": _CHALLENGE, "content": _ERROR})
                responses.setdefault("429", {"description": "over the rate limit of the token (or of the client"
                                             " address when no token is needed); Retry-After says when to retry",
                                             "headers": _RETRY, "content": _ERROR})
            if method in WRITE_METHODS:
                responses.setdefault("415", {"description": f"a body that is not {' or '.join(ACCEPTED)}",
                                             "content": _ERROR})
    return doc
