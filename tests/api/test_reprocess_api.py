"""/api/v1/reprocess as `sketchboard api` wires it (no Spark: the run's pipeline is not launched
here, tests/spark/test_reprocess.py runs one), the `definitions` section of /api/v1/pipeline and
the /metrics gauges, after the streams configuration changed under a store built with the old one."""

from __future__ import annotations

import warnings

import yaml

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from api.security.tokens import hash_token
from catalog.versions import catalog_versions
from sketchboard.definitions import pin_definitions
from sketchboard.settings import Settings
from sketchboard.wiring import build_api, open_catalog, open_store

OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"]},
                   "orders": {"key_field": "customer", "values": ["amount"]}},
       "metrics": {"latency": {"stream": "http", "value": "latency_ms"}}}
NEW = {**OLD, "streams": {**OLD["streams"], "http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"]}}}
TOKENS = [{"name": "viewer", "sha256": hash_token("sb_viewer"), "scopes": ["read"]},
          {"name": "ops", "sha256": hash_token("sb_ops"), "scopes": ["admin"]}]
READ, ADMIN = {"Authorization": "Bearer sb_viewer"}, {"Authorization": "Bearer sb_ops"}


def test_reprocess_routes_status_and_metrics_after_a_definition_change(tmp_path):
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=TOKENS)
    root = open_store(settings)
    old_versions = catalog_versions(open_catalog(settings))
    pin_definitions(root, open_catalog(settings), "main")  # as the pipeline records them when it starts
    root.close()
    config.write_text(yaml.safe_dump(NEW))
    app, ctx = build_api(settings)
    launched = []
    ctx.reprocess.launch = launched.append  # no child process here
    new_versions = catalog_versions(ctx.catalog)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            definitions = client.get("/api/v1/pipeline", headers=READ).json()["definitions"]
            assert definitions == {
                "http": {"configured_version": new_versions["http"], "serving_version": old_versions["http"],
                         "changed": True},
                "orders": {"configured_version": new_versions["orders"], "serving_version": old_versions["orders"],
                           "changed": False}}
            metrics = client.get("/metrics", headers=READ).text
            assert 'sketchboard_definition_changed{stream="http"} 1.0' in metrics
            assert 'sketchboard_definition_changed{stream="orders"} 0.0' in metrics
            listed = client.get("/api/v1/reprocess", headers=READ).json()
            assert listed == {"runs": [], "changed": {"http": {"serving_version": old_versions["http"],
                                                               "configured_version": new_versions["http"]}}}

            # Starting one needs the admin scope; refusals name the stream and why.
            assert client.post("/api/v1/reprocess", json={"stream": "http"}, headers=READ).status_code == 403
            unknown = client.post("/api/v1/reprocess", json={"stream": "nope"}, headers=ADMIN)
            assert unknown.status_code == 404 and unknown.json()["param"] == "stream"
            assert "unknown stream 'nope'" in unknown.json()["detail"]
            unchanged = client.post("/api/v1/reprocess", json={"stream": "orders"}, headers=ADMIN)
            assert unchanged.status_code == 409 and "configured definition" in unchanged.json()["detail"]
            assert client.post("/api/v1/reprocess", json={}, headers=ADMIN).status_code == 422

            started = client.post("/api/v1/reprocess", json={"stream": "http"}, headers=ADMIN)
            assert started.status_code == 202, started.text
            run = started.json()
            assert run["id"] == f"reprocess-http-{new_versions['http'][:8]}" and run["namespace"] == run["id"]
            assert run["state"] == "starting" and run["version"] == new_versions["http"]
            assert run["complete_from_ms"] <= ctx.now_ms()  # said up front
            assert run["progress"]["done"] == 0 and run["progress"]["to_do"] == 0  # an empty log
            assert [r.id for r in launched] == [run["id"]]

            going = client.post("/api/v1/reprocess", json={"stream": "http"}, headers=ADMIN)
            assert going.status_code == 409 and "still going" in going.json()["detail"]
            assert client.get(f"/api/v1/reprocess/{run['id']}", headers=READ).json()["id"] == run["id"]
            assert [r["id"] for r in client.get("/api/v1/reprocess", headers=READ).json()["runs"]] == [run["id"]]
            missing = client.get("/api/v1/reprocess/reprocess-x-00000000", headers=READ)
            assert missing.status_code == 404 and "no reprocessing run" in missing.json()["detail"]
            metrics = client.get("/metrics", headers=READ).text
            assert f'sketchboard_reprocess_offsets_to_do{{run="{run["id"]}",state="starting",stream="http"}}' in metrics
            audit = client.get("/api/v1/audit", headers=ADMIN).json()["entries"]
            assert any(e["action"] == "POST /api/v1/reprocess" and e["actor"] == "ops" for e in audit)
    finally:
        ctx.store.close()
