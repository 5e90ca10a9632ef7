"""The security middleware: tokens and scopes on every request, the websocket's Origin and
token before its handshake is accepted, the content types writes may carry.

A pure ASGI middleware rather than FastAPI dependencies: the websocket must be refused before
accept (Starlette's CORS middleware ignores websockets), and one table (policy.py) decides the
scope of every path, routes added later included, with nothing to forget on each route."""

from __future__ import annotations

import hmac
import json

from api.security.config import SecurityConfig
from api.security.exposure import host_header_is_loopback
from api.security.media import unsupported_body
from api.security.origins import origin_allowed
from api.security.policy import required_scope, websocket_scope
from api.security.ratelimit import RateLimiter, client_key, retry_after
from api.security.scopes import Scope, grants
from api.security.tokens import TokenRecord, TokenSet

REALM = 'Bearer realm="sketchboard"'
# Browsers cannot set Authorization on a websocket; they can offer subprotocols. A client offers
# ["sketchboard", "sketchboard.token.<token>"] and the server answers with "sketchboard" only, so
# the token is never echoed back. Query parameters were not chosen: URLs end up in logs and history.
WS_PROTOCOL = "sketchboard"
WS_TOKEN_PREFIX = "sketchboard.token."


class Denied(Exception):
    def __init__(self, status: int, detail: str, challenge: str | None = None, retry_after: str | None = None):
        super().__init__(detail)
        self.status, self.detail, self.challenge, self.retry_after = status, detail, challenge, retry_after


def authorize(required: bool, tokens: TokenSet, presented: str | None, needed: Scope | None) -> TokenRecord | None:
    """The token's record (None when none is needed); Denied(401/403) otherwise. Pure."""
    if not required or needed is None:
        return None
    if presented is None:
        raise Denied(401, f"this API needs a token with scope '{needed}': send Authorization: Bearer <token>"
                     " (`sketchboard token create NAME --scope ...` makes one)", REALM)
    record = tokens.lookup(presented)
    if record is None:
        raise Denied(401, "the token is not valid (unknown or revoked)", f'{REALM}, error="invalid_token"')
    if not grants(record.scopes, needed):
        held = ", ".join(sorted(s.value for s in record.scopes))
        raise Denied(403, f"token {record.name!r} has scopes [{held}]; this needs '{needed}'",
                     f'{REALM}, error="insufficient_scope", scope="{needed}"')
    return record


def refused_now(config: SecurityConfig, record: TokenRecord | None, needed: Scope | None) -> str | None:
    """Why a connection accepted with `record` (None: no token was needed) would be refused now, by
    the same token store the handshake used: revoked, its scope gone, or a token now required.
    None while it would still be accepted. For a websocket's periodic re-check."""
    required, tokens = config.tokens.state()
    if not required or needed is None:
        return None
    if record is None:
        return "a token is now required"
    current = None
    for r in tokens.records:  # every record compared, as TokenSet.lookup does
        if hmac.compare_digest(r.sha256, record.sha256):
            current = r
    if current is None:
        return f"token {record.name!r} was revoked"
    if not grants(current.scopes, needed):
        return f"token {record.name!r} no longer has scope '{needed}'"
    return None


def bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else ""


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _body(exc: Denied) -> tuple[list, bytes]:
    body = json.dumps({"detail": exc.detail, "param": None}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-content-type-options", b"nosniff")]
    if exc.challenge:
        headers.append((b"www-authenticate", exc.challenge.encode()))
    if exc.retry_after:
        headers.append((b"retry-after", exc.retry_after.encode()))
    return headers, body


def charge(limiter: RateLimiter | None, key: str, cost: float = 1.0, what: str = "requests") -> None:
    """Denied(429) with Retry-After when `key` is over its limit."""
    if limiter is None:
        return
    wait = limiter.take(key, cost)
    if wait > 0:
        who = key.replace("token:", "token ", 1).replace("addr:", "client ", 1)
        raise Denied(429, f"rate limit: {who} is over {limiter.rate:g} {what}/s (burst {limiter.burst:g});"
                     f" retry in {wait:.1f} s", retry_after=retry_after(wait))


def check_host(required: bool, loopback_only: bool, host: str | None) -> None:
    if loopback_only and not required and not host_header_is_loopback(host):
        raise Denied(403, f"Host {host!r} refused: with no API tokens this service answers only loopback names"
                     " (127.0.0.1, localhost, [::1]); create a token to serve other names")


def guarded(required: bool, tokens: TokenSet, presented: str | None, needed: Scope | None,
            limiter: RateLimiter | None, client) -> tuple[TokenRecord | None, str]:
    """authorize() then the request rate limit: (the token's record, the rate-limit key). A
    request with a bad token is charged to its address first, so guessing tokens is rate-limited
    too (429 instead of 401 once over)."""
    try:
        record = authorize(required, tokens, presented, needed)
    except Denied as exc:
        if exc.status == 401:
            charge(limiter, client_key(None, client))
        raise
    key = client_key(record.name if record else None, client)
    if needed is not None:  # the open paths (probes, the dashboard's files) are not limited
        charge(limiter, key)
    return record, key


class SecurityMiddleware:
    def __init__(self, app, config: SecurityConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope, receive, send):
        headers = _headers(scope)
        method = scope["method"]
        try:
            required, tokens = self.config.tokens.state()
            check_host(required, self.config.loopback_host_when_open, headers.get("host"))
            needed = required_scope(method, scope["path"], self.config.public_paths)
            record, key = guarded(required, tokens, bearer(headers), needed, self.config.request_limit,
                                  scope.get("client"))
            has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
            why = unsupported_body(method, headers.get("content-type"), has_body)
            if why:
                raise Denied(415, why)
        except Denied as exc:
            response_headers, body = _body(exc)
            await send({"type": "http.response.start", "status": exc.status, "headers": response_headers})
            await send({"type": "http.response.body", "body": body})
            return
        state = scope.setdefault("state", {})
        state["token"] = record  # who did it, for handlers that record changes
        state["rate_key"] = key  # the ingest route charges its events to the same key

        async def send_nosniff(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
            await send(message)

        await self.app(scope, receive, send_nosniff)

    async def _websocket(self, scope, receive, send):
        headers = _headers(scope)
        offered = list(scope.get("subprotocols") or [])
        presented = bearer(headers)
        for proto in offered:
            if proto.startswith(WS_TOKEN_PREFIX):
                presented = proto[len(WS_TOKEN_PREFIX):]
        try:
            if not origin_allowed(headers.get("origin"), headers.get("host"), self.config.allowed_origins):
                raise Denied(403, f"websocket from origin {headers.get('origin')!r} refused: only the service's own"
                             " origin and those in allowed_origins may connect")
            required, tokens = self.config.tokens.state()
            check_host(required, self.config.loopback_host_when_open, headers.get("host"))
            record, _ = guarded(required, tokens, presented, websocket_scope(scope["path"]),
                                self.config.request_limit, scope.get("client"))
        except Denied as exc:
            await self._deny(scope, receive, send, exc)
            return
        # The app never sees the token: it is dropped from the offered subprotocols.
        scope = {**scope, "subprotocols": [p for p in offered if not p.startswith(WS_TOKEN_PREFIX)],
                 "state": {**scope.get("state", {}), "token": record}}
        await self.app(scope, receive, send)

    async def _deny(self, scope, receive, send, exc: Denied):
        message = await receive()  # websocket.connect: the handshake we now refuse
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            # A real HTTP answer (401 or 403 with the reason), as for any other request.
            headers, body = _body(exc)
            await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # a server without the extension answers a close before accept with 403
            await send({"type": "websocket.close", "code": 1008, "reason": exc.detail[:120]})
