"""The FastAPI application: ingest, queries, status, and the dashboard at /."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from api import corrections_routes, ingest_routes, query_routes, status_routes
from api.context import ApiContext

_INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>Sketchboard</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 48rem; margin: 3rem auto">
<h1>Sketchboard</h1>
<p>The API is up. The live dashboard comes with its own issue; meanwhile:</p>
<ul>
<li><a href="/docs">API documentation (OpenAPI)</a></li>
<li><a href="/api/v1/metrics">/api/v1/metrics</a> &middot; <a href="/api/v1/streams">/api/v1/streams</a></li>
<li><a href="/api/v1/query?metric=latency&amp;stat=p99&amp;from=now-15m">/api/v1/query?metric=latency&amp;stat=p99&amp;from=now-15m</a></li>
<li><a href="/api/v1/pipeline">/api/v1/pipeline</a> &middot; <a href="/metrics">/metrics</a></li>
</ul></body></html>"""


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(
        title="Sketchboard",
        version="1",
        description="Event-time windowed metrics from mergeable sketches. Send events, query series.",
    )
    app.include_router(ingest_routes.router(ctx))
    app.include_router(query_routes.router(ctx))
    app.include_router(status_routes.router(ctx))
    app.include_router(corrections_routes.router(ctx))

    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(_INDEX)

    app.state.ctx = ctx
    return app
