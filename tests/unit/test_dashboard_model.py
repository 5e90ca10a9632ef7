"""Dashboards' pure parts: a definition checked against a catalog with errors naming the field,
the dashboard generated from a catalog, the dashboards folder's files; and the page's pure
JavaScript (the heatmap's spreading of events between KLL quantiles, the automatic step) run
in Node when it is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from catalog import load_catalog
from catalog.loader import parse_catalog
from dashboard.model import MAX_PANELS, DashboardError, definition, generated_dashboard, generated_dashboards, parse_dashboard
from dashboard.provisioning import load_dashboards_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
SENSORS = load_catalog(REPO_ROOT / "tests" / "configs" / "sensors" / "streams.yaml")


def test_a_definition_is_checked_against_the_catalog_and_spelled_out():
    d = parse_dashboard({"name": "plant", "range": "6h", "refresh": None, "source": "api", "updated_ms": 1,
                         "panels": [{"metric": "reading_value", "stat": "p99.9", "group_by": ["site"],
                                     "filters": {"kind": "temp"}, "window": "1m", "step": "10s"}]}, SENSORS)
    out = definition(d)
    assert out["range"] == "6h" and out["refresh"] is None and "source" not in out  # what GET adds is ignored
    assert out["panels"][0] == {"title": "", "metric": "reading_value", "stat": "p99.9", "kind": "line",
                                "group_by": ["site"], "filters": {"kind": "temp"}, "window": "1m", "step": "10s"}


@pytest.mark.parametrize("panel, field, words", [
    ({"metric": "readings", "stat": "avg"}, "panels[0].stat", "no value field"),
    ({"metric": "readings", "stat": "band"}, "panels[0].stat", "no percentile band"),
    ({"metric": "reading_value", "step": "1s"}, "panels[0].step", "below the stream's pane"),
    ({"metric": "reading_value", "step": "1m", "window": "30s"}, "panels[0].window", "shorter than the step"),
    # Saved, these could never be drawn: the panel's query refuses a step or window off the pane.
    ({"metric": "reading_value", "step": "15s"}, "panels[0].step", "not a multiple of the stream's pane"),
    ({"metric": "reading_value", "step": "10s", "window": "15s"}, "panels[0].window",
     "not a multiple of the stream's pane"),
    ({"metric": "reading_value", "kind": "pie"}, "panels[0].kind", "line"),
])
def test_a_bad_panel_names_its_field(panel, field, words):
    with pytest.raises(DashboardError) as err:
        parse_dashboard({"name": "d", "panels": [panel]}, SENSORS)
    assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize("range_, step, field, words", [
    ("7d", "10s", "panels[0].step", "60,481 points of this step; a query answers at most 11,000"),
    ("36500d", None, "range", "longer than 50 years"),
])
def test_a_dashboard_whose_panels_could_never_be_drawn_over_its_range_is_refused(range_, step, field, words):
    panel = {"metric": "reading_value", **({"step": step} if step else {})}
    with pytest.raises(DashboardError) as err:
        parse_dashboard({"name": "d", "range": range_, "panels": [panel]}, SENSORS, max_points=11_000)
    assert err.value.field == field and words in str(err.value)
    parse_dashboard({"name": "d", "range": "1d", "panels": [panel]}, SENSORS, max_points=11_000)  # 8 641 points
    with pytest.raises(DashboardError):  # a deployment's own limit
        parse_dashboard({"name": "d", "range": "1d", "panels": [{**panel, "step": "10s"}]}, SENSORS, max_points=1_000)


def test_the_generated_dashboard_has_a_panel_per_metric():
    d = generated_dashboard(SENSORS)
    assert [(p.metric, p.stat, p.kind) for p in d.panels] == [("readings", "rate", "line"),
                                                              ("reading_value", "band", "area")]
    parse_dashboard(definition(d), SENSORS)  # valid as it is


def many_metrics_catalog(n: int):
    metrics = "".join(f"  m{i}: {{stream: s, value: v}}\n" if i % 2 else f"  m{i}: {{stream: s}}\n" for i in range(n))
    return parse_catalog("streams:\n  s: {time_field: ts, dimensions: [d], values: [v]}\nmetrics:\n" + metrics)


@pytest.mark.parametrize("n, pages", [(MAX_PANELS, 1), (MAX_PANELS + 1, 2), (2 * MAX_PANELS + 5, 3)])
def test_a_catalog_with_more_metrics_than_a_dashboards_panels_gets_more_generated_pages(n, pages):
    catalog = many_metrics_catalog(n)
    generated = generated_dashboards(catalog)
    assert [d.name for d in generated] == ["metrics", *[f"metrics-{i}" for i in range(2, pages + 1)]]
    assert [p.metric for d in generated for p in d.panels] == list(catalog.metrics)  # each metric once, in order
    assert all(len(d.panels) <= MAX_PANELS for d in generated)
    assert generated[0].title == ("All metrics" if pages == 1 else f"All metrics (1/{pages})")
    for d in generated:
        parse_dashboard(definition(d), catalog)  # each page valid as it is
    assert generated_dashboard(catalog) == generated[0]


def test_the_folders_files_are_named_after_them_and_a_bad_one_names_its_file(tmp_path):
    (tmp_path / "floor.yaml").write_text("title: Floor\npanels: [{metric: readings, group_by: [site], kind: table}]\n")
    (tmp_path / "notes.txt").write_text("not a dashboard")
    assert list(load_dashboards_dir(tmp_path, SENSORS)) == ["floor"]
    (tmp_path / "broken.yml").write_text("panels: [{metric: readings, group_by: [planet]}]\n")
    with pytest.raises(DashboardError, match=r"broken\.yml: panels\[0\]\.group_by: unknown dimension 'planet'"):
        load_dashboards_dir(tmp_path, SENSORS)
    with pytest.raises(DashboardError, match="not a folder"):
        load_dashboards_dir(tmp_path / "missing", SENSORS)


def test_a_dashboard_file_is_read_as_strictly_as_the_streams_file(tmp_path):
    """A `panels:` written twice kept the last one without a word (yaml.safe_load)."""
    (tmp_path / "twice.yaml").write_text("panels: [{metric: readings, kind: table}]\ntitle: T\npanels: []\n")
    with pytest.raises(DashboardError, match=r"twice\.yaml: line 3: duplicate key 'panels'"):
        load_dashboards_dir(tmp_path, SENSORS)


def test_the_demos_dashboards_are_valid():
    catalog = load_catalog(REPO_ROOT / "config" / "streams.yaml")
    assert list(load_dashboards_dir(REPO_ROOT / "config" / "dashboards", catalog)) == ["overview", "patterns", "search"]


NODE_SCRIPT = """
import { distribution } from "%(static)s/heatmap.js";
const steps = [
  {t: 0, count: 1000, values: {p1: 0, p10: 10, p25: 25, p50: 50, p75: 75, p90: 90, p99: 99}},  // uniform 0..100
  {t: 10000, count: 0, values: {}},                                                           // an empty step
];
const d = distribution(steps, 10);
console.log(JSON.stringify(d));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js to run the page's modules")
def test_the_heatmap_spreads_a_steps_events_between_its_quantiles(tmp_path):
    script = tmp_path / "heatmap.mjs"
    script.write_text(NODE_SCRIPT % {"static": (REPO_ROOT / "dashboard" / "static").as_posix()})
    out = json.loads(subprocess.run(["node", str(script)], capture_output=True, text=True, check=True).stdout)
    assert out["x"] == [0]  # the empty step draws nothing
    assert out["y"] == pytest.approx([4.95 + 9.9 * i for i in range(10)])  # 10 bins over p1..p99
    events = [row[0] for row in out["z"]]
    assert sum(events) == pytest.approx(980)  # p1..p99: the 1 % tails are left out
    assert max(events) - min(events) < 20  # uniform in, flat out
