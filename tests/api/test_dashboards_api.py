"""`/api/v1/dashboards`: saved dashboards (create, list, get, replace, duplicate, delete) with
4xx answers that name the field and change nothing; provisioned ones read-only; the dashboard
generated from the catalog while there is none. On every store backend (SQLite, PostgreSQL)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from api.app import create_app
from dashboard.provisioning import load_dashboards_dir
from dashboard.service import DashboardService
from store.dashboards import DashboardStore

REPO_ROOT = Path(__file__).resolve().parents[2]
SENSORS = REPO_ROOT / "tests" / "configs" / "sensors" / "streams.yaml"

BOARD = {"name": "shop", "title": "Shop", "range": "30m", "refresh": "10s", "panels": [
    {"metric": "latency", "stat": "band", "kind": "area"},
    {"metric": "requests", "stat": "rate", "group_by": ["endpoint"], "filters": {"method": "GET"}, "window": "1m"},
]}


@pytest.fixture
def pane_store(store_backend):
    return store_backend.create()


@pytest.fixture
def dashboards(ctx, clock):
    store = DashboardStore(ctx.store.side_db())
    ctx.dashboards = DashboardService(ctx.catalog, store, clock)
    yield ctx.dashboards
    store.close()


@pytest.fixture
def api(ctx, dashboards):
    with TestClient(create_app(ctx)) as c:
        yield c


def names(api) -> list[str]:
    return [d["name"] for d in api.get("/api/v1/dashboards").json()["dashboards"]]


def test_create_list_get_replace_duplicate_delete(api, clock):
    created = api.post("/api/v1/dashboards", json=BOARD)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["source"] == "api" and body["range"] == "30m" and body["refresh"] == "10s"
    assert body["panels"][1] == {"title": "", "metric": "requests", "stat": "rate", "kind": "line",
                                 "group_by": ["endpoint"], "filters": {"method": "GET"}, "window": "1m", "step": None}
    assert names(api) == ["shop"]
    assert api.get("/api/v1/dashboards/shop").json()["panels"] == body["panels"]

    clock.now += 5
    changed = api.put("/api/v1/dashboards/shop", json={**BOARD, "panels": BOARD["panels"][:1], "range": "6h"})
    assert changed.status_code == 200, changed.text
    assert len(changed.json()["panels"]) == 1 and changed.json()["updated_ms"] > body["updated_ms"]

    copy = api.post("/api/v1/dashboards/shop/duplicate", json={"name": "shop-copy", "title": "Mine"})
    assert copy.status_code == 201, copy.text
    assert copy.json()["title"] == "Mine" and copy.json()["range"] == "6h" and copy.json()["source"] == "api"
    assert names(api) == ["shop", "shop-copy"]

    assert api.delete("/api/v1/dashboards/shop").status_code == 204
    assert api.get("/api/v1/dashboards/shop").status_code == 404
    assert api.delete("/api/v1/dashboards/shop").status_code == 404
    assert names(api) == ["shop-copy"]


def test_a_change_or_delete_of_a_version_someone_else_changed_is_refused_with_409_and_changes_nothing(api, clock):
    """The page's editor sends back the version it loaded (`updated_ms`): after another writer
    (automation, another page) changed the dashboard, the page's save must not silently undo it."""
    loaded = api.post("/api/v1/dashboards", json=BOARD).json()
    clock.now += 1
    theirs = api.put("/api/v1/dashboards/shop", json={**BOARD, "title": "Theirs", "updated_ms": loaded["updated_ms"]})
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["updated_ms"] > loaded["updated_ms"]

    clock.now += 1
    stale = api.put("/api/v1/dashboards/shop", json={**BOARD, "panels": [], "updated_ms": loaded["updated_ms"]})
    assert stale.status_code == 409 and stale.json()["param"] == "updated_ms"
    assert "changed by someone else since you loaded it, at" in stale.json()["detail"]
    refused = api.delete("/api/v1/dashboards/shop", params={"updated_ms": loaded["updated_ms"]})
    assert refused.status_code == 409 and refused.json()["param"] == "updated_ms"
    assert api.get("/api/v1/dashboards/shop").json() == theirs.json()

    bad = api.put("/api/v1/dashboards/shop", json={**BOARD, "updated_ms": "yesterday"})
    assert bad.status_code == 400 and bad.json()["param"] == "updated_ms"
    assert api.delete("/api/v1/dashboards/shop", params={"updated_ms": theirs.json()["updated_ms"]}).status_code == 204
    gone = api.put("/api/v1/dashboards/shop", json={**BOARD, "updated_ms": theirs.json()["updated_ms"]})
    assert gone.status_code == 404 and "deleted since you loaded it" in gone.json()["detail"]


def test_a_change_without_a_version_overwrites_whatever_is_stored(api, clock):
    """Automation that owns a dashboard PUTs it without a version: it keeps overwriting."""
    api.post("/api/v1/dashboards", json=BOARD)
    clock.now += 1
    assert api.put("/api/v1/dashboards/shop", json={**BOARD, "title": "Theirs"}).status_code == 200
    mine = api.put("/api/v1/dashboards/shop", json={**BOARD, "title": "Mine"})
    assert mine.status_code == 200 and api.get("/api/v1/dashboards/shop").json()["title"] == "Mine"
    assert api.delete("/api/v1/dashboards/shop").status_code == 204


@pytest.mark.parametrize("change, param, words", [
    ({"panels": [{"metric": "nope"}]}, "panels[0].metric", "unknown metric 'nope'"),
    ({"panels": [{"metric": "requests", "stat": "p99"}]}, "panels[0].stat", "no value field"),
    ({"panels": [{"metric": "latency", "group_by": ["planet"]}]}, "panels[0].group_by", "unknown dimension 'planet'"),
    ({"panels": [{"metric": "latency", "filters": {"planet": "mars"}}]}, "panels[0].filters", "unknown dimension"),
    ({"panels": [{"metric": "requests", "kind": "heatmap"}]}, "panels[0].kind", "has no value"),
    ({"panels": [{"metric": "requests", "kind": "table"}]}, "panels[0].group_by", "top groups"),
    ({"panels": [{"metric": "latency", "stat": "band", "kind": "bar"}]}, "panels[0].stat", "band"),
    ({"panels": [{"metric": "latency", "window": "1x"}]}, "panels[0].window", "not a duration"),
    ({"panels": [{"metric": "latency", "colour": "red"}]}, "panels[0].colour", "Extra inputs"),
    ({"name": "no spaces"}, "name", "pattern"),
    ({"range": "0s"}, "range", "greater than 0"),
])
def test_invalid_dashboards_are_refused_naming_the_field(api, change, param, words):
    r = api.post("/api/v1/dashboards", json={**BOARD, **change})
    assert r.status_code == 400, r.text
    assert r.json()["param"] == param and words in r.json()["detail"], r.json()
    assert api.post("/api/v1/dashboards", content=b"[1]", headers={"content-type": "application/json"}).status_code == 400
    assert all(d["source"] == "generated" for d in api.get("/api/v1/dashboards").json()["dashboards"])  # nothing saved


def test_conflicts_and_renames_are_refused(api):
    assert api.post("/api/v1/dashboards", json=BOARD).status_code == 201
    assert api.post("/api/v1/dashboards", json=BOARD).status_code == 409
    assert api.put("/api/v1/dashboards/shop", json={**BOARD, "name": "other"}).json()["param"] == "name"
    assert api.put("/api/v1/dashboards/nope", json={**BOARD, "name": "nope"}).status_code == 404
    assert api.post("/api/v1/dashboards/shop/duplicate", json={"name": "shop"}).status_code == 409
    assert api.post("/api/v1/dashboards/nope/duplicate", json={"name": "x"}).status_code == 404
    assert api.post("/api/v1/dashboards/shop/duplicate", json={}).json()["param"] == "name"
    assert api.post("/api/v1/dashboards/shop/duplicate", json={"name": "x", "panels": []}).json()["param"] == "panels"


def test_provisioned_dashboards_are_read_only_and_follow_their_folder(api, dashboards, ctx, tmp_path):
    folder = tmp_path / "dashboards"
    folder.mkdir()
    (folder / "ops.yaml").write_text("title: Ops\nrange: 1h\npanels:\n  - {metric: latency, stat: p99}\n")
    dashboards.sync_files(load_dashboards_dir(folder, ctx.catalog))
    ops = api.get("/api/v1/dashboards/ops").json()
    assert ops["source"] == "file" and ops["title"] == "Ops" and ops["panels"][0]["stat"] == "p99"
    put = api.put("/api/v1/dashboards/ops", json={**ops, "title": "Mine"})
    assert put.status_code == 409 and "dashboards folder" in put.json()["detail"]
    assert api.delete("/api/v1/dashboards/ops").status_code == 409
    # Duplicating makes an editable copy; a reload of the folder without the file removes it, not the copy.
    assert api.post("/api/v1/dashboards/ops/duplicate", json={"name": "ops2"}).json()["source"] == "api"
    dashboards.sync_files({})
    assert names(api) == ["ops2"]


def test_with_no_dashboard_one_is_generated_from_the_catalog(api, ctx):
    # The demo's 30 metrics fill two generated pages (24 panels at most each), in catalog order.
    pages = api.get("/api/v1/dashboards").json()["dashboards"]
    assert [(d["name"], d["source"]) for d in pages] == [("metrics", "generated"), ("metrics-2", "generated")]
    assert [p["metric"] for d in pages for p in d["panels"]] == list(ctx.catalog.metrics)
    generated = pages[0]
    assert {p["stat"] for p in generated["panels"] if p["metric"] == "latency"} == {"band"}
    assert api.get(f"/api/v1/dashboards/{generated['name']}").json() == generated
    assert api.delete(f"/api/v1/dashboards/{generated['name']}").status_code == 409
    # Saving it (PUT) keeps it as an ordinary dashboard; then it is no longer generated.
    saved = api.put(f"/api/v1/dashboards/{generated['name']}", json={**generated, "panels": generated["panels"][:2]})
    assert saved.status_code == 200 and saved.json()["source"] == "api"
    assert [d["source"] for d in api.get("/api/v1/dashboards").json()["dashboards"]] == ["api"]


def test_wiring_provisions_the_demo_overview_and_generates_one_for_another_configuration(tmp_path, monkeypatch):
    from api.security.tokens import hash_token
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    tokens = [{"name": "viewer", "sha256": hash_token("sb_viewer"), "scopes": ["read"]},
              {"name": "ops", "sha256": hash_token("sb_ops"), "scopes": ["admin"]}]
    app, ctx = build_api(Settings(data_dir=tmp_path / "demo", alerts_config=None, tokens=tokens))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        read, admin = {"Authorization": "Bearer sb_viewer"}, {"Authorization": "Bearer sb_ops"}
        overview, patterns, search = client.get("/api/v1/dashboards", headers=read).json()["dashboards"]
        assert overview["name"] == "overview" and overview["source"] == "file"
        assert search["name"] == "search" and search["source"] == "file"
        # The demo's patterns: their matches over time beside the streams they read.
        assert patterns["name"] == "patterns" and patterns["source"] == "file"
        assert {"credential_stuffing_matches", "checkout_abandoned_matches"} <= {p["metric"] for p in patterns["panels"]}
        assert {p["kind"] for p in overview["panels"]} == {"line", "area", "stat", "bar", "heatmap", "table"}
        # Changes need the admin scope and are audited.
        assert client.post("/api/v1/dashboards/overview/duplicate", json={"name": "mine"}, headers=read).status_code == 403
        assert client.post("/api/v1/dashboards/overview/duplicate", json={"name": "mine"}, headers=admin).status_code == 201
        audit = client.get("/api/v1/audit", headers=admin).json()
        assert any(e["action"] == "POST /api/v1/dashboards/overview/duplicate" and e["actor"] == "ops"
                   for e in audit["entries"]), audit

    app, ctx = build_api(Settings(data_dir=tmp_path / "sensors", streams_config=SENSORS, alerts_config=None))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        (generated,) = client.get("/api/v1/dashboards").json()["dashboards"]
        assert generated["source"] == "generated"
        assert [p["metric"] for p in generated["panels"]] == ["readings", "reading_value"]


def test_a_configuration_with_more_metrics_than_a_dashboard_holds_gets_generated_pages(tmp_path, monkeypatch):
    """25 metrics and no dashboard answered 500 (a generated dashboard over its panel limit)."""
    from dashboard.model import MAX_PANELS
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    metrics = "".join(f"  m{i}: {{stream: s}}\n" for i in range(MAX_PANELS + 1))
    config = tmp_path / "many" / "streams.yaml"
    config.parent.mkdir()
    config.write_text(f"streams:\n  s: {{time_field: ts, dimensions: [d]}}\nmetrics:\n{metrics}")
    app, ctx = build_api(Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        listed = client.get("/api/v1/dashboards")
        assert listed.status_code == 200, listed.text
        first, second = listed.json()["dashboards"]
        assert (first["name"], second["name"]) == ("metrics", "metrics-2")
        assert [p["metric"] for p in first["panels"] + second["panels"]] == list(ctx.catalog.metrics)
        assert client.get("/api/v1/dashboards/metrics-2").json() == second
        assert client.get("/api/v1/dashboards/metrics-3").status_code == 404
        # Saving a page keeps it; from then on the saved one is all there is.
        assert client.put("/api/v1/dashboards/metrics-2", json=second).status_code in (200, 201)
        assert [d["name"] for d in client.get("/api/v1/dashboards").json()["dashboards"]] == ["metrics-2"]


def test_two_pages_saving_the_generated_dashboard_with_the_version_they_loaded(api, clock):
    """The generated dashboard's version is 0 and the page sends it back: the first save keeps it
    as a saved dashboard, the second page's save of its stale copy is refused (409), not an
    overwrite of the first's."""
    generated = api.get("/api/v1/dashboards/metrics").json()
    assert generated["updated_ms"] == 0
    body = {k: v for k, v in generated.items() if k not in ("source", "created_ms")}
    first = api.put("/api/v1/dashboards/metrics", json={**body, "panels": generated["panels"][:2]})
    assert first.status_code == 200 and first.json()["source"] == "api"
    clock.now += 1
    second = api.put("/api/v1/dashboards/metrics", json={**body, "panels": generated["panels"][:3]})
    assert second.status_code == 409 and second.json()["param"] == "updated_ms"
    assert len(api.get("/api/v1/dashboards/metrics").json()["panels"]) == 2
