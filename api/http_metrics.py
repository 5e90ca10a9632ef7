"""HTTP request metrics for /metrics: a pure ASGI middleware timing every HTTP request by
method (the standard ones; any other is "other"), route template (not the raw path: bounded
label values) and status code.

The registry is process-level (the counts accumulate over the process's life); /metrics
exposes it next to the values it reads from the store on each scrape.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REQUEST_SECONDS = Histogram(
    "sketchboard_http_request_duration_seconds",
    "HTTP request duration by method, route template and status code",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)

UNMATCHED = "<unmatched>"
# The method is the client's to choose (any token, unauthenticated): a label value per made-up
# method would make a new series each. RFC 9110's methods and PATCH are kept; others are "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
OTHER_METHOD = "other"


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER_METHOD


class HttpMetricsMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # websockets and lifespan pass through untimed
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            REQUEST_SECONDS.labels(method_label(scope.get("method", "")), template, str(status["code"])).observe(
                time.perf_counter() - started)


def install(app) -> None:
    app.add_middleware(HttpMetricsMiddleware)
