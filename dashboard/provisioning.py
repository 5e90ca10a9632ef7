"""The dashboards folder (`config/dashboards/` beside the streams file by default): one
dashboard per YAML file, loaded at start. Provisioned dashboards are read-only through the API
(the folder is their source of truth), as the alert rules of the alerts file are."""

from __future__ import annotations

from pathlib import Path

from catalog import Catalog, ConfigError
from catalog.loader import read_yaml
from dashboard.model import Dashboard, DashboardError, parse_dashboard


def load_dashboards_dir(folder: Path, catalog: Catalog, *, max_points: int | None = None) -> dict[str, Dashboard]:
    """Every `*.yaml`/`*.yml` file of the folder, validated; a file's `name` defaults to its stem.
    A problem raises DashboardError naming the file and the field."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DashboardError(None, f"{folder}: not a folder of dashboard YAML files")
    out: dict[str, Dashboard] = {}
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files:
        dashboard = load_dashboard_file(path, catalog, max_points=max_points)
        if dashboard.name in out:
            raise DashboardError(None, f"{path}: a second dashboard named {dashboard.name!r}")
        out[dashboard.name] = dashboard
    return out


def load_dashboard_file(path: Path, catalog: Catalog, *, max_points: int | None = None) -> Dashboard:
    try:  # read as every YAML file of the service is: a key written twice is refused, with its line
        document = read_yaml(path, "dashboard file").value
    except ConfigError as exc:
        raise DashboardError(None, str(exc)) from None
    if not isinstance(document, dict):
        raise DashboardError(None, f"{path}: expected a mapping (name, title, range, refresh, panels)")
    try:
        return parse_dashboard({"name": path.stem, **document}, catalog, max_points=max_points)
    except DashboardError as exc:
        raise DashboardError(None, f"{path}: {exc}") from None
