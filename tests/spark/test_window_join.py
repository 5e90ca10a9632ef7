"""A stream-stream window join with real Spark (aggregates/joins.py): searches and the clicks on
their results, with click delays in and out of the window, clicks later than the allowed
lateness, clicks before their search, clicks on unknown searches and a restart of the pipeline
in the middle (and a crash inside a store commit); searches, pairs, clicked, the CTR (stat ratio) and the latency percentiles per
window and category are compared with an exact pandas computation of the same join."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from aggregates.pipeline import Pipeline
from catalog import parse_catalog
from store import joins as store_joins
from tests.log_backends import ON_BOTH_STACKS
from tests.spark.events import T0
from tests.spark.test_pipeline import Service

pytestmark = [pytest.mark.spark, ON_BOTH_STACKS]

MIN = 60_000
WITHIN = 2 * MIN
CONFIG = """
streams:
  searches: {key_field: search_id, dimensions: [query_category], distinct: [user_id], partitions: 2,
             allowed_lateness: 30s, max_future_skew: 2h}  # the key is no distinct field: carried for the join
  clicks: {key_field: search_id, dimensions: [position], partitions: 2, allowed_lateness: 30s, max_future_skew: 2h}
joins:
  - name: search_clicks
    left: {stream: searches, key: search_id}
    right: {stream: clicks, key: search_id}
    within: 2m
    late_horizon: 10m
"""
CATEGORIES = ["books", "toys", "music"]


def make_events(seed: int):
    """Searches over 8 minutes; clicks: on time, later than the lateness, before their search
    (the search is logged in a later phase), out of the window, and on unknown searches."""
    rng = np.random.default_rng(seed)
    n = 240
    searches = pd.DataFrame({"search_id": [f"s{i}" for i in range(n)],
                             "time": T0 + rng.integers(0, 8 * MIN, n),
                             "query_category": rng.choice(CATEGORIES, n, p=[0.5, 0.3, 0.2]),
                             "user_id": [f"u{u}" for u in rng.integers(0, 50, n)]})
    searches["phase"] = np.where(np.arange(n) < 180, 1, 3)  # the last 60 searches are logged late
    clicks = []
    for s in searches.itertuples():
        for _ in range(rng.choice([0, 1, 2], p=[0.5, 0.35, 0.15])):
            delay = int(rng.exponential(40_000)) if rng.random() < 0.85 else int(rng.integers(WITHIN + 1, 4 * MIN))
            late = rng.random() < 0.2
            phase = 2 if (late or s.phase == 3) else 1
            clicks.append((s.search_id, s.time + delay, phase))
    for i in range(15):  # no such search
        clicks.append((f"unknown{i}", T0 + int(rng.integers(0, 8 * MIN)), int(rng.choice([1, 2]))))
    clicks = pd.DataFrame(clicks, columns=["search_id", "time", "phase"])
    clicks["position"] = [str(p) for p in rng.integers(1, 10, len(clicks))]
    return searches, clicks


def exact(searches: pd.DataFrame, clicks: pd.DataFrame):
    pairs = searches.merge(clicks, on="search_id", suffixes=("", "_click"))
    pairs["latency"] = pairs["time_click"] - pairs["time"]
    pairs = pairs[(pairs["latency"] >= 0) & (pairs["latency"] <= WITHIN)]
    return pairs


def as_events(df: pd.DataFrame, fields) -> list[dict]:
    return [{"time": int(r["time"]), **{f: str(r[f]) for f in fields}} for _, r in df.iterrows()]


def series(service, metric, stat, **params) -> dict:
    answer = service.query(metric=metric, stat=stat, **{"from": T0, "to": T0 + 12 * MIN}, step="1m", **params)
    # Unmatched clicks' rows carry no category (no search is known): group "" holds only them.
    return {(s["group"].get("query_category"), p["t"]): p["value"] for s in answer["series"] for p in s["points"]
            if p["value"] is not None and s["group"].get("query_category") != ""}


def test_the_join_equals_the_exact_join_with_late_and_early_clicks_unknown_keys_and_a_restart(tmp_path, spark,
                                                                                           log_backend, store_backend,
                                                                                           monkeypatch):
    catalog = parse_catalog(CONFIG)
    service = Service(log_backend.new(tmp_path), catalog, spark, store_backend)
    searches, clicks = make_events(17)

    def drain() -> None:  # a new pipeline each time: a restart on the same store and log
        config = service.test_log.pipeline_config(max_records_per_batch=100_000, max_records_per_task=20_000)
        Pipeline(spark, catalog, store_backend.reopen(service.store), config, log=service.test_log.open(catalog),
                 clock=lambda: (T0 + 600_000) / 1000).run_until_drained()

    for phase in (1, 2, 3):
        if len(s := searches[searches["phase"] == phase]):
            service.post("searches", as_events(s, ["search_id", "query_category", "user_id"]))
        if len(c := clicks[clicks["phase"] == phase]):
            service.post("clicks", as_events(c, ["search_id", "position"]))
        if phase == 2:
            # The pipeline dies inside its store commit, after the join's state was written:
            # nothing of the batch stays, and the batch Spark replays at the next start is joined afresh.
            real_apply = store_joins.apply

            def crash(*args, **kwargs):
                real_apply(*args, **kwargs)
                raise RuntimeError("killed in the middle of the store commit")

            monkeypatch.setattr(store_joins, "apply", crash)
            with pytest.raises(Exception, match="killed in the middle"):
                drain()
            monkeypatch.setattr(store_joins, "apply", real_apply)
        drain()
    # A click an hour on moves the clicks' watermark only: the join's clock is the lower of the two
    # streams' watermarks, so nothing leaves the state on the clicks' progress alone.
    service.post("clicks", [{"time": T0 + 60 * MIN, "search_id": "last", "position": "1"}])
    drain()
    assert service.store.join_sizes()["search_clicks"].left_rows == len(searches)
    # A search an hour on too: the clock passes every window + late horizon, the state empties
    # and the clicks that matched nothing are counted unmatched at their own times.
    service.post("searches", [{"time": T0 + 60 * MIN, "search_id": "last_search", "query_category": "books",
                               "user_id": "u1"}])
    drain()

    pairs = exact(searches, clicks)
    minute = lambda t: t - (t - T0) % MIN  # noqa: E731
    searches["m"], pairs["m"] = searches["time"].map(minute), pairs["time"].map(minute)
    want_searches = searches.groupby(["query_category", "m"]).size()
    want_pairs = pairs.groupby(["query_category", "m"]).size()
    want_clicked = pairs.groupby(["query_category", "m"])["search_id"].nunique()
    # (A window with searches and no pair sums to 0: left out, as pandas leaves it out.)
    got = {v: {k: x for k, x in series(service, f"search_clicks_{v}", "sum", group_by="query_category").items() if x}
           for v in ("searches", "pairs", "clicked")}
    assert got["searches"] == {k: float(v) for k, v in want_searches.items()}
    assert got["pairs"] == {k: float(v) for k, v in want_pairs.items()}
    assert got["clicked"] == {k: float(v) for k, v in want_clicked.items()}
    ctr = series(service, "search_clicks_clicked", "ratio", group_by="query_category")
    assert ctr == pytest.approx({k: want_clicked.get(k, 0) / n for k, n in want_searches.items()})
    # Latency percentiles per window: a latency of the window's pairs, whose rank is within the
    # quality bar (DataSketches' 1.33 %) plus one value (the sketch is exact below k = 200 values;
    # which of two neighbours a rank on a boundary names is the sketch's rule).
    lists = {m: np.sort(v.to_numpy()) for m, v in pairs.groupby("m")["latency"]}
    for q in (0.5, 0.9):
        got_p = series(service, "search_clicks_latency", f"p{int(q * 100)}")
        assert set(got_p) == {(None, m) for m in lists}
        for (_, m), value in got_p.items():
            values = lists[m]
            assert value in values
            rank = np.searchsorted(values, value, side="right") / len(values)
            assert abs(rank - q) <= 0.0133 + 1 / len(values), (q, m, value, list(values))
    # Clicks that matched no search (unknown keys, out of the window) are counted, not lost.
    matched = set(zip(pairs["search_id"], pairs["time_click"]))
    unmatched = clicks[[(s, t) not in matched for s, t in zip(clicks["search_id"], clicks["time"])]]
    got_unmatched = {k: x for k, x in series(service, "search_clicks_unmatched_right", "sum").items() if x}
    want_unmatched = unmatched.groupby(unmatched["time"].map(minute)).size()
    assert got_unmatched == {(None, m): float(n) for m, n in want_unmatched.items()}
    sizes = service.store.join_sizes()["search_clicks"]
    assert (sizes.left_rows, sizes.pending_right, sizes.pairs, sizes.unmatched_right) == (
        1, 1, len(pairs), len(unmatched))  # the last search and the last click wait
    status = service.client.get("/api/v1/pipeline").json()["joins"]["search_clicks"]
    assert (status["left_rows"], status["pending_right"], status["pairs"], status["unmatched_right"]) == (
        1, 1, len(pairs), len(unmatched))
    metrics = service.client.get("/metrics").text
    assert f'sketchboard_join_unmatched_right_total{{join="search_clicks"}} {float(len(unmatched))}' in metrics
    # The clicks later than the allowed lateness landed in final panes: published corrections.
    assert service.store.progress("main").streams["search_clicks"].corrections > 0
    service.log.close()
