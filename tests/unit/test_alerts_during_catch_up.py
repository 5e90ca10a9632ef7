"""An alert rule on final windows during a catch-up (issue 19): one partition has been read far
ahead in event time, another still holds unread events. The rule must read a window that
both have delivered, not a half-filled one that a stream-wide watermark would call final.
Real SQLite store, the alert evaluator's real data source; no Spark."""

from __future__ import annotations

from alerts.kinds import evaluate_rule
from alerts.rules import ThresholdRule
from alerts.source import StoreAlertData
from catalog import Catalog
from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore

BASE = 1_800_000_000_000
PANE = 10_000
PER_PANE = 10  # events per pane from each partition: a full 1-minute window counts 2 x 6 x 10
CATALOG = Catalog.model_validate({
    "streams": {"sensors": {"key_field": "device", "values": ["temp"], "pane": "10s", "allowed_lateness": "30s",
                            "partitions": 2, "tiers": []}},
    "metrics": {"readings": {"stream": "sensors"}},
})
LOW_TRAFFIC = ThresholdRule(kind="threshold", name="low_traffic", metric="readings", stat="count", window="1m",
                            op="<", threshold=100, stale_after="1h")


def test_a_final_window_rule_does_not_fire_on_a_window_a_lagging_partition_still_fills(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db")
    # Both partitions hold 10 minutes of events (60 panes, 600 records each); this batch read all
    # of partition 0 but only the first 5 minutes of partition 1.
    read = {0: 60, 1: 30}
    partials = [PanePartial("sensors", BASE + i * PANE, BASE + (i + 1) * PANE, {},
                            PaneData(count=PER_PANE * sum(1 for p in read if i < read[p]))) for i in range(60)]
    events = PER_PANE * sum(read.values())
    newest = {p: BASE + n * PANE - 1 for p, n in read.items()}
    commit = BatchCommit(
        "main", 0, partials, events, {"sensors": max(newest.values())},
        end_offsets={"sensors": {p: n * PER_PANE for p, n in read.items()}},
        read_by_stream={"sensors": events},
        partition_max_event_ms={"sensors": newest},
        log_end_offsets={"sensors": {0: 600, 1: 600}},
    )
    now = BASE + 11 * 60_000
    assert store.commit_batch(commit, lateness_ms={"sensors": 30_000}, now_ms=now).committed

    # The watermark stops at partition 1's newest event - lateness: 4.5 min into the data, not 9.5.
    assert store.watermarks()["sensors"] == newest[1] - 30_000
    outcome = evaluate_rule(LOW_TRAFFIC, StoreAlertData(CATALOG, store), CATALOG, now)
    [sample] = outcome.samples
    assert sample.value == 2 * 6 * PER_PANE and sample.condition is False  # a full window: not firing
    store.close()
