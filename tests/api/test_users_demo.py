"""The shipped configuration's enrichment of http_requests from the `users` table, and from `plans`
through the view `user_plans` (config/streams.yaml), over the demo's own traffic: the users' rows,
their plan changes and sign-ups (demo/users.py), the plans' rows (demo/plans.py) and the requests, POSTed to the API as the demo producer does, tick by tick on one clock, and committed by
the pipeline's driver-side stand-in (tests/api/test_ws_support.py applies the pure as-of lookup of
store/table_versions.py; no Spark). The requests per plan and per tier and minute the query path
answers equal an exact pandas computation with as-of semantics (each request gets the newest row of
its user appended at or before min(its time, its append time), and the newest row of that user's
plan then; "" where there is none), and the misses show in GET /api/v1/pipeline."""

from __future__ import annotations

import pandas as pd

from api.feeds import PipelineFeed, cdc_summary
from demo.traffic import DemoTraffic
from demo.users import PLAN_NAMES
from tests.api.conftest import NOW_MS
from tests.api.test_join_demo import post_all, query
from tests.api.test_ws_support import drain_log_into_store

MIN = 60_000
SECONDS = 150          # of demo traffic, one tick per second (the demo's clock)
REQUESTS_PER_S = 40


def post_rows(client, table: str, rows: list[dict], chunk: int = 500) -> None:  # under the test app's body limit
    for i in range(0, len(rows), chunk):
        answer = client.post(f"/api/v1/tables/{table}", json=rows[i:i + chunk])
        assert answer.status_code == 200 and answer.json()["upserts"] == len(rows[i:i + chunk]), answer.text


def as_of(left: pd.DataFrame, rows: list[dict], by: str) -> pd.DataFrame:
    """`left` with the columns of the newest of `rows` (matched `by`) appended at or before its `at`."""
    table = pd.DataFrame(rows).drop(columns="time").reset_index(names="seq").sort_values(["append_ms", "seq"])
    return pd.merge_asof(left.sort_values("at"), table.drop(columns="seq").rename(columns={"append_ms": "at"}),
                         on="at", by=by, direction="backward", allow_exact_matches=True)


def expected(rows: list[dict], plans: list[dict], events: list[dict]) -> pd.DataFrame:
    """The requests with the plan and tier pandas finds for them, as of min(time, append time)."""
    requests = pd.DataFrame(events)
    requests["at"] = requests[["time", "append_ms"]].min(axis=1)
    merged = as_of(requests.drop(columns="append_ms"), rows, "user_id").reset_index(drop=True)
    merged["plan_id"] = merged["plan"]
    with_plan = merged["plan_id"].notna()
    merged.loc[with_plan, "tier"] = as_of(merged[with_plan].reset_index(), plans, "plan_id").set_index("index")["tier"]
    merged[["plan", "tier"]] = merged[["plan", "tier"]].fillna("")
    merged["minute"] = merged["time"] - merged["time"] % MIN
    return merged


def test_the_demo_requests_per_plan_are_the_exact_as_of_counts_and_misses_show(client, ctx, clock):
    clock.now = NOW_MS / 1000 - 30 * 60   # the demo runs from half an hour ago, for SECONDS
    traffic = DemoTraffic(ctx.catalog, seed=3, clock=clock)
    rows: list[dict] = []     # every users row posted, with its append time
    plans: list[dict] = []    # every plans row posted, with its append time
    events: list[dict] = []   # every request posted, with its append time
    for _ in range(SECONDS):
        append_ms = round(clock() * 1000)
        # As the producer does each tick: the table's rows first (all users at the first), then the events.
        for table, changes in traffic.table_changes().items():
            post_rows(client, table, changes)
            (rows if table == "users" else plans).extend({**r, "append_ms": append_ms} for r in changes)
        requests = traffic.generate(REQUESTS_PER_S)["http_requests"]
        post_all(client, "http_requests", requests)
        events += [{**e, "append_ms": append_ms} for e in requests]
        clock.advance(1.0)
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, NOW_MS)

    users = traffic.user_table.users
    initial = [r for r in rows if r["append_ms"] == rows[0]["append_ms"]]
    assert 0.985 * len(users) < len(initial) < len(users)  # every user but a few new ones
    assert len(rows) - len(initial) > SECONDS / 5  # then plan changes and sign-ups, every few seconds
    want = expected(rows, plans, events)
    assert set(want["plan"]) == {"", *PLAN_NAMES}
    assert set(want["tier"]) == {"", "free", "paid", "business"}
    # The as-of lookup matters: some requests saw a plan their user no longer has at the end.
    latest = pd.DataFrame(rows).groupby("user_id")["plan"].last()
    assert (want["plan"] != want["user_id"].map(latest).fillna("")).sum() > 0

    lo, hi = int(want["minute"].min()), int(want["minute"].max()) + MIN
    answer = query(client, metric="requests", stat="count", group_by="plan", **{"from": lo, "to": hi, "step": "1m"})
    got = {(s["group"]["plan"], p["t"]): p["value"] for s in answer["series"] for p in s["points"] if p["value"]}
    counts = want.groupby(["plan", "minute"]).size()
    assert got == {(plan, int(minute)): int(n) for (plan, minute), n in counts.items()}
    # Two joins away: per tier (users.plan -> plans.plan_id -> tier, through the view user_plans).
    answer = query(client, metric="requests", stat="count", group_by="tier", **{"from": lo, "to": hi, "step": "1m"})
    got = {(s["group"]["tier"], p["t"]): p["value"] for s in answer["series"] for p in s["points"] if p["value"]}
    counts = want.groupby(["tier", "minute"]).size()
    assert got == {(tier, int(minute)): int(n) for (tier, minute), n in counts.items()}
    # Filtered like any dimension: the paid tier's requests per country (both enriched columns).
    answer = query(client, metric="requests", stat="count", group_by="country", filter="tier=paid",
                   **{"from": lo, "to": hi, "step": "1m"})
    got = {(s["group"]["country"], p["t"]): p["value"] for s in answer["series"] for p in s["points"] if p["value"]}
    counts = want[want["tier"] == "paid"].groupby(["country", "minute"]).size()
    assert got and got == {(country, int(minute)): int(n) for (country, minute), n in counts.items()}

    # The misses: requests of users with no row at their time (the unsynced users, and requests
    # stamped just before the initial load reached the log), counted, never dropped (every plan
    # has its row from the start: the misses of the view are those of the users).
    misses = int((want["plan"] == "").sum())
    assert 0 < misses < 0.05 * len(events)
    assert client.get("/api/v1/pipeline").json()["streams"]["http_requests"]["enrich_misses"] == {"user_plans": misses}
    # And in the websocket's `pipeline` messages, which the dashboard's status strip shows.
    (message,) = PipelineFeed(ctx.store, ctx.log, ctx.catalog).poll()
    assert message["enrich_misses"] == {"http_requests": {"user_plans": misses}} and message["cdc"] == []


def test_the_status_strips_cdc_summary_names_state_lag_errors_and_schema_changes(ctx):
    status = {"stream": "plans", "table": "public.plans", "state": "streaming", "lag_bytes": 120,
              "lag_seconds": 0.4, "error": None, "dsn": "${PG}",
              "schema": {"missing": [], "ignored": ["note"], "added": ["tier"], "removed": ["old"]}}
    assert cdc_summary(status) == {"stream": "plans", "table": "public.plans", "state": "streaming",
                                   "lag_bytes": 120, "lag_seconds": 0.4, "error": None,
                                   "schema_changed": ["+tier", "-old"], "snapshot_rows_done": None,
                                   "snapshot_rows_estimate": None}
    snapshotting = cdc_summary({**status, "state": "snapshotting", "snapshot_rows_done": 20_000,
                                "snapshot_rows_estimate": 1_000_000})  # the strip shows the snapshot's progress
    assert (snapshotting["snapshot_rows_done"], snapshotting["snapshot_rows_estimate"]) == (20_000, 1_000_000)
    assert cdc_summary({**status, "schema": None, "state": "error", "error": "connection refused"})["schema_changed"] == []
    feed = PipelineFeed(ctx.store, ctx.log, ctx.catalog, cdc_status=lambda: [status])
    assert feed.poll()[0]["cdc"] == [cdc_summary(status)]
