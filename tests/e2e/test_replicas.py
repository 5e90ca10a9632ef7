"""Two `sketchboard api` processes on one PostgreSQL store, as docker-compose.yml runs them:
batches committed to the store (through the store's own commit API, as the pipeline's driver
commits them: no Spark start needed to make changes) reach a websocket client on each replica
with the same points, woken by NOTIFY; one replica leads (alert evaluator, webhook notifier,
lag sampler); kill -9 it and the other takes over within one evaluation interval, and the
webhook receiver gets no duplicate notification."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time

import pytest
import yaml
from websockets.sync.client import connect

from store import BatchCommit, PaneData, PanePartial
from store.postgres import PostgresPaneStore
from tests.api.test_ws import recv_until
from tests.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

EVAL_INTERVAL_S = 4  # the test's alert_eval_interval: a takeover must come within one
LEASE_TTL_S = 1
PANE = 10_000
DIMS = {"country": "DE", "payment_method": "card"}

RULE = {"rules": [{
    "name": "orders_seen", "kind": "threshold", "metric": "orders", "stat": "count", "window": "1m",
    "provisional": True, "op": ">", "threshold": 0, "for": "0s", "labels": {"severity": "info"},
    "annotations": {"summary": "{{ $value }} orders in the last minute"}}]}


def commit(store: PostgresPaneStore, batch_id: int, count: int) -> int:
    """One batch as the pipeline's driver commits it: `count` orders in the pane holding now."""
    now = int(time.time() * 1000)
    start = now // PANE * PANE
    store.commit_batch(BatchCommit("main", batch_id, [PanePartial("orders", start, start + PANE, DIMS,
                                                                  PaneData(count=count))], events_read=count,
                                   max_event_ms={"orders": now}), lateness_ms={"orders": 60_000}, now_ms=now)
    return start


def recv_points(ws, sub_id: str, t: int, value: float, timeout: float = 20) -> tuple[dict, float]:
    """The first points message carrying `value` at time `t`, and when it arrived (monotonic)."""

    def point(msg: dict) -> dict | None:
        if msg["type"] != "points" or msg["id"] != sub_id:
            return None
        points = {p["t"]: p for s in msg["series"] for p in s["points"]}
        return points[t] if t in points and points[t]["value"] == value else None

    msg = recv_until(ws, lambda m: point(m) is not None, timeout)
    return point(msg), time.monotonic()


def leader(service) -> dict:
    return service.get("/api/v1/pipeline")["leader"]


def metric(service, name: str, labels: str = "") -> float:
    text = service.http.get("/metrics").text
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_two_replicas_share_the_store_one_leads_and_the_other_takes_over(service_factory, postgres_server,
                                                                          tmp_path):
    dsn = postgres_server.fresh_dsn()
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(RULE))
    with Receiver() as rx:
        settings = dict(store_backend="postgres", postgres_dsn=dsn, alerts_config=str(rules),
                        alert_eval_interval=f"{EVAL_INTERVAL_S}s", leader_lease_ttl=f"{LEASE_TTL_S}s",
                        alert_webhook_url=rx.url, data_dir=str(tmp_path / "shared"), ws_poll_interval=1.0)
        a = service_factory(replica_id="replica-a", **settings)
        b = service_factory(replica_id="replica-b", **settings)
        a.start_api()
        b.start_api()
        replicas = {"replica-a": a, "replica-b": b}
        holder = a.wait_for(lambda: leader(a)["holder"], 20, "a replica to take the lease")
        assert leader(b)["holder"] == holder  # both see the same row
        first, other = replicas[holder], replicas[({"replica-a", "replica-b"} - {holder}).pop()]
        assert leader(first)["leading"] and not leader(other)["leading"]
        assert metric(first, "sketchboard_leader", f'{{replica="{holder}"}}') == 1.0
        assert metric(other, "sketchboard_leader", f'{{replica="{leader(other)["this_replica"]}"}}') == 0.0

        store = PostgresPaneStore(dsn, pool_size=1)  # the pipeline's side of the store
        with contextlib.ExitStack() as opened:
            opened.callback(store.close)
            sockets = {name: opened.enter_context(connect(s.base.replace("http", "ws") + "/api/v1/ws",
                                                          open_timeout=10)) for name, s in replicas.items()}
            query = {"metric": "orders", "stat": "count", "from": "now-5m", "step": "10s"}
            for ws in sockets.values():
                ws.send(json.dumps({"type": "subscribe", "id": "o", "query": query}))
            for ws in sockets.values():
                while json.loads(ws.recv(timeout=20))["type"] != "snapshot":
                    pass
            committed = time.monotonic()
            pane = commit(store, 1, 5)
            got = {name: recv_points(ws, "o", pane, 5.0) for name, ws in sockets.items()}
            assert got["replica-a"][0] == got["replica-b"][0]  # the same point, revision, finality
            # ws_poll_interval is 1 s: sooner than that is NOTIFY waking the hubs.
            delays = {name: round(arrived - committed, 3) for name, (_, arrived) in got.items()}
            print(f"commit -> websocket point on each replica (s): {delays}")

            # The rule fires: one notification, from the leader.
            rx.wait_for(lambda reqs: any(r.body and r.body["status"] == "firing" for r in reqs), 30)
            assert [r.body["status"] for r in rx.requests] == ["firing"]
            assert metric(other, "sketchboard_alert_notifications_total", '{outcome="sent"}') == 0.0

            # kill -9 the leader: nothing hands the lease over; the other waits out the ttl.
            os.killpg(first.procs["api"].pid, signal.SIGKILL)
            first.procs.pop("api").wait(10)
            killed = time.monotonic()
            other.wait_for(lambda: leader(other)["leading"], 20, "the other replica to take over", every_s=0.05)
            took = time.monotonic() - killed
            print(f"takeover after kill -9: {took:.2f} s (lease ttl {LEASE_TTL_S} s, eval interval {EVAL_INTERVAL_S} s)")
            assert took <= EVAL_INTERVAL_S
            row = leader(other)
            assert row["holder"] == row["this_replica"] and row["epoch"] == 2

            # The new leader evaluates (the rule still fires) and finds it delivered: no second POST.
            deduplicated = '{outcome="deduplicated"}'
            other.wait_for(lambda: metric(other, "sketchboard_alert_notifications_total", deduplicated) >= 1,
                           3 * EVAL_INTERVAL_S + 10, "the new leader to evaluate the firing rule")
            pane2 = commit(store, 2, 3)  # the survivor still serves live points
            recv_points(sockets[row["holder"]], "o", pane2, 8.0 if pane2 == pane else 3.0)
            time.sleep(EVAL_INTERVAL_S)
            assert [r.body["status"] for r in rx.requests] == ["firing"], rx.requests
