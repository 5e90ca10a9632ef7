"""/api/v1/reprocess as `sketchboard api` wires it (no Spark: the run's pipeline is not launched
here, tests/spark/test_reprocess.py runs one; but the last test, which lets the route start its
real child process), the `definitions` section of /api/v1/pipeline and the /metrics gauges, after
the streams configuration changed under a store built with the old one."""

from __future__ import annotations

import warnings

import pytest
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
            assert listed["runs"] == [] and listed["changed"] == {
                "http": {"serving_version": old_versions["http"], "configured_version": new_versions["http"]}}
            assert listed["versions"]["http"] == [{"version": old_versions["http"], "namespace": "", "serving": True}]

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



def received(ws, timeout_s: float = 15.0) -> dict:
    """The next message of a TestClient websocket for a subscription (topic broadcasts and
    heartbeats come between), or a failed test after
    `timeout_s` (its receive waits for ever: in a thread of its own, left behind when it fails)."""
    import queue
    import threading

    got: queue.Queue = queue.Queue()

    def read() -> None:
        while "id" not in (msg := ws.receive_json()):
            pass
        got.put(msg)

    threading.Thread(target=read, daemon=True).start()
    try:
        return got.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no message within {timeout_s} s") from None


def served_as_old(tmp_path, store_backend):
    """Settings over a store (either backend) whose streams file declares OLD, the first pane of
    ten minutes ago, and OLD's catalog."""
    import time

    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    extra = {}
    if store_backend.kind == "postgres":
        extra = {"store_backend": "postgres", "postgres_dsn": store_backend.create().dsn, "postgres_pool_size": 2}
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=TOKENS, **extra)
    pane = (int(time.time() * 1000) - 600_000) // 10_000 * 10_000
    return settings, pane, open_catalog(settings)

def test_switch_version_and_drop_routes(tmp_path, store_backend):
    """?version= answers from either output; the switch (admin, audited) makes the run's output the
    served one and keeps the old one queryable; drop refuses the served version. Both store backends."""
    import time

    from store.base import BatchCommit, PanePartial
    from store.panes import PaneData

    config = tmp_path / "streams.yaml"
    settings, pane, old_catalog = served_as_old(tmp_path, store_backend)

    def write(store, pipeline: str, catalog, counts: dict[tuple, int]) -> None:
        dims = catalog.streams["http"].dimensions
        store.commit_batch(BatchCommit(
            pipeline=pipeline, batch_id=0, events_read=sum(counts.values()), max_event_ms={"http": pane + 20_000},
            partials=[PanePartial("http", pane, pane + 10_000, dict(zip(dims, k)), PaneData(count=n))
                      for k, n in counts.items()], end_offsets={"http": {0: sum(counts.values())}},
            definition_versions=catalog_versions(catalog)), lateness_ms={"http": 0}, now_ms=pane)

    root = open_store(settings)
    pin_definitions(root, old_catalog, "main")
    write(root, "main", old_catalog, {("/a",): 3})
    root.close()
    config.write_text(yaml.safe_dump(NEW))
    app, ctx = build_api(settings)
    ctx.reprocess.launch = lambda run: None
    old_v, new_v = catalog_versions(old_catalog)["http"], catalog_versions(ctx.catalog)["http"]

    def groups(client, **params) -> dict:
        answer = client.get("/api/v1/query", params={"metric": "latency", "stat": "count", "from": "now-1h",
                                                     "group_by": "region", **params}, headers=READ)
        assert answer.status_code == 200, answer.text
        return {s["group"].get("region", ""): sum(p["count"] for p in s["points"]) for s in answer.json()["series"]}

    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            run = client.post("/api/v1/reprocess", json={"stream": "http"}, headers=ADMIN).json()
            output = open_store(settings, run["id"])
            pin_definitions(output, ctx.catalog, run["id"])
            write(output, run["id"], ctx.catalog, {("/a", "eu"): 2, ("/a", "us"): 1})
            output.close()
            not_yet = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert not_yet.status_code == 409 and "caught up" in not_yet.json()["detail"]
            ctx.reprocess.definitions.set_state(run["id"], "caught_up", ctx.now_ms())

            # Served: the old definition, which has no region: the dimension added since reads as one
            # group "" until the switch, as for any rows made before a dimension was added.
            assert groups(client) == {"": 3}
            assert groups(client, group_by="endpoint") == {"": 3}
            # An alert rule on the stream follows the switch without a restart (it reads the served output,
            # with the definition it was built with).
            ctx.alerts.create({"name": "by_region", "kind": "threshold", "metric": "latency", "stat": "count",
                               "window": "20m", "group_by": ["region"], "op": ">", "threshold": 0, "stale_after": "2h"})

            evaluations = iter(range(1, 10))

            def firing() -> dict:  # each evaluation 2 minutes after the last: due, the panes still in its window
                at = ctx.now_ms() + 120_000 * next(evaluations)
                (evaluation,) = [e for e in ctx.alerts.evaluate_due(at) if e.rule == "by_region"]
                return {i.labels.get("region", ""): i.value for i in evaluation.instances if i.state == "firing"}

            assert firing() == {"": 3}
            assert groups(client, version=new_v[:8]) == {"eu": 2, "us": 1}  # the run's output
            unknown = client.get("/api/v1/query", params={"metric": "latency", "version": "deadbeef"}, headers=READ)
            assert unknown.status_code == 404 and unknown.json()["param"] == "version"
            assert "no output of version 'deadbeef'" in unknown.json()["detail"]
            listed = client.get("/api/v1/reprocess", headers=READ).json()
            assert [v["version"] for v in listed["versions"]["http"]] == [old_v, new_v]

            assert client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=READ).status_code == 403
            missing = client.post("/api/v1/reprocess/reprocess-x-00000000/switch", headers=ADMIN)
            assert missing.status_code == 404 and missing.json()["param"] == "run_id"
            # Subscriptions open across the switch are resolved again by it: one following the served
            # version by name ends (that version is no longer served), the others reload.
            with client.websocket_connect("/api/v1/ws", headers=READ) as live:
                query = {"metric": "latency", "stat": "count", "from": "now-1h", "group_by": "region"}
                live.send_json({"type": "subscribe", "id": "served", "query": query})
                live.send_json({"type": "subscribe", "id": "pinned", "query": {**query, "group_by": "endpoint",
                                                                                "version": old_v[:8]}})
                first = []
                while len(first) < 2:  # a tick may push the served one's points before the second snapshot
                    if (message := received(live))["type"] != "points":
                        first.append(message)
                assert [(m["type"], m["id"], "live" in m) for m in first] == [("snapshot", "served", False),
                                                                               ("snapshot", "pinned", False)]
                switched = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
                after = {}
                for _ in range(30):  # a tick's points computed before the switch may come first
                    message = received(live)
                    if message["type"] != "points":
                        after[message["id"]] = message
                    if len(after) == 2:
                        break
            ended = after["pinned"]
            assert ended["type"] == "error" and "no longer the served output" in ended["reason"], ended
            reload = after["served"]
            assert reload["type"] == "snapshot" and reload["reason"] == "switched"
            assert {s["group"]["region"]: sum(p["count"] for p in s["points"])
                    for s in reload["result"]["series"]} == {"eu": 2, "us": 1}
            assert switched.status_code == 200, switched.text
            previous = switched.json()["previous"]
            assert previous == f"previous-http-{old_v[:8]}" and switched.json()["serving_version"] == new_v
            assert groups(client) == {"eu": 2, "us": 1}
            assert firing() == {"eu": 2, "us": 1}
            old_answer = client.get("/api/v1/query", params={"metric": "latency", "from": "now-1h", "group_by": "region",
                                                         "version": old_v}, headers=READ)  # with its declaration
            assert old_answer.status_code == 400 and "dimensions: endpoint" in old_answer.json()["detail"]
            assert groups(client, version=old_v, group_by="endpoint") == {"": 3}  # the old output, queryable
            # The websocket's subscription takes `version` too: an output not served is one snapshot.
            with client.websocket_connect("/api/v1/ws", headers=READ) as ws:
                query = {"metric": "latency", "stat": "count", "from": "now-1h", "group_by": "endpoint"}
                def answer(sub_id: str) -> dict:  # topic broadcasts may come first
                    while True:
                        msg = ws.receive_json()
                        if msg.get("id") == sub_id:
                            return msg

                ws.send_json({"type": "subscribe", "id": "old", "query": {**query, "version": old_v[:8]}})
                snap = answer("old")
                assert snap["type"] == "snapshot" and snap["live"] is False
                assert {s["group"]["endpoint"]: sum(p["count"] for p in s["points"])
                        for s in snap["result"]["series"]} == {"/a": 3}
                ws.send_json({"type": "subscribe", "id": "x", "query": {**query, "version": "deadbeef"}})
                refused = answer("x")
                assert refused["type"] == "error" and "no output of version 'deadbeef'" in refused["reason"]
                ws.send_json({"type": "subscribe", "id": "new", "query": {**query, "version": new_v}})
                served_snap = answer("new")
                assert served_snap["type"] == "snapshot" and "live" not in served_snap  # live, as any
            again = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert again.status_code == 409 and "served with version" in again.json()["detail"]
            assert client.get("/api/v1/pipeline", headers=READ).json()["definitions"]["http"]["changed"] is False
            assert client.get(f"/api/v1/reprocess/{run['id']}", headers=READ).json()["serving"] is True

            served = client.post(f"/api/v1/reprocess/{run['id']}/drop", headers=ADMIN)
            assert served.status_code == 409 and "served one" in served.json()["detail"]
            dropped = client.post(f"/api/v1/reprocess/{previous}/drop", headers=ADMIN)
            assert dropped.status_code == 200 and dropped.json() == {"dropped": previous}
            gone = client.get("/api/v1/query", params={"metric": "latency", "version": old_v}, headers=READ)
            assert gone.status_code == 404
            audit = [e["action"] for e in client.get("/api/v1/audit", headers=ADMIN).json()["entries"]]
            assert f"POST /api/v1/reprocess/{run['id']}/switch" in audit and f"POST /api/v1/reprocess/{previous}/drop" in audit
    finally:
        ctx.reprocess.close_outputs()
        for r in ctx.reprocess.runs():
            ctx.reprocess.outputs.storage.drop(r.id)
        ctx.store.close()


def test_the_served_output_is_read_with_the_definition_it_was_built_with(tmp_path, store_backend):
    """Until a switch the pipeline computes a changed stream as stored, so the API reads its output by
    the stored declaration, not the configured one: a dimension removed since still groups, a finer
    pane is refused as a step, membership and first_seen turned on since are not answered from
    output that has none. Ingest still follows the configuration."""
    import time

    from store.base import BatchCommit, PanePartial
    from store.panes import PaneData

    config = tmp_path / "streams.yaml"
    settings, pane, old_catalog = served_as_old(tmp_path, store_backend)
    root = open_store(settings)
    pin_definitions(root, old_catalog, "main")
    root.commit_batch(BatchCommit(
        pipeline="main", batch_id=0, events_read=3, max_event_ms={"http": pane + 20_000},
        partials=[PanePartial("http", pane, pane + 10_000, {"endpoint": "/a"}, PaneData(count=3))],
        end_offsets={"http": {0: 3}}, definition_versions=catalog_versions(old_catalog)), lateness_ms={"http": 0},
        now_ms=pane)
    root.close()
    http = {**OLD["streams"]["http"], "dimensions": [], "pane": "5s", "first_seen": {"field": "user"},
            "membership": {"field": "user", "bucket": "1h"}}
    config.write_text(yaml.safe_dump({"streams": {**OLD["streams"], "http": http},
                                      "metrics": {**OLD["metrics"], "new_users": {"stream": "http", "first_seen": True}}}))
    app, ctx = build_api(settings)

    def query(**params):
        return client.get("/api/v1/query", params={"metric": "latency", "stat": "count", "from": "now-1h", **params},
                          headers=READ)

    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            grouped = query(group_by="endpoint")
            assert grouped.status_code == 200, grouped.text
            assert {s["group"]["endpoint"]: sum(p["count"] for p in s["points"])
                    for s in grouped.json()["series"]} == {"/a": 3}
            finer = query(step="5s")
            assert finer.status_code == 400 and finer.json()["param"] == "step"  # the served panes are 10 s
            assert query(step="10s").status_code == 200
            membership = client.get("/api/v1/membership", params={"stream": "http", "key": "u1"}, headers=READ)
            assert membership.status_code == 400 and "declares no membership" in membership.json()["detail"]
            assert query(metric="new_users", stat="first_seen").status_code == 404  # no first_seen there yet
            with client.websocket_connect("/api/v1/ws", headers=READ) as ws:
                ws.send_json({"type": "subscribe", "id": "e", "query": {"metric": "latency", "stat": "count",
                                                                        "from": "now-1h", "group_by": "endpoint"}})
                while (msg := ws.receive_json()).get("id") != "e":
                    pass
                assert msg["type"] == "snapshot", msg
            # Ingest goes by the configuration (new events are checked as configured), reads by the stored one.
            assert ctx.catalog.streams["http"].membership is not None
            assert ctx.served_catalog().streams["http"].membership is None
    finally:
        ctx.store.close()


def test_switch_of_a_stream_feeding_a_join_starts_a_synchronized_switch_in_a_child(tmp_path):
    """A stream feeding a window join is switched in step with the serving pipeline by a process
    that can run the run's final batch: the route starts it (202) and the run shows running; a run
    that did not read the join's other stream, a second request meanwhile, and Kafka (the run
    cannot stop the other stream at chosen offsets) are 409s saying why, no 500."""
    joined = {"streams": {**OLD["streams"], "clicks": {"key_field": "user"}},
              "joins": [{"name": "http_clicks", "left": {"stream": "http", "key": "user"},
                         "right": {"stream": "clicks", "key": "user"}, "within": "5m"}],
              "metrics": OLD["metrics"]}
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(joined))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=TOKENS)
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")
    root.close()
    config.write_text(yaml.safe_dump({**joined, "streams": {**joined["streams"], "http": NEW["streams"]["http"]}}))
    app, ctx = build_api(settings)
    ctx.reprocess.launch = lambda run: None
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            run = client.post("/api/v1/reprocess", json={"stream": "http"}, headers=ADMIN).json()
            output = open_store(settings, run["id"])  # its output is there (empty)
            ctx.reprocess.definitions.set_state(run["id"], "caught_up", ctx.now_ms())
            refused = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert refused.status_code == 409 and refused.json()["param"] == "run_id"
            assert "did not read 'clicks'" in refused.json()["detail"]
            pin_definitions(output, open_catalog(settings), run["id"])  # a run reads the join's other stream
            output.close()
            ctx.reprocess.joins_rebuilt = False  # a log whose runs could not stop the other stream (none now)
            refused = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert refused.status_code == 409 and "'http' also feeds join 'http_clicks'" in refused.json()["detail"]
            ctx.reprocess.joins_rebuilt = True
            launched = []
            ctx.reprocess.launch_switch = launched.append  # `sketchboard reprocess http --run ID --switch`
            started = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert started.status_code == 202 and started.json()["switching"] is True
            assert started.json()["run"]["state"] == "running" and [r.id for r in launched] == [run["id"]]
            again = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert again.status_code == 409 and "is running" in again.json()["detail"]
    finally:
        ctx.reprocess.close_outputs()
        for r in ctx.reprocess.runs():
            ctx.reprocess.outputs.storage.drop(r.id)
        ctx.store.close()


def test_switch_of_a_table_moves_the_stream_it_enriches_with_it(tmp_path):
    """A run of a table rebuilds the stream enriched from it: its progress names the stream's
    partitions too, and the switch (no hold: answered at once) says it moved the stream (on both
    logs: tests/spark/test_reprocess_enrichment.py)."""
    tables = {"streams": {"users": {"kind": "table", "key_field": "user", "dimensions": ["plan"], "partitions": 1},
                          "http": {**OLD["streams"]["http"], "partitions": 1,
                                   "enrich": [{"table": "users", "by": "user", "columns": ["plan"]}]}},
              "metrics": OLD["metrics"]}
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(tables))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=TOKENS)
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")
    root.close()
    config.write_text(yaml.safe_dump({**tables, "streams": {**tables["streams"], "users": {
        **tables["streams"]["users"], "dimensions": ["plan", "country"]}}}))
    app, ctx = build_api(settings)
    ctx.reprocess.launch = lambda run: None
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            run = client.post("/api/v1/reprocess", json={"stream": "users"}, headers=ADMIN).json()
            assert {p.get("stream") for p in run["progress"]["partitions"]} == {"users", "http"}
            output = open_store(settings, run["id"])
            pin_definitions(output, open_catalog(settings), run["id"])  # the run built users and http
            output.close()
            ctx.reprocess.definitions.set_state(run["id"], "caught_up", ctx.now_ms())
            switched = client.post(f"/api/v1/reprocess/{run['id']}/switch", headers=ADMIN)
            assert switched.status_code == 200 and switched.json()["enriched"] == ["http"]
    finally:
        ctx.reprocess.close_outputs()
        for r in ctx.reprocess.runs():
            ctx.reprocess.outputs.storage.drop(r.id)
        ctx.store.close()


@pytest.mark.spark
@pytest.mark.e2e
def test_the_route_starts_the_run_as_a_child_process_that_catches_up(tmp_path, capfd, monkeypatch):
    """The launch the other tests stub: POST /api/v1/reprocess starts `sketchboard reprocess STREAM
    --run ID` as a child of the API process (its own JVM), on the same data folder and
    configuration; the run goes from starting to caught_up and its output holds the log's events
    grouped by the new dimension. The child exits cleanly: its progress listener was taken off
    Spark's listener bus before the JVM stopped (no ERROR StreamingQueryListenerBus on its stderr,
    which it shares with this process)."""
    import json
    import subprocess
    import time

    import sketchboard.reprocess as reprocess
    from ingest.events import EventValidator

    children = []

    class Recorded(subprocess.Popen):  # the real child, kept to wait for its exit
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            children.append(self)

    monkeypatch.setattr(reprocess.subprocess, "Popen", Recorded)

    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=TOKENS)
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")
    root.close()
    config.write_text(yaml.safe_dump(NEW))
    app, ctx = build_api(settings)
    now = int(time.time() * 1000)
    stream = ctx.catalog.stream("http")
    validator = EventValidator(stream)
    events = [{"time": now - 60_000, "user": f"u{i}", "endpoint": "/a", "region": ("eu", "us")[i % 3 == 0],
               "latency_ms": 1.0} for i in range(30)]
    ctx.log.append(stream, [validator.validate(e) for e in events], now)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            started = client.post("/api/v1/reprocess", json={"stream": "http"}, headers=ADMIN)
            assert started.status_code == 202, started.text
            run_id = started.json()["id"]
            deadline = time.monotonic() + 480  # a JVM of its own, on a loaded machine
            while (run := client.get(f"/api/v1/reprocess/{run_id}", headers=READ).json())["state"] in ("starting",
                                                                                                     "running"):
                assert time.monotonic() < deadline, run
                time.sleep(1)
            assert run["state"] == "caught_up", run
            assert (run["progress"]["done"], run["progress"]["to_do"], run["progress"]["fraction"]) == (30, 30, 1.0)
        (child,) = children
        assert child.wait(120) == 0
        stderr = capfd.readouterr().err
        assert "has caught up with the log's end" in stderr  # the child's own output is what was read
        assert "StreamingQueryListenerBus" not in stderr and "Py4JException" not in stderr, stderr[-3000:]
        output = open_store(settings, run_id)
        try:
            counts: dict[str, int] = {}
            for p in output.read_panes("http", 0, 2**62):
                region = json.loads(p.key.dims)["region"]
                counts[region] = counts.get(region, 0) + p.data.count
            assert counts == {"us": 10, "eu": 20}
        finally:
            output.close()
    finally:
        ctx.store.close()


def test_streams_and_metrics_list_what_is_served_and_name_the_definition_waiting_for_a_switch(tmp_path, store_backend):
    """A Grafana or Prometheus user picks dimensions, panes and metrics from /api/v1/streams and
    /api/v1/metrics: until a switch they list the definition queries answer with (the stored one),
    not the configured one, and name what the configuration changed and waits for the switch."""
    from catalog.versions import definition_version

    config = tmp_path / "streams.yaml"
    settings, pane, old_catalog = served_as_old(tmp_path, store_backend)
    root = open_store(settings)
    pin_definitions(root, old_catalog, "main")
    root.close()
    http = {**OLD["streams"]["http"], "dimensions": ["region"], "pane": "5s", "first_seen": {"field": "user"}}
    config.write_text(yaml.safe_dump({"streams": {**OLD["streams"], "http": http},
                                      "metrics": {**OLD["metrics"], "new_users": {"stream": "http", "first_seen": True}}}))
    app, ctx = build_api(settings)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            body = client.get("/api/v1/streams", headers=READ).json()
            streams = {s["name"]: s for s in body["streams"]}
            # As served: the stored pane and features; the removed dimension still groups, the added one answers "".
            assert streams["http"]["pane"] == "10s" and streams["http"]["first_seen"] is None
            assert streams["http"]["dimensions"] == ["endpoint", "region"]
            pending = streams["http"]["definition_pending"]
            assert pending["serving_version"] == definition_version(old_catalog.streams["http"])
            assert pending["configured_version"] == definition_version(ctx.catalog.streams["http"], ctx.catalog)
            assert pending["changes"]["pane_ms"] == {"served": 10_000, "configured": 5_000}
            assert pending["changes"]["dimensions"] == {"served": ["endpoint"], "configured": ["region"]}
            assert pending["changes"]["first_seen"]["served"] is None and "switch" in pending["note"]
            assert streams["orders"]["definition_pending"] is None and body["pending_streams"] == []

            body = client.get("/api/v1/metrics", headers=READ).json()
            metrics = {m["name"]: m for m in body["metrics"]}
            assert set(metrics) == {"latency"}  # new_users needs first_seen: 404 until the switch
            assert metrics["latency"]["pane"] == "10s" and metrics["latency"]["dimensions"] == ["endpoint", "region"]
            assert metrics["latency"]["definition_pending"] == pending
            assert [(m["name"], m["stream"]) for m in body["pending_metrics"]] == [("new_users", "http")]
            assert body["pending_metrics"][0]["definition_pending"] == pending
            # What they list is what queries answer: a 10 s step, the removed dimension, no new_users.
            answer = client.get("/api/v1/query", params={"metric": "latency", "stat": "count", "step": "10s",
                                                         "group_by": "endpoint"}, headers=READ)
            assert answer.status_code == 200, answer.text
            assert client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen"},
                              headers=READ).status_code == 404
    finally:
        ctx.store.close()
