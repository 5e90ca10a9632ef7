"""Which scope each route needs. Pure: one table read by the middleware and by the OpenAPI
document, so what is enforced and what is documented cannot drift apart."""

from __future__ import annotations

from api.security.scopes import Scope

# Open without a token: the liveness and readiness probes (a load balancer or an orchestrator
# has no token), the dashboard's page and static assets (they hold no data and must load so the
# page can ask for a token) and the API's own description.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
OPEN_PREFIXES = ("/static/",)
INGEST = {("POST", "/api/v1/events")}
# Changelog tables' writes (POST rows, DELETE a key): a producer's, like events.
INGEST_PREFIXES = ("/api/v1/tables/",)
INGEST_METHODS = frozenset({"POST", "DELETE"})
ADMIN_READS = frozenset({"/api/v1/audit"})  # who changed what, from where: for operators only
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def required_scope(method: str, path: str, public: frozenset[str] = frozenset()) -> Scope | None:
    """None: open. Anything not listed as open needs a token, including paths that do not
    exist (a 404 should not tell an anonymous caller which routes there are). `public`: GET
    paths the operator made open (/metrics with metrics_public, for a scraper without a token)."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or (method in READ_METHODS and path in public):
        return None
    if (method, path) in INGEST or (method in INGEST_METHODS and path.startswith(INGEST_PREFIXES)):
        return Scope.INGEST
    if path in ADMIN_READS:
        return Scope.ADMIN
    if method in READ_METHODS:
        return Scope.READ
    return Scope.ADMIN


def websocket_scope(path: str) -> Scope:
    return Scope.READ
