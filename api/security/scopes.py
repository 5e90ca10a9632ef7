"""Token scopes and what each grants. Pure."""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    INGEST = "ingest"  # POST /api/v1/events
    READ = "read"  # queries, status, the websocket, /metrics
    ADMIN = "admin"  # alert rules, silences and every other change


# admin implies the others: an operator holding the admin token should not need a second one
# to look at what they changed. ingest and read stay separate: a producer's token (often copied
# onto many hosts) must not read the metrics, and a dashboard's token must not write events.
_IMPLIES = {Scope.ADMIN: frozenset(Scope), Scope.READ: frozenset({Scope.READ}),
            Scope.INGEST: frozenset({Scope.INGEST})}


def parse_scopes(values) -> frozenset[Scope]:
    """Scope names, each possibly comma-separated ("ingest,read"); ValueError names the bad one."""
    out: set[Scope] = set()
    for value in values:
        for name in str(value).split(","):
            name = name.strip().lower()
            if not name:
                continue
            try:
                out.add(Scope(name))
            except ValueError:
                raise ValueError(f"unknown scope {name!r} (expected one of: {', '.join(s.value for s in Scope)})") from None
    if not out:
        raise ValueError(f"at least one scope is needed ({', '.join(s.value for s in Scope)})")
    return frozenset(out)


def grants(held: frozenset[Scope] | set[Scope], needed: Scope) -> bool:
    return any(needed in _IMPLIES[scope] for scope in held)
