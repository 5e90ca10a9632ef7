"""The FastAPI application: ingest, queries, status, the websocket hub, and the dashboard at /."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import plotly
import fastapi_offline
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from api import (
    alert_routes,
    clock_routes,
    corrections_routes,
    dashboard_routes,
    errors,
    http_metrics,
    ingest_routes,
    lag_routes,
    membership_routes,
    query_routes,
    status_routes,
    table_routes,
    ws_routes,
)
from api import cdc_routes, pattern_definitions, pattern_routes, reprocess_routes, text_guard
from api.audit import routes as audit_routes
from api.audit.middleware import AuditMiddleware
from api.context import ApiContext
from api.corrections_routes import CorrectionsFeed
from api.feeds import FeedRegistry, PipelineFeed
from api.single_params import no_repeated_single_params
from api.security import openapi as security_openapi
from api.security.headers import DASHBOARD_HEADERS
from api.security.middleware import SecurityMiddleware
from api.ws_hub import Hub, HubConfig
from ingest.log import LogUnavailable
from lag.feed import LagFeed
from store.health import query_health

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "dashboard" / "static"
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
# Swagger UI (5.x, which reads OpenAPI 3.1) for /docs, from the installed fastapi-offline
# package's assets (no CDN).
SWAGGER_UI_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
_SWAGGER_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}
_ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}


def create_app(ctx: ApiContext, *, feeds: Iterable = (), hub_config: HubConfig | None = None) -> FastAPI:
    """`feeds`: broadcast feeds for the websocket (objects with `topic` and `poll()`); each
    replaces the built-in feed of its topic (pipeline, corrections, lag). With ctx.alerts, the
    alert routes and the `alerts` feed are added."""
    # The Spark query's health and the lag feed come from the stores the pipeline and sampler write.
    query = partial(query_health, ctx.health, ctx.pipeline_name) if ctx.health is not None else None
    built_in = [PipelineFeed(ctx.store, ctx.log, ctx.catalog, ctx.pipeline_name, ctx.clock, query_health=query,
                             cdc_status=lambda: [f.status() for f in ctx.cdc or ()]),
                CorrectionsFeed(ctx.store, switched=ctx.reprocess.definitions.switched_corrections
                                if ctx.reprocess is not None else None)]
    if ctx.lag is not None:
        built_in.append(LagFeed(ctx.lag))
    if ctx.alerts is not None:
        built_in.append(alert_routes.AlertsFeed(ctx.alerts.store))
    given = list(feeds)
    topics = {feed.topic for feed in given}
    registry = FeedRegistry([feed for feed in built_in if feed.topic not in topics] + given)
    hub = Hub(ctx.store, ctx.clock, hub_config or HubConfig(max_points=ctx.query_max_points), list(registry),
              point_cache=ctx.point_cache, workers=ctx.snapshot_workers,
              # After a switch, subscriptions are resolved again against the served definitions,
              # read again at once (api/served_catalog.py).
              resolve=partial(ws_routes.served_query, ctx),
              on_switch=lambda: ctx.served.refresh() if ctx.served is not None else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if ctx.columnar_ingest:  # before the first request, not during it
            await run_in_threadpool(ingest_routes.warm_columnar_path)
        if ctx.ingest_workers is not None:
            await ctx.ingest_workers.start()
        if ctx.point_warmer is not None:
            ctx.point_warmer.start()
        yield
        if ctx.ingest_workers is not None:
            await ctx.ingest_workers.stop()
        if ctx.point_warmer is not None:
            ctx.point_warmer.stop()  # before the hub stops the workers it may be waiting on
        hub.stop()

    app = FastAPI(
        title="Sketchboard",
        version="1",
        description="Event-time windowed metrics from mergeable sketches. Send events, query series;"
        " live updates over WS /api/v1/ws (see docs/websocket.md for the protocol).",
        lifespan=lifespan,
        dependencies=[Depends(no_repeated_single_params)],
        # FastAPI's /docs and /redoc load their scripts from a CDN (cdn.jsdelivr.net, a floating
        # version, no SRI) with no CSP, on the origin whose sessionStorage holds the dashboard's
        # token: /docs is served below from local assets under the dashboard's CSP instead.
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(LogUnavailable)
    def log_unavailable(request: Request, exc: LogUnavailable) -> JSONResponse:
        # Any route reading the log (stream offsets, pipeline status) while Kafka is unreachable:
        # the service is unavailable for now, not broken.
        return JSONResponse({"detail": f"the log is unavailable: {exc}"}, status_code=503)

    # Added before CORS, so CORS wraps it: a preflight (which never carries a token) is answered
    # by CORS when cors_origins is set; without it there are no CORS headers at all.
    if ctx.audit is not None:  # inside the security middleware: it reads the token that one found
        app.add_middleware(AuditMiddleware, store=ctx.audit, clock=ctx.clock)
        app.include_router(audit_routes.router(ctx.audit))
    if ctx.pattern_definitions is not None:  # ctx.catalog follows the patterns defined through the API
        pattern_definitions.follow(ctx)
        app.add_middleware(pattern_definitions.FollowPatternDefinitions, definitions=ctx.pattern_definitions)
    app.add_middleware(text_guard.NulGuard)  # inside the security middleware: a 401 comes first
    app.add_middleware(SecurityMiddleware, config=ctx.security)
    if ctx.security.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(ctx.security.cors_origins),
                           allow_methods=["GET", "POST", "PUT", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    app.include_router(ingest_routes.router(ctx))
    app.include_router(query_routes.router(ctx))
    app.include_router(status_routes.router(ctx))
    app.include_router(ws_routes.router(ctx, hub))
    app.include_router(lag_routes.router(ctx))
    http_metrics.install(app)
    errors.install(app)
    app.include_router(membership_routes.router(ctx))
    app.include_router(corrections_routes.router(ctx))
    app.include_router(clock_routes.router(ctx))
    app.include_router(table_routes.router(ctx))
    app.include_router(cdc_routes.router(ctx))
    app.include_router(pattern_routes.router(ctx))
    if ctx.alerts is not None:
        app.include_router(alert_routes.router(ctx.alerts))
    if ctx.dashboards is not None:
        app.include_router(dashboard_routes.router(ctx.dashboards))
    if ctx.reprocess is not None:
        app.include_router(reprocess_routes.router(ctx.reprocess))

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(DASHBOARD_DIR / "index.html", media_type="text/html",
                            headers={"Cache-Control": "no-cache", **DASHBOARD_HEADERS})

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        # Served from the installed plotly package: the dashboard works with no internet.
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=86400", **DASHBOARD_HEADERS})

    @app.get("/docs", include_in_schema=False)
    def api_docs() -> FileResponse:
        return FileResponse(DASHBOARD_DIR / "docs.html", media_type="text/html",
                            headers={"Cache-Control": "no-cache", **DASHBOARD_HEADERS})

    @app.get("/static/swagger/{name}", include_in_schema=False)
    def swagger_asset(name: str) -> FileResponse:
        if name not in _SWAGGER_ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(SWAGGER_UI_DIR / name, media_type=_SWAGGER_ASSETS[name],
                            headers={"Cache-Control": "max-age=86400", **DASHBOARD_HEADERS})

    @app.get("/static/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        path = DASHBOARD_DIR / name
        if "/" in name or name.startswith(".") or path.suffix not in _ASSET_TYPES or not path.is_file():
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(path, media_type=_ASSET_TYPES[path.suffix],
                            headers={"Cache-Control": "no-cache", **DASHBOARD_HEADERS})

    base_openapi = app.openapi

    def openapi() -> dict:
        # FastAPI caches the document; the security part (401/403/415, scopes) and the NUL guard's
        # 400 are added once.
        doc = base_openapi()
        if not getattr(app.state, "security_documented", False):
            security_openapi.document(doc, ctx.security.public_paths)
            text_guard.document(doc)
            app.state.security_documented = True
        return doc

    app.openapi = openapi

    app.state.ctx = ctx
    app.state.hub = hub
    return app
