"""Dashboards as the API serves them: the store's (provisioned and saved), checked against the
catalog on the way in; and, while there is none at all, one generated from the catalog so a
fresh configuration opens on its own metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from catalog import Catalog
from dashboard.model import Dashboard, DashboardError, definition, generated_dashboards, parse_dashboard
from store.dashboards import DashboardConflict, DashboardStore, StoredDashboard
from store.rollup import DEFAULT_MAX_POINTS

GENERATED = "generated"  # the source of the dashboard made from the catalog (not stored)
GENERATED_NAME = "metrics"


class DashboardService:
    def __init__(self, catalog: Catalog, store: DashboardStore, clock: Callable[[], float] = time.time, *,
                 max_points: int | None = DEFAULT_MAX_POINTS):
        self.catalog, self.store, self.clock = catalog, store, clock
        self.max_points = max_points  # the query's limit (settings' query_max_points): what a panel may ask

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def sync_files(self, dashboards: Mapping[str, Dashboard]) -> None:
        self.store.sync_files({name: definition(d) for name, d in dashboards.items()}, now_ms=self.now_ms())

    def generated(self) -> list[StoredDashboard]:
        """The generated pages (more than one when the catalog has more metrics than a dashboard's panels)."""
        return [StoredDashboard(d.name, definition(d), GENERATED, 0, 0)
                for d in generated_dashboards(self.catalog, GENERATED_NAME)]

    def dashboards(self) -> list[StoredDashboard]:
        return self.store.dashboards() or self.generated()

    def dashboard(self, name: str) -> StoredDashboard | None:
        found = self.store.dashboard(name)
        if found is None and not self.store.dashboards():
            return next((d for d in self.generated() if d.name == name), None)
        return found

    def create(self, data: Any) -> StoredDashboard:
        dashboard = parse_dashboard(data, self.catalog, max_points=self.max_points)
        return self.store.create(dashboard.name, definition(dashboard), now_ms=self.now_ms())

    def replace(self, name: str, data: Any, expected_ms: int | None = None) -> StoredDashboard | None:
        """`expected_ms`: the version (`updated_ms`) the writer edited, refused when stale; None overwrites."""
        dashboard = parse_dashboard(data, self.catalog, max_points=self.max_points)
        if dashboard.name != name:
            raise DashboardError("name", f"{dashboard.name!r} is not the path's {name!r} (duplicate to rename)")
        if self.store.dashboard(name) is None and self.dashboard(name) is not None:
            # Saving the generated dashboard keeps it: from then on it is an ordinary saved one.
            return self.store.create(name, definition(dashboard), now_ms=self.now_ms())
        return self.store.replace(name, definition(dashboard), now_ms=self.now_ms(), expected_ms=expected_ms)

    def duplicate(self, name: str, new_name: str, title: str | None) -> StoredDashboard | None:
        """A saved copy (editable) of any dashboard, provisioned and generated ones included."""
        source = self.dashboard(name)
        if source is None:
            return None
        data = {**source.definition, "name": new_name}
        if title is not None:
            data["title"] = title
        return self.create(data)

    def delete(self, name: str, expected_ms: int | None = None) -> bool:
        if self.store.dashboard(name) is None and self.dashboard(name) is not None:
            raise DashboardConflict(f"dashboard {name!r} is generated from the catalog while there is no other;"
                                    " it goes away by itself once one is saved")
        return self.store.delete(name, expected_ms=expected_ms)

