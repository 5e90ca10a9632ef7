"""Patterns defined through the API, and the API's catalog following them (issue 24).

Patterns come from two places: the configuration (provisioned: read-only here, the file is their
source of truth) and `/api/v1/patterns` (stored in the store: store/pattern_definitions.py). A
pattern posted is checked as one in the file (catalog/defined_patterns.py: the same reasons),
with a name no other pattern, provisioned or stored, has.

The catalog every route reads (`ctx.catalog`) is the configured one with the stored patterns
added, so each pattern's `<pattern>_matches` stream and metrics are queryable, listed among the
dashboard's metrics and usable by alert rules. A change made through this replica is followed at
once; one made through another replica within `refresh_s` (the store's change counter is read
at most that often, on a request: one row), so no background thread is needed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from starlette.concurrency import run_in_threadpool

from catalog import Catalog
from catalog.defined_patterns import PatternInvalid, Skipped, catalog_with_patterns, check_pattern
from ingest.events import EventValidator
from patterns.plan import compile_pattern
from store.pattern_definitions import PatternConflict, PatternDefinitionStore, StoredPattern

logger = logging.getLogger("sketchboard.patterns")


class PatternReadOnly(PatternConflict):
    """A provisioned pattern: the configuration declares it, the API may not change it."""


class PatternDefinitions:
    def __init__(self, configured: Catalog, store: PatternDefinitionStore, *, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self.configured, self.store, self.refresh_s = configured, store, refresh_s
        self.clock, self.monotonic = clock, monotonic
        # Called with the new catalog after each change (the ApiContext, the alert and dashboard services).
        self.listeners: list[Callable[[Catalog], None]] = []
        self.catalog = configured
        self.stored: dict[str, StoredPattern] = {}
        self.skipped: list[Skipped] = []  # stored patterns the configuration no longer accepts
        self._version: int | None = None
        self._checked = float("-inf")
        self._lock = threading.Lock()  # one change or reload at a time
        self.refresh(force=True)

    @property
    def provisioned(self) -> set[str]:
        return {p.name for p in self.configured.patterns}

    # -- following the store

    def due(self) -> bool:
        return self.monotonic() - self._checked >= self.refresh_s

    def refresh(self, *, force: bool = False) -> Catalog:
        """Reload the stored patterns when the store's counter moved (read at most every
        refresh_s unless forced); the listeners get the new catalog."""
        with self._lock:
            if not force and not self.due():
                return self.catalog
            self._checked = self.monotonic()
            if self.store.version() == self._version:
                return self.catalog
            version, stored = self.store.patterns()
            catalog, skipped = catalog_with_patterns(self.configured, [p.definition for p in stored],
                                                     {p.name: p.version for p in stored})
            for s in skipped:
                if s not in self.skipped:
                    logger.warning("pattern %r stored through the API is left out: the configuration no longer"
                                   " accepts it: %s", s.name, s.reason)
            self._version, self.stored, self.skipped = version, {p.name: p for p in stored}, skipped
            self.catalog = catalog
        for listener in self.listeners:
            listener(catalog)
        return catalog

    # -- changes (each followed at once by this replica)

    def _check(self, name: str | None, data: Mapping) -> dict:
        others = [p for p in self.catalog.patterns if p.name not in self.provisioned and p.name != name]
        pattern = check_pattern(self.configured, others, data)
        try:
            compile_pattern(pattern, self.configured)
        except (ValueError, KeyError) as exc:  # the checks above should have said it; never a 500
            raise PatternInvalid(f"pattern: {exc}", "pattern") from None
        return pattern.model_dump(mode="json", exclude_defaults=True)

    def create(self, data: Mapping) -> StoredPattern:
        name = data.get("name") if isinstance(data, Mapping) else None
        if isinstance(name, str) and name in self.provisioned:
            raise PatternReadOnly(f"pattern {name!r} is declared in the configuration (provisioned, read-only"
                                  " through the API): pick another name")
        self.refresh(force=True)
        if isinstance(name, str) and name in self.stored:
            raise PatternConflict(f"a pattern named {name!r} already exists; PUT /api/v1/patterns/{name} replaces it")
        declared = self._check(None, data)
        try:
            return self.store.create(declared["name"], declared, now_ms=int(self.clock() * 1000))
        finally:
            self.refresh(force=True)

    def replace(self, name: str, data: Mapping) -> StoredPattern | None:
        """None: no such pattern."""
        self._refuse_provisioned(name)
        self.refresh(force=True)
        if name not in self.stored:
            return None
        if isinstance(data, Mapping) and data.get("name", name) != name:
            raise PatternInvalid(f"name: {data.get('name')!r} is not the path's {name!r} (a pattern is renamed by"
                                 " creating the new one and deleting the old)", "name")
        declared = self._check(name, {**data, "name": name})
        if declared == self.stored[name].definition:
            return self.stored[name]  # the same declaration again (a tool re-applying it): nothing to start over
        try:
            return self.store.replace(name, declared, now_ms=int(self.clock() * 1000))
        finally:
            self.refresh(force=True)

    def delete(self, name: str) -> bool:
        self._refuse_provisioned(name)
        try:
            return self.store.delete(name)
        finally:
            self.refresh(force=True)

    def _refuse_provisioned(self, name: str) -> None:
        if name in self.provisioned:
            raise PatternReadOnly(f"pattern {name!r} is declared in the configuration (provisioned): change it"
                                  " there, the file is its source of truth")


class FollowPatternDefinitions:
    """ASGI middleware: before a request, when refresh_s has passed since the last look, read the
    store's counter (in a worker thread) so a change made through another replica is followed."""

    def __init__(self, app, definitions: PatternDefinitions):
        self.app, self.definitions = app, definitions

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and self.definitions.due():
            try:
                await run_in_threadpool(self.definitions.refresh)
            except Exception as exc:  # the store away: the request goes on with the catalog it has
                logger.warning("the patterns defined through the API could not be read: %s", exc)
        await self.app(scope, receive, send)


def follow(ctx) -> None:
    """Keep the API's catalog (ctx.catalog, the ingest validators, the alert and dashboard
    services) the configured one with the stored patterns, now and after every change."""
    definitions: PatternDefinitions = ctx.pattern_definitions

    def use(catalog: Catalog) -> None:
        ctx.catalog = catalog
        for name, stream in catalog.streams.items():
            if name not in ctx.validators:
                ctx.validators[name] = EventValidator(stream)
        if ctx.alerts is not None and hasattr(ctx.alerts, "use_catalog"):
            ctx.alerts.use_catalog(catalog)
        if ctx.dashboards is not None:
            ctx.dashboards.catalog = catalog

    use.ctx = ctx  # type: ignore[attr-defined]  (one listener per context, however many apps it serves)
    if not any(getattr(listener, "ctx", None) is ctx for listener in definitions.listeners):
        definitions.listeners.append(use)
    use(definitions.catalog)
