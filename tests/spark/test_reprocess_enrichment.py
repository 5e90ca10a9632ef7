"""A reprocess of a table that enriches a stream (docs/reprocessing.md, "A table that enriches
streams"): the run of `users` (a column more, which `http_requests` is now also enriched with)
rebuilds `http_requests` whole with the table's new definition, and the table's row versions from
its log; the switch moves both streams' outputs, offsets and the versions together. Both are
appended to after the run caught up (read the old way by the serving pipeline before the switch,
and left unread by it when the switch comes) and after the switch: the enriched counts per
enriched dimension then equal one pipeline's over the whole log with the new definition, and
pandas' as-of join; the replaced output stays queryable by its version. On both logs: on Kafka
the run reads in batches with chosen end offsets (aggregates/bounded_batches.py), and the append
times the oracle uses are the broker's."""

from __future__ import annotations

import json
import random
import time

import pytest

from catalog import Catalog
from catalog.versions import definition_version
from tests.log_backends import ON_BOTH_LOGS
from tests.spark.test_enrichment import Log, expected, stored
from tests.support.switch import SwitchScenario

pytestmark = [pytest.mark.spark, ON_BOTH_LOGS]

LATE = {"allowed_lateness": "1h", "tiers": [], "partitions": 2}
OLD = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"], **LATE},
                   "http_requests": {"key_field": "user_id", "dimensions": ["method"], **LATE,
                                     "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}},
       "metrics": {"requests": {"stream": "http_requests"}}}
# The table keeps a column more, and the stream is enriched with it too: a run of the table
# rebuilds the stream (both definitions change; a switch of the stream alone would leave the
# table's versions without the column).
NEW = {**OLD, "streams": {
    "users": {**OLD["streams"]["users"], "dimensions": ["plan", "country"]},
    "http_requests": {**OLD["streams"]["http_requests"],
                      "enrich": [{"table": "users", "by": "user_id", "columns": ["plan", "country"]}]}}}


class Traffic:
    """Table changes and requests appended at least 20 ms apart, each request stamped up to 60 ms
    before its append (so some precede the table's latest changes). Real times: on Kafka the
    broker stamps the append time (LogAppendTime), and the oracle reads it back (`Log`)."""

    def __init__(self, log: Log):
        self.log, self.rng = log, random.Random(16)

    def tick(self) -> int:
        time.sleep(0.02)
        return int(time.time() * 1000)

    def users(self, n: int) -> None:
        rng = self.rng  # u0..u10; u11 is never in the table (its requests are misses)
        self.log.table([{"user_id": f"u{rng.randrange(11)}", "_deleted": True} if rng.random() < 0.05 else
                        {"user_id": f"u{rng.randrange(11)}", "plan": rng.choice(["free", "pro", "team"]),
                         "country": rng.choice(["nl", "de", "fr"])} for _ in range(n)], self.tick())

    def requests(self, n: int) -> None:
        at, rng = self.tick(), self.rng
        self.log.requests([{"time": at - rng.randrange(60), "user_id": f"u{rng.randrange(12)}",
                            "method": rng.choice(["GET", "POST"])} for _ in range(n)], at)

    def both(self, rounds: int, users: int, requests: int) -> None:
        for _ in range(rounds):
            self.users(users)
            self.requests(requests)


def test_a_reprocess_of_a_table_rebuilds_the_streams_it_enriches_and_switches_them_together(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=150) as scenario:
        traffic = Traffic(Log(scenario.log, scenario.catalog))

        def served(root) -> None:  # served the old way until the switch
            dims = [json.loads(p.key.dims) for p in root.read_panes("http_requests", 0, 2**62)]
            assert dims and all("country" not in d for d in dims)

        def caught_up(service, run) -> None:  # its progress covers the enriched stream it read too
            progress = service.progress(service.run(run.id))
            assert progress.done == progress.to_do > \
                sum(p.to_do for p in progress.partitions if p.stream == "users") > 0

        # After the run: both changed and read the old way by the serving pipeline, then changes it
        # has not read when the switch comes, then more of both before it restarts. Fewer than
        # max_records_per_batch in all, so that the serving pipeline reads them (again) after the
        # switch in one batch: on Kafka Spark's source shares a batch in proportion to each
        # partition's backlog, which can enrich an event before a table change appended before it
        # is read (docs/tables.md "In the pipeline"). Two rounds before the definition changes and
        # two after: the run reads them in two batches of its own (more is not what is tested).
        done = scenario.switch_of(
            "users", first=lambda: traffic.both(2, 6, 60), changed=lambda: traffic.both(2, 5, 60),
            after_run=lambda: traffic.both(2, 4, 30), at_switch=lambda: traffic.both(1, 4, 30),
            after_switch=lambda: traffic.both(1, 4, 30), served=served, caught_up=caught_up,
            # The whole log in one batch: no batch plan can change its answer.
            reference_batch=1_000_000)
        root, reference, service = done.root, done.reference, done.service
        assert done.switched["enriched"] == ["http_requests"]
        assert service.changes() == {}  # both streams now served as configured

        want, missing = expected(traffic.log)
        assert {k[3] for k in want} >= {"", "nl", "de", "fr"} and 0 < missing < len(traffic.log.events)
        assert sum(want.values()) == len(traffic.log.events)  # nothing dead-lettered
        assert stored(reference) == want
        assert stored(root) == want
        assert root.progress("main").streams["http_requests"].enrich_misses == {"users": missing}
        assert root.table_versions("users") == reference.table_versions("users")
        assert {r.key: r.row for r in root.table_rows("users", limit=1_000)} == \
            {r.key: r.row for r in reference.table_rows("users", limit=1_000)}
        # The replaced output is kept and queryable by the stream's old version (?version=).
        old_catalog = Catalog(**OLD)
        old_version = definition_version(old_catalog.streams["http_requests"], old_catalog)
        namespace, declaration = service.output("http_requests", old_version[:8])
        assert namespace == done.switched["previous"] and declaration["enrich"][0]["columns"] == ["plan"]
        kept = service.output_store(namespace)
        old = [json.loads(p.key.dims) for p in kept.read_panes("http_requests", 0, 2**62)]
        assert old and all("country" not in dims for dims in old)


# The enriched stream's own change: enriched with a column its table already has.
STREAM_CHANGED = {**NEW, "streams": {**NEW["streams"], "http_requests": OLD["streams"]["http_requests"]}}


def test_a_reprocess_of_an_enriched_stream_enriches_every_event_as_of_its_time(
        tmp_path, spark, log_backend, store_backend):
    """A run of `http_requests` alone (now enriched with `country` too, which `users` had): it reads
    `users` with it, from the versions the serving store kept and the table's log, and its output
    equals pandas' as-of join over the whole log. On Kafka its batches are planned as the embedded
    source plans them (sketchboard/reprocess.py run_end_offsets): left to Spark's Kafka source,
    which shares a batch in proportion to each partition's backlog, an event can be enriched
    before a change of its key appended before it is read."""
    with SwitchScenario(tmp_path, spark, log_backend, STREAM_CHANGED, NEW, batch=150) as scenario:
        traffic = Traffic(Log(scenario.log, scenario.catalog))
        traffic.both(2, 6, 60)
        scenario.serve()
        scenario.change()
        traffic.both(2, 5, 60)
        run, _ = scenario.reprocess("http_requests")
        want, missing = expected(traffic.log)
        assert {k[3] for k in want} >= {"", "nl", "de", "fr"} and 0 < missing < len(traffic.log.events)
        output = scenario.output(run)
        assert stored(output) == want
        assert output.progress(run.id).streams["http_requests"].enrich_misses == {"users": missing}
