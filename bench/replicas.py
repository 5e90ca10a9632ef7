"""API replicas on one store: how fast a commit reaches websocket clients on every replica, and
how fast a replica takes over the leader lease when the leader is killed.

Starts two `sketchboard api` processes (tests/procs.py) on one store: a PostgreSQL server the
script starts (tests/postgres_server.py; commits NOTIFY, hubs LISTEN) and, for comparison, one
SQLite file (hubs poll every ws_poll_interval). Then:

1. Commit -> websocket: --commits batches committed through the store's commit API (as the
   pipeline's driver does), one every --every seconds; for each, the time from commit_batch
   returning to the points message on a client of each replica. Prints p50/p99/max per store.
2. Takeover (PostgreSQL, then SQLite): --kills times, kill -9 the replica holding the lease,
   time until the other reports `leading` in GET /api/v1/pipeline; the killed one is started
   again as a follower. Prints each time and the max, against the lease ttl.

    python -m bench.replicas --commits 50 --kills 5 --ttl 2s

Run by hand: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from websockets.sync.client import connect

from store import BatchCommit, PaneData, PanePartial
from tests.procs import Service

PANE = 10_000
DIMS = {"country": "DE", "payment_method": "card"}


def commit(store, batch_id: int) -> tuple[int, int]:
    now = int(time.time() * 1000)
    start = now // PANE * PANE
    store.commit_batch(BatchCommit("main", batch_id, [PanePartial("orders", start, start + PANE, DIMS,
                                                                  PaneData(count=1))], events_read=1,
                                   max_event_ms={"orders": now}), lateness_ms={"orders": 60_000}, now_ms=now)
    return start, batch_id


class Client:
    """A websocket client subscribed to the orders count; records when each pane's count arrives."""

    def __init__(self, base: str):
        self.ws = connect(base.replace("http", "ws") + "/api/v1/ws", open_timeout=10).__enter__()  # closed in close()
        self.ws.send(json.dumps({"type": "subscribe", "id": "o", "query": {
            "metric": "orders", "stat": "count", "from": "now-5m", "step": "10s"}}))
        self.seen: dict[tuple[int, float], float] = {}  # (pane, count) -> monotonic arrival
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for text in self.ws:
                msg = json.loads(text)
                if msg["type"] == "snapshot":
                    self.ready.set()
                if msg["type"] == "points":
                    at = time.monotonic()
                    for s in msg["series"]:
                        for p in s["points"]:
                            self.seen.setdefault((p["t"], p["value"]), at)
        except Exception:
            pass

    def close(self) -> None:
        self.ws.close()


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def run(kind: str, store_settings: dict, open_store, args, root: Path) -> None:
    settings = dict(store_settings, leader_lease_ttl=args.ttl, alert_eval_interval="10s",
                    data_dir=str(root / "shared"), alerts_config=None, ws_poll_interval=args.poll)
    replicas = []
    for i in range(2):
        folder = root / f"{kind}-{i}"
        folder.mkdir()
        replicas.append(Service(folder, dict(settings, replica_id=f"{kind}-{i}")))
    try:
        for r in replicas:
            r.start_api()
        clients = [Client(r.base) for r in replicas]
        for c in clients:
            c.ready.wait(20)
        store = open_store()
        counts: dict[int, float] = {}
        delays: list[float] = []
        for n in range(1, args.commits + 1):
            start, _ = commit(store, n)
            done = time.monotonic()
            counts[start] = counts.get(start, 0) + 1
            deadline = done + 10
            for c in clients:
                while (start, counts[start]) not in c.seen and time.monotonic() < deadline:
                    time.sleep(0.002)
                if (start, counts[start]) in c.seen:
                    delays.append(c.seen[(start, counts[start])] - done)
            time.sleep(args.every)
        print(f"{kind}: commit -> websocket point, {len(delays)} deliveries to 2 replicas:"
              f" p50 {statistics.median(delays) * 1000:.0f} ms, p99 {pct(delays, 0.99) * 1000:.0f} ms,"
              f" max {max(delays) * 1000:.0f} ms (ws_poll_interval {args.poll} s)", flush=True)
        for c in clients:
            c.close()
        store.close()

        took = []
        for _ in range(args.kills):
            holder = replicas[0].wait_for(lambda: replicas[0].get("/api/v1/pipeline")["leader"]["holder"], 30,
                                          "a leader")
            leader = next(r for r in replicas if r.get("/api/v1/pipeline")["leader"]["this_replica"] == holder)
            other = next(r for r in replicas if r is not leader)
            os.killpg(leader.procs["api"].pid, signal.SIGKILL)
            leader.procs.pop("api").wait(10)
            killed = time.monotonic()
            other.wait_for(lambda: other.get("/api/v1/pipeline")["leader"]["leading"], 60, "a takeover", every_s=0.02)
            took.append(time.monotonic() - killed)
            leader.start_api()  # back as a follower
        print(f"{kind}: takeover after kill -9 of the leader (ttl {args.ttl}): "
              + ", ".join(f"{t:.2f}" for t in took) + f" s; max {max(took):.2f} s", flush=True)
    finally:
        for r in replicas:
            r.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=50, help="batches committed, one every --every seconds")
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--kills", type=int, default=5, help="kill -9 of the leader, each time")
    parser.add_argument("--ttl", default="2s", help="leader_lease_ttl")
    parser.add_argument("--poll", type=float, default=0.2, help="ws_poll_interval (SQLite's hub polls this often)")
    parser.add_argument("--store", choices=("postgres", "sqlite", "both"), default="both")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sketchboard-bench-replicas-"))
    try:
        if args.store in ("postgres", "both"):
            from store.postgres import PostgresPaneStore
            from tests.postgres_server import PostgresServer

            server = PostgresServer()
            server.start()
            try:
                dsn = server.fresh_dsn()
                run("postgres", {"store_backend": "postgres", "postgres_dsn": dsn},
                    lambda: PostgresPaneStore(dsn, pool_size=1), args, root)
            finally:
                server.stop()
        if args.store in ("sqlite", "both"):
            from store import SqlitePaneStore

            run("sqlite", {}, lambda: SqlitePaneStore(root / "shared" / "store.db"), args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
