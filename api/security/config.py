"""What the security middleware is configured with; built by the composition root."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ingest.json_limits import JsonLimits
from api.security.origins import normalize_origin
from api.security.ratelimit import RateLimiter
from api.security.token_file import TokenRegistry


def normalize_origins(origins: Iterable[str], setting: str) -> frozenset[str]:
    out = set()
    for origin in origins:
        normal = normalize_origin(origin)
        if normal is None:
            raise ValueError(f"{setting}: {origin!r} is not an origin (scheme://host[:port], e.g. https://example.com)")
        out.add(normal)
    return frozenset(out)


@dataclass(frozen=True)
class SecurityConfig:
    tokens: TokenRegistry = field(default_factory=TokenRegistry.open)
    # Websocket handshakes from these origins are accepted besides the service's own (normalized).
    allowed_origins: frozenset[str] = frozenset()
    # Origins that get CORS headers; empty: none at all (the browser's same-origin policy holds).
    cors_origins: tuple[str, ...] = ()
    # Per token (or client address when open): requests to every route but the open ones, and
    # events posted. None: no limit (the tests' apps; settings set both).
    request_limit: RateLimiter | None = None
    event_limit: RateLimiter | None = None
    # While no token is required, answer only requests naming a loopback Host (DNS rebinding,
    # api/security/exposure.py). The composition root turns it on; tests' TestClient says
    # `Host: testserver`, so the default is off.
    loopback_host_when_open: bool = False
    # GET paths open without a token besides the probes and the dashboard (metrics_public: /metrics).
    public_paths: frozenset[str] = frozenset()
    # Bounds on each ingested event's JSON (depth, string length, integer digits).
    json_limits: JsonLimits = field(default_factory=JsonLimits)
