"""Fixtures for the HTTP API: the real demo catalog, a real SQLite log and pane store in a
temporary directory, a fake clock, and a TestClient over create_app(ctx). No Spark."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

with warnings.catch_warnings():
    # Starlette 1.x warns that its TestClient's httpx transport is deprecated; it still works.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from api.app import create_app
from api.context import ApiContext
from catalog import load_catalog
from ingest.log import SqliteEventLog
from store import SqlitePaneStore
from store.tiers import catalog_layouts
from tests.support.clock import NOW_S, FakeClock

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "config" / "streams.yaml"

NOW_MS = int(NOW_S * 1000)

MAX_BODY_BYTES = 64 * 1024
MAX_EVENTS = 1000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@contextmanager
def context(tmp_path: Path, clock, catalog=None, store=None):
    """An ApiContext over a real SQLite log and a pane store: `store` (its owner closes it), else a
    SQLite one in tmp_path (closed on exit)."""
    catalog = catalog or load_catalog(CONFIG)
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")  # durability is not under test
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    owned = store is None
    if owned:
        store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    store.configure_tiers(catalog_layouts(catalog), now_ms=int(clock() * 1000))  # as the pipeline does at start
    try:
        yield ApiContext(
            catalog=catalog,
            log=log,
            store=store,
            max_body_bytes=MAX_BODY_BYTES,
            max_events_per_request=MAX_EVENTS,
            clock=clock,
        )
    finally:
        if owned:
            store.close()
        log.close()


@pytest.fixture
def pane_store():
    """The API's pane store; None: context() makes a SQLite one. A module whose tests hold on every
    backend overrides this fixture with `store_backend.create()` (tests/store_backends.py), which
    runs each of its tests on SQLite and on PostgreSQL."""
    return None


@pytest.fixture
def ctx(tmp_path, catalog, clock, pane_store):
    with context(tmp_path, clock, catalog, pane_store) as c:
        yield c


@pytest.fixture
def client(ctx):
    with TestClient(create_app(ctx)) as c:
        yield c


@pytest.fixture
def now_ms(clock) -> int:
    return int(clock.now * 1000)


@pytest.fixture
def snapshot(ctx):
    """A callable returning everything a failed request must leave as it was: every
    stream's log offsets, and the store's progress, change feed and watermarks."""

    def take() -> dict:
        return {
            "log": {name: dict(ctx.log.offsets(name)) for name in ctx.catalog.streams},
            "progress": ctx.store.progress(ctx.pipeline_name),
            "changes": ctx.store.changes_since(0),
            "watermarks": ctx.store.watermarks(),
        }

    return take


@contextmanager
def wired(ctx: ApiContext, tmp_path: Path, clock):
    """ctx with everything `sketchboard api` wires: alert rules (AlertService), the lag monitor,
    the Spark-health store, the audit log, the idempotency keys and the dashboards, all beside the
    pane store's tables (its side_db(), as sketchboard/wiring.py opens them): one SQLite file, or
    one PostgreSQL schema when a module's `pane_store` is `store_backend`'s."""
    from alerts.service import AlertService
    from dashboard.service import DashboardService
    from alerts.source import StoreAlertData
    from lag.report import LagMonitor
    from lag.sampler import LagSampler
    from lag.sources import EventLogLagSource, StoreCommitted
    from store.alerts import SqliteAlertStore
    from store.audit import AuditStore
    from store.dashboards import DashboardStore
    from store.health import SqliteHealthStore
    from store.idempotency import IdempotencyStore
    from store.lag import SqliteLagStore

    alert_store = SqliteAlertStore(ctx.store.side_db())
    lag_store = SqliteLagStore(ctx.store.side_db())
    health = SqliteHealthStore(ctx.store.side_db())
    audit = AuditStore(ctx.store.side_db())
    idempotency = IdempotencyStore(ctx.store.side_db())
    dashboards = DashboardStore(ctx.store.side_db())
    source = EventLogLagSource(ctx.log)
    sampler = LagSampler(source, StoreCommitted(ctx.store, ctx.pipeline_name), lag_store,
                         pipeline=ctx.pipeline_name, streams=list(ctx.catalog.streams), interval_s=1.0, clock=clock)
    ctx.alerts = AlertService(ctx.catalog, alert_store, StoreAlertData(ctx.catalog, ctx.store), clock=clock)
    ctx.lag = LagMonitor(lag_store, ctx.pipeline_name,
                         lambda: [(n, p) for n in ctx.catalog.streams for p in source.end_offsets(n)],
                         window=3, interval_s=1.0, clock=clock, sampler=sampler)
    ctx.health = health
    ctx.audit = audit
    ctx.idempotency = idempotency
    ctx.dashboards = DashboardService(ctx.catalog, dashboards, clock)
    from aggregates.reprocess import ReprocessService
    from store.consumers import ConsumerRegistry
    from store.definitions import DefinitionStore

    definitions = DefinitionStore(ctx.store.side_db())
    registry = ConsumerRegistry(ctx.store.side_db())
    ctx.reprocess = ReprocessService(ctx.catalog, definitions, registry, ctx.log, clock=clock)  # runs not launched
    from api.pattern_definitions import PatternDefinitions
    from store.pattern_definitions import PatternDefinitionStore

    patterns = PatternDefinitionStore(ctx.store.side_db())
    ctx.pattern_definitions = PatternDefinitions(ctx.catalog, patterns, refresh_s=0, clock=clock)
    try:
        yield ctx
    finally:
        ctx.alerts, ctx.lag, ctx.health, ctx.audit, ctx.idempotency = None, None, None, None, None
        ctx.dashboards, ctx.reprocess, ctx.pattern_definitions = None, None, None
        for side in (alert_store, lag_store, health, audit, dashboards, definitions, registry, patterns):
            side.close()


@contextmanager
def wire(tmp_path: Path, clock):
    """context() and wired() in one: a fully wired ApiContext in tmp_path."""
    with context(tmp_path, clock) as c, wired(c, tmp_path, clock) as w:
        yield w


@pytest.fixture
def wired_ctx(ctx, tmp_path, clock):
    """ctx, fully wired (see wired()): for tests that must reach every route (the robustness
    tests and the OpenAPI fuzz test)."""
    with wired(ctx, tmp_path, clock) as w:
        yield w


@pytest.fixture
def state(wired_ctx, snapshot):
    """With wired_ctx, what a rejected request must leave as it was: the log and pane store
    (snapshot), the alert rules with their silences, the dashboards and the defined patterns."""
    return lambda: {**snapshot(), "rules": wired_ctx.alerts.store.rules(),
                    "dashboards": wired_ctx.dashboards.store.dashboards(),
                    "patterns": wired_ctx.pattern_definitions.store.patterns()}


@pytest.fixture
def wired_client(wired_ctx):
    # raise_server_exceptions=False: a 500 is what these tests look for, not a re-raised error.
    with TestClient(create_app(wired_ctx), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/receiver.py) for the alert tests' notifiers."""
    from tests.receiver import Receiver

    with Receiver() as rx:
        yield rx
