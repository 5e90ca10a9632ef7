"""A pattern defined through the API while the pipeline runs (issue 24), batch by batch through
the pipeline's driver side (tests/api/test_ws_support.py drain_log_into_store runs
aggregates/patterns.py as a batch does; no Spark), with the catalog the pipeline follows
(aggregates/pattern_definitions.py PatternFollower, polled once per batch):

- created: its matches are those of the brute-force definition (tests/support/patterns.py) over
  the events the pipeline reads from its first batch after the creation on; earlier events are
  not matched;
- replaced: the old matches stay, the state is dropped once and the new definition matches the
  events from the batch that applies it on; a batch that computed the change and crashed before
  its commit changes nothing (its replay decides the same from the store);
- deleted: its state is dropped in the next batch, its matches stay readable.
On every store backend (SQLite, PostgreSQL)."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from aggregates.pattern_definitions import PatternFollower
from aggregates.patterns import PatternRunner
from api.app import create_app
from api.pattern_definitions import PatternDefinitions
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from store.pattern_definitions import PatternDefinitionStore
from store.tiers import catalog_layouts
from tests.api.conftest import NOW_MS
from tests.api.test_join_demo import post_all
from tests.api.test_pattern_definitions_api import BURST, PATTERNS
from tests.api.test_patterns_demo import stored_matches
from tests.api.test_ws_support import drain_log_into_store, pattern_table
from tests.support.patterns import brute_force

MIN = 60_000
T0 = NOW_MS - 2 * 60 * MIN  # inside the logins' retention
ATTACKER = "203.0.113.7"


@pytest.fixture
def pane_store(store_backend):
    return store_backend.create()


@pytest.fixture
def api(ctx, clock):
    """The API with patterns defined through it (the pipeline's store holds them)."""
    store = PatternDefinitionStore(ctx.store.side_db())
    ctx.pattern_definitions = PatternDefinitions(ctx.catalog, store, refresh_s=0, clock=clock)
    with TestClient(create_app(ctx)) as c:
        yield c
    store.close()


def burst(user: str, start_ms: int, failures: int, *, success: bool = True) -> list[dict]:
    """`failures` failed logins from the attacker's address ten seconds apart, then (maybe) a success."""
    out = [{"time": start_ms + i * 10_000, "user_id": user, "outcome": "failure", "client": "web", "ip": ATTACKER}
           for i in range(failures)]
    if success:
        out.append({"time": start_ms + failures * 10_000, "user_id": user, "outcome": "success", "client": "web",
                    "ip": ATTACKER})
    return out


def tick(t_ms: int) -> list[dict]:
    """A login of nobody in particular: it moves the logins' watermark on (a batch needs a record)."""
    return [{"time": t_ms, "user_id": f"tick{t_ms}", "outcome": "success", "client": "web", "ip": "10.0.0.1"}]


class Pipeline:
    """The driver side of the pipeline's batches, following the patterns defined through the API
    as Pipeline.follow_patterns does (a poll per batch; tiers configured on a change)."""

    def __init__(self, ctx, clock):
        self.ctx, self.clock = ctx, clock
        self.definitions = PatternDefinitionStore(ctx.store.side_db())
        self.follower = PatternFollower(ctx.pattern_definitions.configured, self.definitions)
        self.catalog = ctx.pattern_definitions.configured

    def follow(self):
        catalog = self.follower.poll()
        if catalog is not None:
            self.catalog = catalog
            self.ctx.store.configure_tiers(catalog_layouts(catalog), now_ms=round(self.clock() * 1000))
        return self.catalog

    def batch(self, client, events: list[dict]) -> None:
        post_all(client, "logins", events)
        catalog = self.follow()
        assert drain_log_into_store(catalog, self.ctx.log, self.ctx.store, round(self.clock() * 1000)) == len(events)

    def close(self):
        self.definitions.close()


def matched(stored: list[dict]) -> list[tuple]:
    return sorted((m["key"], m["decided_at_ms"], [(e["step"], e["time"]) for e in m["events"]]) for m in stored)


def oracle(catalog, name: str, events: list[dict], horizon: int) -> list[tuple]:
    """The definition's matches of pattern `name` over `events` (those it may see), up to `horizon`."""
    pattern = next(p for p in catalog.patterns if p.name == name)
    plan = compile_pattern(pattern, catalog)
    by_key: dict[str, list[PatternEvent]] = {}
    for i, e in enumerate(sorted(events, key=lambda e: e["time"])):
        if e["time"] <= horizon:
            by_key.setdefault(e["user_id"], []).append(PatternEvent("logins", 0, i, e["time"], e["user_id"], e))
    return sorted((key, decided, [(step, t) for step, _, _, _, t in evs])
                  for key, events_ in by_key.items() for decided, evs in brute_force(plan, events_, horizon))


def status(client) -> dict:
    return client.get("/api/v1/pipeline").json()["patterns"]


def test_a_pattern_created_replaced_and_deleted_while_the_pipeline_runs(api, ctx, clock):
    pipeline = Pipeline(ctx, clock)
    try:
        # Before the pattern exists: alice's burst would match it, but is read before its creation.
        before = burst("alice", T0, 3)
        pipeline.batch(api, before)
        assert api.post(PATTERNS, json=BURST).status_code == 201

        # Created: bob and dave break in, carol does not; the ticks move the watermark past them.
        after = burst("bob", T0 + 5 * MIN, 3) + burst("carol", T0 + 6 * MIN, 2) + burst("dave", T0 + 7 * MIN, 4)
        pipeline.batch(api, after + tick(T0 + 20 * MIN))
        pipeline.batch(api, tick(T0 + 21 * MIN))
        watermark = status(api)["login_burst"]["watermark_ms"]
        assert watermark >= T0 + 19 * MIN
        first = matched(stored_matches(api, "login_burst"))
        assert first == oracle(pipeline.catalog, "login_burst", after + tick(T0 + 20 * MIN), watermark)
        assert {key for key, _, _ in first} == {"bob", "dave"}  # not alice: read before the pattern existed
        assert status(api)["login_burst"]["matches"] == 2

        # Replaced by "two failures then a success": carol's old events would match it now, but its
        # state starts again from nothing at the batch that applies it, and the old matches stay.
        replaced = {**BURST, "steps": [{**BURST["steps"][0], "times": 2}, BURST["steps"][1]]}
        assert api.put(f"{PATTERNS}/login_burst", json=replaced).status_code == 200
        later = burst("erin", T0 + 25 * MIN, 2) + burst("frank", T0 + 26 * MIN, 1) + tick(T0 + 40 * MIN)
        post_all(api, "logins", later)
        # A batch that computed the change and crashed before its commit: nothing of it is stored.
        crashed = PatternRunner(pipeline.follow(), ctx.store)
        assert any(c.reset for c in crashed.run(pattern_table([]), ctx.store.watermarks()).commits)
        assert drain_log_into_store(pipeline.catalog, ctx.log, ctx.store, round(clock() * 1000)) == len(later)
        pipeline.batch(api, tick(T0 + 41 * MIN))
        watermark = status(api)["login_burst"]["watermark_ms"]
        second = matched(stored_matches(api, "login_burst"))
        new = oracle(pipeline.catalog, "login_burst", later, watermark)
        assert [key for key, _, _ in new] == ["erin"] and second == sorted(first + new)
        assert status(api)["login_burst"]["matches"] == 1  # the new definition's own count

        # Deleted: its state goes in the next batch; its matches stay readable.
        assert api.delete(f"{PATTERNS}/login_burst").status_code == 204
        pipeline.batch(api, burst("gina", T0 + 45 * MIN, 3, success=False))
        assert "login_burst" not in status(api)
        assert ctx.store.pattern_sizes().get("login_burst") is None
        assert matched(stored_matches(api, "login_burst")) == second
    finally:
        pipeline.close()
