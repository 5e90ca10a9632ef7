"""A reprocess of a table that a view reads, switched in step with the serving pipeline
(docs/reprocessing.md, "A table read by a view"): the run also reads the view's other table, only
as far as the serving pipeline has, and rebuilds the view; the switch holds the serving pipeline,
lets the run read the other table exactly as far as it has, moves the view's rows and appends the
difference between the served rows and the rebuilt ones to the view's changelog. Both tables are
appended to after the run caught up (read by the serving pipeline before the switch, and the other
table also left unread by it), and a reader pages through the changelog before, during and after
the switch: it sees every change once, each from the row it had, and ends with exactly the view
of one pipeline that read the whole log with the new definition (and of a pandas merge). On both
logs: on Kafka (compacted table topics) the run reads in batches with chosen end offsets
(aggregates/bounded_batches.py)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import pytest

from catalog import Catalog
from ingest.tables import TableRowValidator
from tests.log_backends import ON_BOTH_LOGS
from tests.support.switch import SwitchScenario, plain_switch_refused

pytestmark = [pytest.mark.spark, ON_BOTH_LOGS]

OLD = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan_id"], "values": ["credit"],
                             "partitions": 2, "tiers": []},
                   "plans": {"kind": "table", "key_field": "id", "dimensions": ["tier"], "values": ["price"],
                             "partitions": 1, "tiers": []}},
       "views": {"user_plans": {"left": "users", "right": "plans", "foreign_key": "plan_id", "kind": "left"}}}
# A column more on the left table: every view row gains it (a changed definition of `users`).
NEW = {**OLD, "streams": {**OLD["streams"], "users": {**OLD["streams"]["users"],
                                                      "dimensions": ["plan_id", "country"]}}}


class Tables:
    """Changes of both tables appended to the log (validated with the new definition), and the
    tables they make, for the pandas oracle."""

    def __init__(self, log, catalog: Catalog):
        self.log, self.catalog, self.rng = log, catalog, random.Random(16)
        self.rows: dict[str, dict[str, dict]] = {"users": {}, "plans": {}}

    def append(self, table: str, rows: list[dict]) -> None:
        now = int(time.time() * 1000)
        validator = TableRowValidator(self.catalog.stream(table))
        self.log.append(self.catalog.stream(table), [validator.validate(r, now) for r in rows], now)
        key = self.catalog.stream(table).key_field
        for r in rows:
            if r.get("_deleted"):
                self.rows[table].pop(r[key], None)
            else:
                self.rows[table][r[key]] = {k: v for k, v in r.items() if k != key}

    def users(self, n: int) -> None:
        rng = self.rng
        # Users name p6 and p7 too, which are never plans: the left view's rows without a match.
        self.append("users", [{"user_id": f"u{rng.randrange(60)}", "_deleted": True} if rng.random() < 0.08 else
                              {"user_id": f"u{rng.randrange(60)}", "plan_id": f"p{rng.randrange(8)}",
                               "country": rng.choice(["nl", "de", "fr"]), "credit": rng.randrange(50)}
                              for _ in range(n)])

    def plans(self, n: int, keys: tuple[int, ...] = tuple(range(6))) -> None:
        rng = self.rng
        self.append("plans", [{"id": f"p{rng.choice(keys)}", "_deleted": True} if rng.random() < 0.1 else
                              {"id": f"p{rng.choice(keys)}", "tier": rng.choice(["free", "gold", "pro", "team"]),
                               "price": rng.randrange(10)} for _ in range(n)])

    def merged(self) -> dict[str, dict]:
        """The new view from scratch: pandas' left merge of the final tables."""
        users = pd.DataFrame([{"user_id": k, **v} for k, v in self.rows["users"].items()])
        plans = pd.DataFrame([{"plan_id": k, **v} for k, v in self.rows["plans"].items()])
        out = {}
        for rec in users.merge(plans, on="plan_id", how="left").to_dict("records"):
            out[rec["user_id"]] = {"plan_id": rec["plan_id"], "country": rec["country"],
                                   "credit": float(rec["credit"]),
                                   "tier": None if pd.isna(rec["tier"]) else rec["tier"],
                                   "price": None if pd.isna(rec["price"]) else float(rec["price"])}
        return out


class Reader:
    """A consumer of the view's changelog: pages on from its cursor and applies each change,
    checking that its old row is the row the reader has (every change seen once, in order)."""

    def __init__(self, store):
        self.store, self.cursor, self.rows, self.seen = store, "", {}, 0

    def read(self, page: int = 7) -> int:
        got = 0
        while True:
            changes = self.store.view_changes("user_plans", after=self.cursor, limit=page)
            for c in changes:
                assert self.rows.get(c.key) == (None if c.old is None else dict(c.old)), c
                if c.new is None:
                    del self.rows[c.key]
                else:
                    self.rows[c.key] = dict(c.new)
            got += len(changes)
            if changes:
                self.cursor = changes[-1].cursor
            if len(changes) < page:
                self.seen += got
                return got


def view(store) -> dict[str, dict]:
    return {r.key: dict(r.row) for r in store.view_rows("user_plans", limit=10_000)}


def test_a_reprocess_of_a_table_a_view_reads_switched_in_step_gives_the_exact_view_and_changelog(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=100) as scenario:
        tables = Tables(scenario.log, scenario.catalog)
        reader = Reader(scenario.output())

        def first() -> None:
            tables.plans(8)
            tables.users(80)

        def changed() -> None:  # users get a country: the view's rows change too
            tables.users(60)
            tables.plans(4)

        def served(root) -> None:
            assert reader.read() > 50 and reader.rows == view(root)
            assert all("country" not in row for row in reader.rows.values())  # served the old way

        # After the run: both tables changed and read the old way by the serving pipeline (plans
        # p0 to p2: only the run's final batch brings them into the rebuilt view; nothing changes
        # them after), then changes it has not read when the switch comes (plans: read after it).
        def after_run() -> None:
            tables.users(30)
            tables.plans(6, keys=(0, 1, 2))

        def at_switch() -> None:
            reader.read()
            tables.users(10)
            tables.plans(3, keys=(3, 4, 5))

        @contextmanager
        def polled() -> Iterator[None]:
            """A reader polling throughout the switch."""
            stop, errors = threading.Event(), []

            def poll() -> None:
                try:
                    while not stop.is_set():
                        reader.read(page=5)
                        time.sleep(0.01)
                except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
                    errors.append(exc)

            polling = threading.Thread(target=poll, name="changelog-reader")
            polling.start()
            try:
                yield
            finally:
                stop.set()
                polling.join()
            assert not errors, errors

        def after_switch() -> None:  # then users changed, read by the restarted serving pipeline
            reader.read()
            assert reader.rows == view(scenario.root) and all("country" in row for row in reader.rows.values())
            tables.users(20)

        done = scenario.switch_of(
            "users", first=first, changed=changed, served=served,
            caught_up=plain_switch_refused("feeds view 'user_plans'.*sketchboard reprocess users --switch"),
            after_run=after_run, at_switch=at_switch, during_switch=polled, after_switch=after_switch)
        root, reference = done.root, done.reference
        reader.read()
        assert root.view_changes("user_plans", limit=1)[0].cursor == "1"  # never rebuilt: the changelog goes on
        want = tables.merged()
        assert len(want) > 30 and any(row["tier"] is None for row in want.values())
        assert view(reference) == want
        assert view(root) == want
        assert reader.rows == want
        for table in ("users", "plans"):
            assert {r.key: r.row for r in root.table_rows(table, limit=10_000)} == \
                {r.key: r.row for r in reference.table_rows(table, limit=10_000)}
