"""A window join through the API (no Spark: the join's batches are committed by its driver
side, tests/unit/test_join_batches.py): the CTR (stat ratio) over REST and in a websocket
snapshot, the join's state in /api/v1/pipeline and /metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient

from aggregates.joins import WindowJoins
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from ingest.log import SqliteEventLog
from store import SqlitePaneStore
from tests.unit.test_join_batches import CONFIG, MIN, T0, commit


def test_the_ctr_over_rest_and_websocket_and_the_join_in_the_pipeline_status(tmp_path):
    catalog = parse_catalog(CONFIG)
    log = SqliteEventLog(tmp_path / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db")
    joins = WindowJoins(catalog, store)
    commit(store, joins, 0, [("searches", 0, 0, T0, ["books"], ["s1"]), ("searches", 0, 1, T0 + MIN, ["books"], ["s2"]),
                             ("clicks", 0, 0, T0 + 2 * MIN, ["1"], ["s1"]), ("clicks", 0, 1, T0 + 3 * MIN, ["1"], ["zz"])])
    app = create_app(ApiContext(catalog=catalog, log=log, store=store, clock=lambda: (T0 + 30 * MIN) / 1000))
    with TestClient(app) as client:  # the lifespan: the websocket hub stops before the store closes
        query = {"metric": "search_clicks_clicked", "from": T0, "to": T0 + 10 * MIN, "step": "10m",
                 "group_by": "query_category"}
        answer = client.get("/api/v1/query", params={**query, "stat": "ratio"})
        assert answer.status_code == 200, answer.text
        points = {s["group"]["query_category"]: s["points"][0] for s in answer.json()["series"]}
        assert points["books"]["value"] == 0.5 and points["books"]["error"] is None
        refused = client.get("/api/v1/query", params={**query, "metric": "search_clicks_pairs", "stat": "ratio"})
        assert refused.status_code == 400 and "ratio_of" in refused.text
        with client.websocket_connect("/api/v1/ws") as ws:
            ws.send_json({"type": "subscribe", "id": "ctr", "query": {**query, "stats": ["ratio", "sum"]}})
            snap = ws.receive_json()
            while snap["type"] != "snapshot":
                snap = ws.receive_json()
        got = {(s["stat"], s["group"]["query_category"]): s["points"][0]["value"] for s in snap["result"]["series"]}
        assert got[("ratio", "books")] == 0.5 and got[("sum", "books")] == 1.0
        status = client.get("/api/v1/pipeline").json()["joins"]["search_clicks"]
        assert status == {"left_stream": "searches", "right_stream": "clicks", "within_ms": 30 * MIN,
                          "late_horizon_ms": 60 * MIN, "clock_ms": T0 + MIN - 30_000, "left_rows": 2,
                          "right_rows": 2, "pending_right": 1, "pairs": 1, "unmatched_right": 0}
        metrics = client.get("/metrics").text
        assert 'sketchboard_join_state_rows{join="search_clicks",side="pending_right"} 1.0' in metrics
    store.close()
    log.close()
