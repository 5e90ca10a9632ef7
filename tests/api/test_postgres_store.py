"""`store_backend: postgres` through the settings and the wiring: `build_api` opens the pane
store, the lag, health and alert stores and the Bloom reader on one real PostgreSQL database,
and nothing of the store lands in data_dir."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from sketchboard.settings import DEFAULT_ALERTS, Settings

pytestmark = pytest.mark.postgres


def test_api_serves_from_a_postgres_store(postgres_server, tmp_path, monkeypatch) -> None:
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    settings = Settings(data_dir=tmp_path / "data", store_backend="postgres", postgres_dsn=postgres_server.fresh_dsn(),
                        alerts_config=DEFAULT_ALERTS)
    app, ctx = build_api(settings)
    assert type(ctx.store).__name__ == "PostgresPaneStore"
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host (DNS-rebinding check)
        assert client.get("/readyz").status_code == 200
        assert client.get("/api/v1/pipeline").json()["batches"] == 0
        rules = client.get("/api/v1/alerts/rules").json()["rules"]
        assert rules and {r["source"] for r in rules} == {"file"}  # the file's rules, stored in PostgreSQL
        now = int(time.time() * 1000)
        events = [{"time": now, "customer_id": f"c{i}", "amount": 1.0} for i in range(5)]
        assert client.post("/api/v1/events", params={"stream": "orders"}, json=events).json()["accepted"] == 5
        ctx.leadership.tick()  # this replica leads: only the leader's sampler writes samples
        assert ctx.leadership.leading()
        samples = ctx.lag.sampler.sample_and_store()
        assert sum(s.lag_events for s in samples if s.stream == "orders") == 5
        assert client.get("/api/v1/lag").json()["lag_events"] == 5
        # Read through the store's Bloom reader: nothing committed yet, nothing seen.
        r = client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen",
                                                "from": now - 60_000, "to": now, "step": "1m"})
        assert r.status_code == 200, r.text
        ctx.leadership.stop()
    assert not (tmp_path / "data" / "store.db").exists()
