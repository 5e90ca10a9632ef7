"""A dashboard: a named list of panels over the catalog's metrics, with the time range and
refresh it opens with. Pure: the models (which are also the API's documented bodies) and the
checks against a catalog; the store keeps the validated JSON, the API and the YAML files
(dashboard/provisioning.py) both go through `parse_dashboard`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from catalog import Catalog
from catalog.durations import DurationMs
from ingest.events import unstorable

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
# Each panel is one websocket subscription; a connection may hold ws_max_subscriptions (32 by
# default), and the explorer chart takes one more.
MAX_PANELS = 24
# A panel kind is how the one series a panel subscribes to is drawn.
PanelKind = Literal["line", "area", "bar", "stat", "heatmap", "table"]
# "band": p50, p95 and p99 drawn as one band (the percentiles the page asks together).
BAND = "band"
BAND_STATS = ("p50", "p95", "p99")
READ_ONLY_FIELDS = ("source", "created_ms", "updated_ms")


class DashboardError(ValueError):
    """A dashboard that does not validate, naming the field (`panels[1].metric`) and why."""

    def __init__(self, field: str | None, reason: str):
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field


class Panel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field("", max_length=200, description="shown above the panel; empty: made from the query")
    metric: str = Field(min_length=1, max_length=200, description="a metric of GET /api/v1/metrics")
    stat: str = Field("count", min_length=1, max_length=16,
                      description="a stat the metric answers (its `stats` in GET /api/v1/metrics, pNN for any"
                                  " percentile), or 'band' for p50, p95 and p99 together")
    kind: PanelKind = Field("line", description="line, area (a band's fill), bar, stat (one value with a sparkline),"
                            " heatmap (the value's distribution over time, from the KLL sketches: value metrics"
                            " only) or table (the top groups by their latest value: needs a group_by)")
    group_by: list[str] = Field(default_factory=list, max_length=8, description="dimensions of the metric's stream")
    filters: dict[str, str] = Field(default_factory=dict, description="dimension -> value, all must match")
    window: DurationMs | None = Field(None, description="a window longer than the step (hopping/sliding); none: the step")
    step: DurationMs | None = Field(None, description="none: chosen from the dashboard's time range")


class Dashboard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="the dashboard's id in URLs: letters, digits, _ . -")
    title: str = Field("", max_length=200)
    description: str = Field("", max_length=2000)
    range: DurationMs = Field(3_600_000, gt=0, description="the time range it opens with: the last `range`")
    refresh: DurationMs | None = Field(5_000, description="how often a relative range moves on (points arrive"
                                       " live over the websocket in any case); none: the range stays still")
    panels: list[Panel] = Field(default_factory=list, max_length=MAX_PANELS)


# The longest range: a query reaches back to 1970 at most (query/model.py), so a range of a century
# could never be drawn either.
MAX_RANGE_MS = 50 * 365 * 86_400_000


def parse_dashboard(data: Any, catalog: Catalog, *, max_points: int | None = None) -> Dashboard:
    """A dashboard from JSON or YAML data, checked against the catalog; DashboardError says
    which field is wrong and why. `max_points`: the deployment's query_max_points, where a panel's
    step over the range is checked (None: not checked, as for a dashboard saved already)."""
    if not isinstance(data, dict):
        raise DashboardError(None, "a dashboard is an object (name, title, range, refresh, panels)")
    # What GET answers besides the definition: a dashboard read, changed and PUT back is accepted.
    data = {k: v for k, v in data.items() if k not in READ_ONLY_FIELDS}
    try:
        dashboard = Dashboard.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in first["loc"]).replace(".[", "[")
        raise DashboardError(field or None, first["msg"]) from None
    if dashboard.range > MAX_RANGE_MS:
        raise DashboardError("range", "longer than 50 years: its queries would reach before 1970")
    for index, panel in enumerate(dashboard.panels):
        check_panel(panel, catalog, f"panels[{index}]")
        if max_points is not None and panel.step is not None and _points(dashboard.range, panel.step) > max_points:
            raise DashboardError(f"panels[{index}].step", f"the dashboard's range holds {_points(dashboard.range, panel.step):,}"
                                 f" points of this step; a query answers at most {max_points:,} (a larger step, or none:"
                                 " chosen from the range)")
    return dashboard


def _points(range_ms: int, step_ms: int) -> int:
    """The most points a query of the last `range_ms` answers at `step_ms` (both ends aligned to the
    step, as query/model.py aligns them)."""
    return range_ms // step_ms + (2 if range_ms % step_ms else 1)


def check_panel(panel: Panel, catalog: Catalog, where: str) -> None:
    metric = catalog.metrics.get(panel.metric)
    if metric is None:
        raise DashboardError(f"{where}.metric", f"unknown metric {panel.metric!r}; metrics: {', '.join(catalog.metrics)}")
    stream = catalog.streams[metric.stream]
    if panel.stat == BAND:
        if not metric.value:
            raise DashboardError(f"{where}.stat", f"metric {metric.name!r} has no value field, so no percentile band")
        if panel.kind not in ("line", "area"):
            raise DashboardError(f"{where}.stat", "a band is drawn as a line or an area panel")
    else:
        try:
            metric.check_stat(panel.stat)
        except ValueError as exc:
            raise DashboardError(f"{where}.stat", str(exc)) from None
    if panel.kind == "heatmap" and not metric.value:
        raise DashboardError(f"{where}.kind", f"a heatmap shows a value's distribution; metric {metric.name!r} has no value")
    if panel.kind == "table" and not panel.group_by:
        raise DashboardError(f"{where}.group_by", "a table lists the top groups: name at least one dimension")
    for name in [*panel.group_by, *panel.filters]:
        if name not in stream.dimensions:
            field = "group_by" if name in panel.group_by else "filters"
            raise DashboardError(f"{where}.{field}", f"unknown dimension {name!r}; dimensions of stream"
                                 f" {stream.name!r}: {', '.join(stream.dimensions) or 'none'}")
    for name, value in panel.filters.items():  # as the query's filters (query/model.py): no label holds one
        if problem := unstorable(value):
            raise DashboardError(f"{where}.filters", f"{name}={value!r}: {problem}")
    if panel.step is not None and panel.step < stream.pane:
        raise DashboardError(f"{where}.step", f"below the stream's pane ({stream.pane} ms)")
    # As the panel's query refuses them (store/rollup.py): saved, such a panel could never be drawn.
    if panel.step is not None and panel.step % stream.pane:
        raise DashboardError(f"{where}.step", f"not a multiple of the stream's pane ({stream.pane} ms)")
    if panel.window is not None and panel.window < (panel.step or stream.pane):
        raise DashboardError(f"{where}.window", "shorter than the step")
    if panel.window is not None and panel.window % stream.pane:
        raise DashboardError(f"{where}.window", f"not a multiple of the stream's pane ({stream.pane} ms)")


def generated_dashboards(catalog: Catalog, name: str = "metrics") -> list[Dashboard]:
    """What a configuration with no dashboard opens with: one panel per metric of the catalog,
    the percentile band of a value, the rate of the others. A dashboard holds at most MAX_PANELS
    panels (one websocket subscription each), so a catalog with more metrics gets more pages:
    `metrics`, `metrics-2`, `metrics-3`... in catalog order, each titled with its page."""
    panels = []
    for metric in catalog.metrics.values():
        unit = f" ({metric.unit})" if metric.unit else ""
        if metric.value:
            panels.append(Panel(title=f"{metric.name} p50 · p95 · p99{unit}", metric=metric.name, stat=BAND, kind="area"))
        elif metric.first_seen:
            panels.append(Panel(title=f"{metric.name}: first seen", metric=metric.name, stat="first_seen", kind="bar"))
        else:
            panels.append(Panel(title=f"{metric.name} (/s)", metric=metric.name, stat="rate"))
    pages = [panels[i:i + MAX_PANELS] for i in range(0, len(panels), MAX_PANELS)] or [[]]
    return [Dashboard(name=name if n == 1 else f"{name}-{n}",
                      title="All metrics" if len(pages) == 1 else f"All metrics ({n}/{len(pages)})",
                      description="generated from the catalog: one panel per metric", panels=page)
            for n, page in enumerate(pages, start=1)]


def generated_dashboard(catalog: Catalog, name: str = "metrics") -> Dashboard:
    """The first page of generated_dashboards (all of it while the catalog has at most MAX_PANELS metrics)."""
    return generated_dashboards(catalog, name)[0]


def definition(dashboard: Dashboard) -> dict:
    """The JSON the store keeps and the API shows (durations as text, defaults spelled out)."""
    return dashboard.model_dump(mode="json")
