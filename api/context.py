"""What the API's routes need, built once by the composition root (or by a test)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from alerts.evaluator import Evaluation
from alerts.service import LoadedRule
from api.security.config import SecurityConfig
from catalog import Catalog
from dashboard.service import DashboardService
from ingest.events import EventValidator
from ingest.log import EventLog
from lag.model import PipelineLag
from store import PaneStore
from store.alerts import SqliteAlertStore, StoredRule
from store.audit import AuditEntry
from store.consumers import ConsumerRegistry
from store.health import QueryHealth
from store.idempotency import Decision
from store.lag import LagStore
from store.lease import LeaseRow
from store.lease_rules import LeaseTracker
from store.point_cache import PointCache

# What the routes use of each optional part, so that a test (or another backend) can hand in
# anything that answers these, and a reader sees what the API depends on. The composition root
# passes lag.report.LagMonitor, store.health.HealthStore, alerts.service.AlertService,
# store.audit.AuditStore, store.idempotency.IdempotencyStore and store.lease.Leadership.


class LagView(Protocol):
    store: LagStore
    pipeline: str
    window: int
    interval_s: float
    registry: ConsumerRegistry | None  # None: no fan-out

    @property
    def window_ms(self) -> int: ...
    @property
    def sampler_error(self) -> str | None: ...
    def report(self, stream: str | None = None, pipeline: str | None = None) -> PipelineLag: ...
    def message(self, stream: str | None = None) -> dict: ...
    def consumers(self, stream: str | None = None) -> list[dict]: ...


class HealthView(Protocol):
    def state(self, pipeline: str) -> QueryHealth | None: ...
    def store_errors(self, pipeline: str) -> dict | None: ...


class AlertsView(Protocol):
    store: SqliteAlertStore
    notifiers: list  # alerts.webhook.WebhookNotifier: delivery counters for /metrics

    def now_ms(self) -> int: ...
    def rules(self) -> list[LoadedRule]: ...
    def create(self, definition: Mapping) -> StoredRule: ...
    def replace(self, name: str, definition: Mapping) -> StoredRule | None: ...
    def delete(self, name: str) -> bool: ...
    def silence(self, name: str, duration_ms: int | None) -> StoredRule | None: ...
    def evaluate_due(self, now_ms: int | None = None) -> list[Evaluation]: ...
    def with_corrections_since(self, history: list[dict]) -> list[dict]: ...
    def stop(self, timeout_s: float = 5.0) -> None: ...


class AuditLog(Protocol):
    def record(self, at_ms: int, actor: str, action: str, **details: Any) -> None: ...
    def entries(self, *, limit: int = 100, after_id: int | None = None) -> list[AuditEntry]: ...


class IdempotencyKeys(Protocol):
    def claim(self, scope: str, key: str, fingerprint: str, now_ms: int) -> Decision: ...
    def complete(self, scope: str, key: str, status: int, answer: dict, token: str | None = None) -> bool: ...
    def release(self, scope: str, key: str, token: str | None = None) -> bool: ...


class LeadershipView(Protocol):
    me: str
    last_error: str | None
    tracker: LeaseTracker

    def leading(self) -> bool: ...
    def holder(self) -> LeaseRow: ...
    def start(self) -> None: ...
    def stop(self, timeout_s: float = 5.0, *, release: bool = True) -> None: ...


@dataclass
class ApiContext:
    catalog: Catalog
    log: EventLog
    store: PaneStore
    pipeline_name: str = "main"
    max_body_bytes: int = 10 * 1024 * 1024
    max_events_per_request: int = 100_000
    columnar_ingest: bool = True  # ingest/columnar.py for plain, valid bodies
    # Request bodies parsed, checked and appended at once (api/ingest_routes.py); None: as many as
    # anyio's worker threads allow.
    ingest_slots: int | None = None
    # The columnar path in worker processes (api.ingest_workers.IngestWorkers); None: in threads here.
    ingest_workers: Any = None
    query_max_points: int = 11_000
    clock: Callable[[], float] = time.time
    validators: dict[str, EventValidator] = field(default_factory=dict)
    # Consumer lag (lag.report.LagMonitor) and Spark query health (store.health.SqliteHealthStore);
    # None where not wired (then /api/v1/lag answers 503 and the pipeline's health is null).
    lag: LagView | None = None
    health: HealthView | None = None
    # Alert rules and their evaluation (alerts.service.AlertService); None: no /api/v1/alerts routes.
    alerts: AlertsView | None = None
    # Final points of sketch stats kept between queries and websocket pushes (store/point_cache.py).
    point_cache: PointCache = field(default_factory=PointCache)
    # Websocket snapshots computed in worker processes (api.ws_workers.SnapshotWorkers); None: in this one.
    snapshot_workers: Any = None
    # The declared views' points computed ahead of their first query (api.point_warmer.PointWarmer); None: not.
    point_warmer: Any = None
    # The audit log (store.audit.AuditStore); None: changes are not recorded, no /api/v1/audit.
    audit: AuditLog | None = None
    # Dashboards (dashboard.service.DashboardService); None: no /api/v1/dashboards routes.
    dashboards: DashboardService | None = None
    # Answers to POSTs with an Idempotency-Key (store.idempotency.IdempotencyStore); None: the
    # header is accepted and ignored (retries append again).
    idempotency: IdempotencyKeys | None = None
    # The leader lease of this API replica (store.lease.Leadership): who runs the alert evaluator,
    # notifier and lag sampler; None: not wired (one process, nothing to show).
    leadership: LeadershipView | None = None
    # Definition versions and reprocessing runs (aggregates.reprocess.ReprocessService); None: no
    # /api/v1/reprocess routes, no `definitions` in /api/v1/pipeline.
    reprocess: Any = None
    # Patterns defined through the API (api.pattern_definitions.PatternDefinitions): they keep
    # `catalog` current; None: the configuration's patterns only, read-only routes.
    pattern_definitions: Any = None
    # Change data capture followers (ingest.cdc.follower.CdcFollower), one per CDC-fed table.
    cdc: Any = None
    # Tokens, allowed websocket origins, CORS (api/security/); the default is open, as on loopback.
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # The catalog the served output was built with (api.served_catalog.ServedCatalog): what reads
    # of the root go by; None: the configured catalog (no stored definitions to follow).
    served: Any = None

    def __post_init__(self) -> None:
        for name, stream in self.catalog.streams.items():
            self.validators.setdefault(name, EventValidator(stream))

    def served_catalog(self) -> Catalog:
        """The catalog to read the served output (the root) by: the configured one, with each stream
        the pipeline still computes as stored declared as stored (docs/reprocessing.md). Ingest
        goes by `catalog` (new events follow the configuration)."""
        return self.catalog if self.served is None else self.served.of(self.catalog)

    def served_with_pending(self) -> tuple[Catalog, Mapping[str, tuple[str, dict]]]:
        """`served_catalog()`, and the streams whose configured definition waits for a switch:
        {stream: (the stored version served, its stored declaration)}."""
        return (self.catalog, {}) if self.served is None else self.served.with_pending(self.catalog)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)
