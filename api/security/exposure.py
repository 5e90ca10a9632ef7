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
