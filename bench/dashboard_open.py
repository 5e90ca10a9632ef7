"""Opening a dashboard: how long until every panel of the demo's overview (config/dashboards/)
has its snapshot, over a day of demo-shaped events, at its default range and at 24 h. Each
run opens a websocket and subscribes to every panel at once, as the page does, over real HTTP
on loopback; the first open is cold (nothing cached), the others find the final points of the
sketch stats in the point cache, as a second viewer would. Prints figures; asserts nothing.

    python -m bench.dashboard_open                    # 300 000 events over 24 h
    python -m bench.dashboard_open --events 3000000   # a day of 3 M events
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from websockets.sync.client import connect

from api.app import create_app
from api.context import ApiContext
from bench.day_of_data import STREAM, demo_partials
from bench.serve import nearest_rank, serving
from catalog import format_duration_ms, load_catalog
from dashboard.model import BAND_STATS, Panel
from dashboard.provisioning import load_dashboards_dir
from ingest.log.sqlite import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS, REPO_ROOT
from store import BatchCommit, SqlitePaneStore
from store.tiers import catalog_layouts

# The page's choices (dashboard/static/util.js autoStep, heatmap.js HEATMAP_STATS), in Python.
NICE_STEPS_S = [10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]
HEATMAP_STATS = ["p1", "p10", "p25", "p50", "p75", "p90", "p99", "count"]


def auto_step(span_ms: int, pane_ms: int) -> str:
    want = max(span_ms / 120, pane_ms)
    return format_duration_ms(next(s * 1000 for s in NICE_STEPS_S if s * 1000 >= want and s * 1000 % pane_ms == 0))


def panel_query(panel: Panel, range_ms: int, pane_ms: int) -> dict:
    """What dashboard/static/panels.js panelQuery subscribes to."""
    q: dict = {"metric": panel.metric, "from": f"now-{format_duration_ms(range_ms)}", "to": "now",
               "step": format_duration_ms(panel.step) if panel.step else auto_step(range_ms, pane_ms)}
    if panel.kind == "heatmap":
        q["stats"] = HEATMAP_STATS
    elif panel.stat == "band":
        q["stats"] = list(BAND_STATS)
    else:
        q["stat"] = panel.stat
    if panel.group_by and panel.kind != "heatmap":
        q["group_by"] = panel.group_by
    if panel.filters:
        q["filters"] = panel.filters
    if panel.window:
        q["window"] = format_duration_ms(panel.window)
    return q


def open_once(port: int, queries: list[dict]) -> tuple[float, dict[str, float]]:
    """Seconds until every snapshot arrived, and each panel's own share: the server answers one
    connection's subscriptions in turn, so the gap since the snapshot before it."""
    per_panel: dict[str, float] = {}
    with connect(f"ws://127.0.0.1:{port}/api/v1/ws", max_size=None) as ws:
        t0 = time.perf_counter()
        for i, q in enumerate(queries):
            ws.send(json.dumps({"type": "subscribe", "id": f"p{i}", "query": q}))
        while len(per_panel) < len(queries):
            msg = json.loads(ws.recv(timeout=120))
            if msg.get("type") == "error":
                raise RuntimeError(f"panel {msg.get('id')}: {msg.get('reason')}")
            if msg.get("type") == "snapshot":
                per_panel[msg["id"]] = time.perf_counter() - t0
        total = time.perf_counter() - t0
    arrivals = sorted(per_panel.items(), key=lambda item: item[1])
    return total, {sub: at - (arrivals[i - 1][1] if i else 0.0) for i, (sub, at) in enumerate(arrivals)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=10, help="opens per range (the first is cold)")
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    overview = load_dashboards_dir(REPO_ROOT / "config" / "dashboards", catalog)["overview"]
    end_ms = int(time.time() * 1000) // 10_000 * 10_000
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db", synchronous="OFF")
        store.configure_tiers(catalog_layouts(catalog), now_ms=end_ms)
        log = SqliteEventLog(Path(tmp) / "log.db", synchronous="OFF")
        t = time.perf_counter()
        for batch_id, partials in enumerate(demo_partials(catalog, args.events, args.hours, end_ms, args.batch)):
            n = sum(p.data.count for p in partials)
            store.commit_batch(BatchCommit("main", batch_id, partials, n, {STREAM: max(p.end_ms for p in partials) - 1},
                                           {}, read_by_stream={STREAM: n}), lateness_ms={STREAM: 30_000}, now_ms=end_ms)
        print(f"{args.events:,} demo events over {args.hours:g} h committed in {time.perf_counter() - t:.0f} s")
        started = time.time()
        ctx = ApiContext(catalog=catalog, log=log, store=store, clock=lambda: end_ms / 1000 + time.time() - started)
        try:
            with serving(create_app(ctx)) as port:
                print(f"\nOpening {overview.name!r} ({len(overview.panels)} panels, one websocket, every subscription"
                      f" sent at once), {args.repeat} opens per range (ms):")
                print(f"{'range':<8}{'cold':>10}{'warm p50':>10}{'warm p99':>10}   costliest panel, cold (its share)")
                for range_ms in (overview.range, 86_400_000):
                    queries = [panel_query(p, range_ms, catalog.streams[catalog.metrics[p.metric].stream].pane)
                               for p in overview.panels]
                    runs = [open_once(port, queries) for _ in range(args.repeat)]
                    cold, per_panel = runs[0]
                    warm = sorted(total for total, _ in runs[1:]) or [math.nan]
                    slowest = max(per_panel, key=per_panel.get)
                    panel = overview.panels[int(slowest[1:])]
                    p99 = nearest_rank(warm, 0.99)
                    print(f"{format_duration_ms(range_ms):<8}{cold * 1000:10.0f}{statistics.median(warm) * 1000:10.0f}"
                          f"{p99 * 1000:10.0f}   {panel.title} ({per_panel[slowest] * 1000:.0f})")
        finally:
            store.close()
            log.close()


if __name__ == "__main__":
    main()
