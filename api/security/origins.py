"""Origin matching for the websocket handshake. Pure.

Browsers always send Origin on a websocket handshake and scripts cannot forge it; Starlette's
CORS middleware does not look at websockets, so the check is explicit here."""

from __future__ import annotations

from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def normalize_origin(origin: str) -> str | None:
    """`scheme://host:port`, lower-cased, default port made explicit; None if it is no origin
    (`null` from a sandboxed frame or a file:// page, or garbage)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}"


def own_origins(host_header: str) -> set[str]:
    """The origins a page served by this service has: its Host with http or https (behind a
    TLS-terminating proxy the service sees http while the page is https)."""
    return {o for o in (normalize_origin(f"{s}://{host_header}") for s in ("http", "https")) if o}


def origin_allowed(origin: str | None, host_header: str | None, allowed: frozenset[str]) -> bool:
    """No Origin: not a browser (curl, the websockets library), which no web page can drive,
    so allowed (the token still applies). Otherwise it must be the service's own origin or
    one of `allowed` (already normalized)."""
    if origin is None:
        return True
    normal = normalize_origin(origin)
    if normal is None:
        return False
    return normal in allowed or (host_header is not None and normal in own_origins(host_header))
