"""What the API's routes need, built once by the composition root (or by a test)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from catalog import Catalog
from ingest.events import EventValidator
from api.security.config import SecurityConfig
from ingest.log import EventLog
from store import PaneStore
from store.point_cache import PointCache


@dataclass
class ApiContext:
    catalog: Catalog
    log: EventLog
    store: PaneStore
    pipeline_name: str = "main"
    max_body_bytes: int = 10 * 1024 * 1024
    max_events_per_request: int = 100_000
    query_max_points: int = 11_000
    clock: Callable[[], float] = time.time
    validators: dict[str, EventValidator] = field(default_factory=dict)
    # Consumer lag (lag.report.LagMonitor) and Spark query health (store.health.SqliteHealthStore);
    # None where not wired (then /api/v1/lag answers 503 and the pipeline's health is null).
    lag: Any = None
    health: Any = None
    # Alert rules and their evaluation (alerts.service.AlertService); None: no /api/v1/alerts routes.
    alerts: Any = None
    # Final points of sketch stats kept between queries and websocket pushes (store/point_cache.py).
    point_cache: PointCache = field(default_factory=PointCache)
    # The audit log (store.audit.AuditStore); None: changes are not recorded, no /api/v1/audit.
    audit: Any = None
    # Dashboards (dashboard.service.DashboardService); None: no /api/v1/dashboards routes.
    dashboards: Any = None
    # Answers to POSTs with an Idempotency-Key (store.idempotency.IdempotencyStore); None: the
    # header is accepted and ignored (retries append again).
    idempotency: Any = None
    # The leader lease of this API replica (store.lease.Leadership): who runs the alert evaluator,
    # notifier and lag sampler; None: not wired (one process, nothing to show).
    leadership: Any = None
    # Tokens, allowed websocket origins, CORS (api/security/); the default is open, as on loopback.
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        for name, stream in self.catalog.streams.items():
            self.validators.setdefault(name, EventValidator(stream))

    def now_ms(self) -> int:
        return int(self.clock() * 1000)
