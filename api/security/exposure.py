"""Whether a bind address is reachable from other machines, and what to say when the service
would be exposed without tokens. Pure."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`. Anything else, names included, may be reachable from
    elsewhere (0.0.0.0 and :: are every interface)."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_error(host: str, token_count: int) -> str | None:
    if is_loopback(host) or token_count > 0:
        return None
    return (f"refusing to listen on {host} without API tokens: anyone who reaches the port could write events"
            " and change alert rules. Create one with `sketchboard token create NAME --scope admin` (it prints"
            " the token once; clients send it as `Authorization: Bearer <token>`), or listen on 127.0.0.1.")


def host_header_is_loopback(host_header: str | None) -> bool:
    """The Host a request names (`127.0.0.1:8000`, `localhost`, `[::1]:8000`) is a loopback one.
    An open service answers only those: a page on evil.example whose name was re-pointed at
    127.0.0.1 (DNS rebinding) is same-origin in the browser's eyes, so neither the Origin check
    nor the content types would stop it; its requests still say `Host: evil.example`."""
    if not host_header:
        return False
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return is_loopback(host)
