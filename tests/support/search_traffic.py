"""The demo's searches and the clicks on their results (demo/searches.py through DemoTraffic, so
the events carry exactly the shipped streams' fields), made on a simulated clock that ends now,
and the exact window join over them: what the CTR of the shipped `search_clicks` join must be."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from catalog import Catalog
from demo import DemoTraffic


@dataclass(frozen=True)
class SearchTraffic:
    searches: list[dict]
    clicks: list[dict]  # the clicks sent by the end of the clock, in send order


def demo_search_traffic(catalog: Catalog, *, seconds: int, end_s: float, tail_s: float = 0, rate: int = 10,
                        seed: int = 5) -> SearchTraffic:
    """`rate` searches a second for `seconds` up to `tail_s` before `end_s`, and every click sent
    by `end_s` (a tail of 35 minutes lets nearly every click within a 30-minute window come)."""
    clock = [end_s - tail_s - seconds]
    traffic = DemoTraffic(catalog, seed=seed, clock=lambda: clock[0])
    searches: list[dict] = []
    clicks: list[dict] = []
    for _ in range(seconds):
        searches += traffic.generate_stream("searches", rate)
        clicks += traffic.generate_stream("clicks", 0)
        clock[0] += 1.0
    clock[0] = end_s
    clicks += traffic.generate_stream("clicks", 0)
    return SearchTraffic(searches, clicks)


def exact_ctr(traffic: SearchTraffic, within_ms: int, bucket_ms: int) -> dict[tuple[str, int], tuple[int, int]]:
    """Per (query_category, search time bucket): (searches, searches with a click 0..within_ms
    after them), by the join's definition, from the events alone."""
    search = {e["search_id"]: e for e in traffic.searches}
    clicked = {e["search_id"] for e in traffic.clicks
               if e["search_id"] in search and 0 <= e["time"] - search[e["search_id"]]["time"] <= within_ms}
    out: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for sid, e in search.items():
        row = out[(e["query_category"], e["time"] - e["time"] % bucket_ms)]
        row[0] += 1
        row[1] += sid in clicked
    return {k: (n, c) for k, (n, c) in out.items()}
