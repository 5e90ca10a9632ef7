"""Enrichment through a view (docs/tables.md, "Enrichment through a view") with real Spark on the
embedded log and SQLite: events grouped by a column two joins away (`user_id -> users.plan_id ->
plans.tier`), counted per enriched dimension, equal an exact pandas computation (the left row as of
min(event time, append time), then the right row its foreign key named as of that same time), for
a `left` and an `inner` view in one pipeline, over two batches: updates of both tables appended
after the events (also in the events' own batch) that must not change them, a foreign key moved,
a right row and a left row deleted, keys missing on either side ("" and counted), the views'
changelogs replayed; then a fresh pipeline over the whole log (a reprocess) gives the same panes."""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pytest

from aggregates.pipeline import Pipeline
from catalog import parse_catalog
from ingest.events import EventValidator
from ingest.tables import TableRowValidator
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0
from tests.spark.test_enrichment import appended_at

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan_id, country]
    partitions: 2
  plans:
    kind: table
    key_field: id
    dimensions: [tier]
    values: [price]
  http_requests:
    key_field: user_id
    dimensions: [method]
    partitions: 2
    enrich:
      - {table: user_plans, by: user_id, columns: [country, tier]}
  clicks:
    key_field: user_id
    enrich:
      - {table: paid_users, by: user_id, columns: [plan_id, tier]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
  paid_users: {left: users, right: plans, foreign_key: plan_id, kind: inner}
"""
NOW_MS = T0 + 600_000
PANE = 10_000
USERS = 12  # u0..u11: u10 and u11 have no row at first (u10 comes later, u11 never)


class Log:
    """Appends with chosen append times, and keeps what pandas needs: each record with the append
    time the log gave it (the one asked for on the embedded log; on Kafka the broker's
    LogAppendTime, which replaces it: tests/spark/test_reprocess_enrichment_views.py)."""

    def __init__(self, log, catalog):
        self.log, self.catalog = log, catalog
        self.rows: dict[str, list[dict]] = {"users": [], "plans": []}  # each with append_ms, seq, deleted
        self.events: dict[str, list[dict]] = {"http_requests": [], "clicks": []}

    def table(self, name: str, rows: list[dict], append_ms: int) -> None:
        table = self.catalog.streams[name]
        validator = TableRowValidator(table)
        records = [validator.validate(r, append_ms) for r in rows]
        times = appended_at(self.log, table, records, self.log.append(table, records, append_ms))
        for r, at in zip(rows, times, strict=True):
            self.rows[name].append({**{k: v for k, v in r.items() if k != "_deleted"}, "deleted": bool(r.get("_deleted")),
                                    "append_ms": at, "seq": len(self.rows[name])})

    def events_of(self, name: str, events: list[dict], append_ms: int) -> None:
        stream = self.catalog.streams[name]
        validator = EventValidator(stream)
        records = [validator.validate(e) for e in events]
        times = appended_at(self.log, stream, records, self.log.append(stream, records, append_ms))
        self.events[name] += [{**e, "append_ms": at} for e, at in zip(events, times, strict=True)]


def as_of(events: pd.DataFrame, rows: list[dict], key: str, on: str, columns: list[str]) -> pd.DataFrame:
    """`events` with `columns` of the row of `rows` (by its `key`, matched to the events' `on`)
    newest appended at or before each event's `at`, and `found` (False: none then, or deleted)."""
    table = (pd.DataFrame(rows).sort_values(["append_ms", "seq"]).rename(columns={"append_ms": "at", key: on})
             [["at", on, "deleted", *columns]])
    merged = pd.merge_asof(events.sort_values("at"), table, on="at", by=on, direction="backward")
    merged["found"] = merged["deleted"].eq(False)
    for c in columns:
        merged[c] = merged[c].where(merged["found"], None)
    return merged.drop(columns="deleted")


def expected(log: Log, stream: str, inner: bool, columns: list[str]) -> tuple[Counter, int]:
    """(pane, [method,] *columns) -> count by pandas, and the misses (no left row, or no right row then)."""
    events = pd.DataFrame(log.events[stream]).reset_index(names="i")
    events["at"] = events[["time", "append_ms"]].min(axis=1)
    left = as_of(events, log.rows["users"], "user_id", "user_id", ["plan_id", "country"]).set_index("i")
    left["plan_id"] = left["plan_id"].where(left["plan_id"] != "", None)
    right = as_of(left[left["plan_id"].notna()].reset_index(), log.rows["plans"], "id", "plan_id", ["tier"])
    both = left.join(right.set_index("i")[["tier", "found"]].rename(columns={"found": "right_found"}))
    both["right_found"] = both["right_found"].eq(True)
    row = both["found"] & (both["right_found"] | (not inner))  # the view had a row for the user then
    out = pd.DataFrame({"pane": both["time"] - both["time"] % PANE})
    if "method" in both:
        out["method"] = both["method"]
    for c in columns:
        out[c] = both[c].where(row & (both["right_found"] if c == "tier" else True), None).fillna("")
    counts = out.groupby(list(out.columns)).size()
    return (Counter({k: int(v) for k, v in counts.items()}), int((~(both["found"] & both["right_found"])).sum()))


def stored(store, stream: str, columns: list[str]) -> Counter:
    out: Counter = Counter()
    for p in store.read_panes(stream, 0, 2**62):
        dims = json.loads(p.key.dims)
        out[(p.key.start_ms, *(dims.get(c, "") for c in columns))] += p.data.count
    return out


def test_enrichment_through_a_view_equals_pandas_joining_both_tables_as_of_the_event_time(
        tmp_path, spark, log_backend, store_backend):
    catalog = parse_catalog(CONFIG)
    test_log = log_backend.new(tmp_path)
    log = Log(test_log.open(catalog), catalog)
    store = store_backend.create()
    rng = random.Random(25)

    def traffic(n: int, first_ms: int, span_ms: int, append_ms: int) -> None:
        for stream, extra in (("http_requests", lambda: {"method": rng.choice(["GET", "POST"])}), ("clicks", dict)):
            log.events_of(stream, [{"time": first_ms + rng.randrange(span_ms), "user_id": f"u{rng.randrange(USERS)}",
                                    **extra()} for _ in range(n)], append_ms)

    def drain(name: str, into) -> None:
        Pipeline(spark, catalog, store_backend.reopen(into), test_log.pipeline_config(name=name),
                 clock=lambda: NOW_MS / 1000, log=test_log.open(catalog)).run_until_drained()

    # Batch 1: plans p1, p2 (not p3: a foreign key naming nothing yet), users on p1/p2/p3 and one
    # without a plan; events of the first 100 s appended after them.
    log.table("plans", [{"id": "p1", "tier": "basic", "price": 5}, {"id": "p2", "tier": "gold", "price": 20}], T0)
    log.table("users", [{"user_id": f"u{i}", "plan_id": ["p1", "p2", "p3"][i % 3] if i != 8 else "",
                         "country": ["de", "fr"][i % 2]} for i in range(10)], T0)
    traffic(200, T0 + 1_000, 100_000, T0 + 120_000)
    drain("main", store)
    # Batch 2: changes of both tables after those events (they must not change them): p1's tier,
    # p3 arrives, p2 is deleted; u0 moves to p2 (now gone), u1 to p1, u10 arrives, u5 is deleted.
    # Then new events, late ones stamped before the changes, and after the events, in their batch,
    # more changes of both tables that none of them may see.
    log.table("plans", [{"id": "p1", "tier": "silver", "price": 7}, {"id": "p3", "tier": "bronze", "price": 1},
                        {"id": "p2", "_deleted": True}], T0 + 200_000)
    log.table("users", [{"user_id": "u0", "plan_id": "p2", "country": "de"},
                        {"user_id": "u1", "plan_id": "p1", "country": "fr"},
                        {"user_id": "u10", "plan_id": "p3", "country": "us"}, {"user_id": "u5", "_deleted": True}],
              T0 + 200_000)
    traffic(150, T0 + 200_000, 100_000, T0 + 320_000)
    traffic(60, T0 + 20_000, 50_000, T0 + 320_000)
    log.table("plans", [{"id": "p3", "tier": "platinum", "price": 50}], T0 + 330_000)
    log.table("users", [{"user_id": "u2", "plan_id": "p1", "country": "de"}], T0 + 330_000)
    drain("main", store)

    requests_want, requests_missing = expected(log, "http_requests", False, ["country", "tier"])
    clicks_want, clicks_missing = expected(log, "clicks", True, ["plan_id", "tier"])
    assert {k[3] for k in requests_want} >= {"", "basic", "gold", "silver", "bronze"}  # the cases are covered
    assert {k[2] for k in requests_want} >= {"", "de", "us"}  # left view: the user's country without a plan
    assert "platinum" not in {k[3] for k in requests_want}
    assert 0 < requests_missing < len(log.events["http_requests"]) and 0 < clicks_missing
    assert stored(store, "http_requests", ["method", "country", "tier"]) == requests_want
    assert stored(store, "clicks", ["plan_id", "tier"]) == clicks_want
    progress = store.progress("main").streams
    assert progress["http_requests"].enrich_misses == {"user_plans": requests_missing}
    assert progress["clicks"].enrich_misses == {"paid_users": clicks_missing}
    # The views' changelogs, old and new row per change, replayed from empty give their rows.
    for view in catalog.views:
        rows: dict = {}
        for c in store.view_changes(view, limit=1000):
            assert rows.get(c.key) == (None if c.old is None else dict(c.old))
            rows = {k: v for k, v in rows.items() if k != c.key} | ({} if c.new is None else {c.key: dict(c.new)})
        assert rows == {r.key: r.row for r in store.view_rows(view, limit=1000)} and rows

    # A reprocess: a fresh store over the whole log in one batch gives the same answer.
    fresh = store_backend.create()
    drain("again", fresh)
    assert stored(fresh, "http_requests", ["method", "country", "tier"]) == requests_want
    assert stored(fresh, "clicks", ["plan_id", "tier"]) == clicks_want


def test_a_stream_pinned_as_stored_is_enriched_through_the_view_as_its_stored_definition_declared_it(
        tmp_path, spark, log_backend, store_backend):
    """The view turns from `left` to `inner` in the configuration: until the enriched stream is
    switched, the live pipeline keeps its stored definition, and enriches it through the `left`
    view that definition was computed with (a user whose plan is missing keeps its country),
    while a pipeline of the new configuration (a run) enriches the same events the `inner` way."""
    from sketchboard.definitions import pin_definitions

    old = parse_catalog(CONFIG)
    new = parse_catalog(CONFIG.replace("kind: left}", "kind: inner}", 1))
    test_log = log_backend.new(tmp_path)
    log = Log(test_log.open(old), old)
    store, fresh = store_backend.create(), store_backend.create()

    def drain(catalog, name: str, into) -> None:
        Pipeline(spark, pin_definitions(into, catalog, name, clock=lambda: NOW_MS / 1000), store_backend.reopen(into),
                 test_log.pipeline_config(name=name), clock=lambda: NOW_MS / 1000,
                 log=test_log.open(catalog)).run_until_drained()

    log.table("plans", [{"id": "p1", "tier": "basic", "price": 5}], T0)
    log.table("users", [{"user_id": "u0", "plan_id": "p1", "country": "de"},
                        {"user_id": "u1", "plan_id": "p9", "country": "fr"}], T0)  # p9: no such plan
    log.events_of("http_requests", [{"time": T0 + 1_000, "user_id": "u0", "method": "GET"}], T0 + 5_000)
    drain(old, "main", store)  # records the definition with the left view
    log.events_of("http_requests", [{"time": T0 + 11_000, "user_id": u, "method": "GET"} for u in ("u0", "u1")],
                  T0 + 15_000)
    drain(new, "main", store)  # pinned: the stored definition, through the left view
    drain(new, "run", fresh)  # the new definition: the inner view
    columns = ["country", "tier"]
    assert stored(store, "http_requests", columns) == Counter(
        {(T0, "de", "basic"): 1, (T0 + 10_000, "de", "basic"): 1, (T0 + 10_000, "fr", ""): 1})
    assert stored(fresh, "http_requests", columns) == Counter(
        {(T0, "de", "basic"): 1, (T0 + 10_000, "de", "basic"): 1, (T0 + 10_000, "", ""): 1})


def test_a_small_batch_on_the_driver_enriches_a_pinned_stream_through_its_stored_views_foreign_key(
        tmp_path, spark, log_backend, store_backend):
    """The view's foreign key changes in the configuration (`plan_id` -> `alt_plan_id`): the two
    declarations look up different right rows. Until the enriched stream is switched, a small batch
    on the driver (aggregates/driver_batch.py, whose lookup gathers the right table's keys through
    the view itself) enriches it through the stored declaration's `plan_id`, as the persisted path
    does; a pipeline of the new configuration (a run) follows `alt_plan_id`."""
    from dataclasses import replace

    from sketchboard.definitions import pin_definitions

    # One view only: another view of the same tables by `plan_id` (CONFIG's paid_users) would gather
    # the right rows of `plan_id` anyway and hide a lookup that followed the configured foreign key.
    config = """
streams:
  users: {kind: table, key_field: user_id, dimensions: [plan_id, alt_plan_id, country]}
  plans: {kind: table, key_field: id, dimensions: [tier]}
  http_requests:
    key_field: user_id
    dimensions: [method]
    enrich:
      - {table: user_plans, by: user_id, columns: [country, tier]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
"""
    old = parse_catalog(config)
    new = parse_catalog(config.replace("foreign_key: plan_id, kind: left", "foreign_key: alt_plan_id, kind: left"))
    assert old.views["user_plans"].foreign_key == "plan_id" and new.views["user_plans"].foreign_key == "alt_plan_id"
    test_log = log_backend.new(tmp_path)
    log = Log(test_log.open(old), old)
    store, fresh = store_backend.create(), store_backend.create()

    def drain(catalog, name: str, into) -> Pipeline:
        pipeline = Pipeline(spark, pin_definitions(into, catalog, name, clock=lambda: NOW_MS / 1000),
                            store_backend.reopen(into), replace(test_log.pipeline_config(name=name), driver_batch_rows=50),
                            clock=lambda: NOW_MS / 1000, log=test_log.open(catalog))
        pipeline.run_until_drained()
        return pipeline

    log.table("plans", [{"id": "p1", "tier": "basic"}, {"id": "p2", "tier": "gold"}], T0)
    log.table("users", [{"user_id": "u0", "plan_id": "p1", "alt_plan_id": "p2", "country": "de"},
                        {"user_id": "u1", "plan_id": "p2", "alt_plan_id": "p9", "country": "fr"}], T0)  # p9: none
    log.events_of("http_requests", [{"time": T0 + 1_000, "user_id": "u0", "method": "GET"}], T0 + 5_000)
    drain(old, "main", store)  # batch 0 (persisted) records the definition with the plan_id view
    log.events_of("http_requests", [{"time": T0 + 11_000, "user_id": u, "method": "GET"} for u in ("u0", "u1")],
                  T0 + 15_000)
    main = drain(new, "main", store)  # pinned: the stored definition, through plan_id
    assert main.fits_driver(1)  # that batch went on the driver path
    drain(new, "run", fresh)  # the new definition: through alt_plan_id
    columns = ["country", "tier"]
    assert stored(store, "http_requests", columns) == Counter(
        {(T0, "de", "basic"): 1, (T0 + 10_000, "de", "basic"): 1, (T0 + 10_000, "fr", "gold"): 1})
    assert stored(fresh, "http_requests", columns) == Counter(
        {(T0, "de", "gold"): 1, (T0 + 10_000, "de", "gold"): 1, (T0 + 10_000, "fr", ""): 1})
