"""A reprocess of a table that enriches a stream through a view (docs/reprocessing.md, "A table
that enriches streams"): `users` gains `country` and `http_requests`, enriched through the view
`user_plans` (users -> plans), is now enriched with it too. The run of `users` rebuilds the view
(reading `plans` only as far as the serving pipeline has) and `http_requests` whole; the switch is
the view's synchronized one and moves the stream, its offsets and the table's versions with it.
Both tables and the stream are appended to after the run caught up (read the old way by the
serving pipeline), when the switch comes (left unread by it: plan tiers changed before requests
that must see them) and after the switch: the enriched counts per (pane, method, plan_id, country,
tier), misses included, then equal one pipeline's over the whole log and pandas' as-of join of both
tables (tests/spark/test_enrichment_views.py's oracle). On both logs: on Kafka the run drives its
batches, capped (aggregates/bounded_batches.py), and the append times the oracle uses are the
broker's."""

from __future__ import annotations


import pytest

from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.test_enrichment_views import Log, expected, stored
from tests.spark.test_reprocess_enrichment import LATE, Traffic as TableTraffic
from tests.support.switch import SwitchScenario

# The embedded stack alone: what the log adds to a switch (a run as a second consumer from the
# earliest retained offset, its batches cut at one append time) runs on Kafka in
# test_reprocess_enrichment.py and test_reprocess_enrichment_cut.py; here the dependents move.
pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

OLD = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan_id"], **LATE},
                   "plans": {"kind": "table", "key_field": "id", "dimensions": ["tier"], **LATE, "partitions": 1},
                   "http_requests": {"key_field": "user_id", "dimensions": ["method"], **LATE,
                                     "enrich": [{"table": "user_plans", "by": "user_id",
                                                 "columns": ["plan_id", "tier"]}]}},
       "views": {"user_plans": {"left": "users", "right": "plans", "foreign_key": "plan_id", "kind": "left"}},
       "metrics": {"requests": {"stream": "http_requests"}}}
# The left table keeps a column more and the stream is enriched with it too, through the view.
NEW = {**OLD, "streams": {
    **OLD["streams"],
    "users": {**OLD["streams"]["users"], "dimensions": ["plan_id", "country"]},
    "http_requests": {**OLD["streams"]["http_requests"],
                      "enrich": [{"table": "user_plans", "by": "user_id", "columns": ["plan_id", "country", "tier"]}]}}}
COLUMNS = ["method", "plan_id", "country", "tier"]


class Traffic(TableTraffic):
    """Changes of both tables and requests appended at least 20 ms apart, each request stamped up to
    60 ms before its append (some precede the latest changes). Real times: on Kafka the broker
    stamps the append time (LogAppendTime), and the oracle reads it back (`Log`)."""

    def users(self, n: int) -> None:
        rng = self.rng  # u0..u10 (u11 is never in the table); p5 is never a plan (a right miss)
        self.log.table("users", [{"user_id": f"u{rng.randrange(11)}", "_deleted": True} if rng.random() < 0.05 else
                                 {"user_id": f"u{rng.randrange(11)}", "plan_id": f"p{rng.randrange(6)}",
                                  "country": rng.choice(["nl", "de", "fr"])} for _ in range(n)], self.tick())

    def plans(self, n: int) -> None:
        rng = self.rng
        self.log.table("plans", [{"id": f"p{rng.randrange(5)}", "_deleted": True} if rng.random() < 0.1 else
                                 {"id": f"p{rng.randrange(5)}", "tier": rng.choice(["free", "gold", "pro", "team"])}
                                 for _ in range(n)], self.tick())

    def requests(self, n: int) -> None:
        at, rng = self.tick(), self.rng
        self.log.events_of("http_requests", [{"time": at - rng.randrange(60), "user_id": f"u{rng.randrange(12)}",
                                              "method": rng.choice(["GET", "POST"])} for _ in range(n)], at)

    def rounds(self, n: int, users: int, plans: int, requests: int) -> None:
        for _ in range(n):
            self.users(users)
            self.plans(plans)
            self.requests(requests)


def test_a_reprocess_of_a_table_enriching_through_a_view_rebuilds_the_stream_switched_in_step(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=150) as scenario:
        traffic = Traffic(Log(scenario.log, scenario.catalog))

        def caught_up(service, run) -> None:  # the stream read as far as the serving pipeline had
            progress = service.progress(service.run(run.id))
            assert progress.done == progress.to_do > \
                sum(p.to_do for p in progress.partitions if p.stream == "users") > 0

        # After the run: all three changed and read the old way by the serving pipeline; then
        # changes it has not read when the switch comes, plans' tiers before requests that see
        # them; then more before it restarts. Fewer than max_records_per_batch from the run's end
        # on: the serving pipeline reads them after the switch in one batch (on Kafka Spark's
        # source shares a batch in proportion to each partition's backlog: docs/tables.md "In the
        # pipeline"). Two rounds before the definition changes and two after: the run reads them
        # in two batches of its own (more is not what is tested).
        done = scenario.switch_of(
            "users", first=lambda: traffic.rounds(2, 6, 3, 60), changed=lambda: traffic.rounds(2, 5, 2, 60),
            after_run=lambda: traffic.rounds(2, 4, 2, 30), at_switch=lambda: traffic.rounds(1, 4, 3, 30),
            after_switch=lambda: traffic.rounds(1, 4, 2, 30), caught_up=caught_up,
            # The whole log in one batch: no batch plan can change its answer.
            reference_batch=1_000_000)
        root, reference = done.root, done.reference
        assert done.switched["enriched"] == ["http_requests"] and done.service.changes() == {}

        want, missing = expected(traffic.log, "http_requests", False, COLUMNS[1:])
        assert {k[3] for k in want} >= {"", "nl", "de", "fr"} and {k[4] for k in want} >= {"", "free", "gold"}
        assert 0 < missing < len(traffic.log.events["http_requests"])
        assert sum(want.values()) == len(traffic.log.events["http_requests"])  # nothing dead-lettered
        assert stored(reference, "http_requests", COLUMNS) == want
        assert stored(root, "http_requests", COLUMNS) == want
        assert root.progress("main").streams["http_requests"].enrich_misses == {"user_plans": missing}
        for table in ("users", "plans"):
            assert root.table_versions(table) == reference.table_versions(table)
        assert {r.key: dict(r.row) for r in root.view_rows("user_plans", limit=1_000)} == \
            {r.key: dict(r.row) for r in reference.view_rows("user_plans", limit=1_000)}
