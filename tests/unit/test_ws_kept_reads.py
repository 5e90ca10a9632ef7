"""The websocket hub's per-tick points read only rows retention keeps, as REST reads them: the
same planner at the same clock (docs/event-time.md, "Tiers and retention"). On SQLite and on
PostgreSQL."""

from __future__ import annotations

from api.ws_compute import ALL_GROUPS, changed_points
from query import Target, compute, over, series_json
from store import BatchCommit
from store.tiers import TierLayout
from tests.unit.test_tiers import LATENESS, MINUTE, PANE, T0, commit_all, store_at

HOUR, DAY = 3_600_000, 86_400_000
# A tier may be kept for less than a finer one (each keep at least the retention): the hours
# 3 days, the minutes 10. Past 3 days only the minutes hold the events.
SHORT_HOURS = TierLayout(PANE, 2 * DAY, ((MINUTE, 10 * DAY), (HOUR, 3 * DAY)), ("",))
TARGET = Target("m", "s", ("count",), (None,), "events", None, None, PANE, (), ())


def test_changed_points_read_the_granules_rest_reads_past_a_tiers_keep(store_backend):
    """Events of [T0, T0 + 6h), and a batch 5 days later whose retention run dropped their panes
    and hour rows (the minutes are kept). REST reads the minute rows; the hub's points for the same
    windows read the hour rows, dropped, and pushed 0 events, final, over REST's answer."""
    store = store_at(store_backend, SHORT_HOURS)
    events = [(T0 + i * 600_000, {"a": "x"}, 1.0, "u") for i in range(36)]  # one every 10 min
    commit_all(store, [events])
    now = T0 + 5 * DAY
    assert store.commit_batch(BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now), lateness_ms={"s": LATENESS},
                              now_ms=now, retention_ms={"s": SHORT_HOURS.retention_ms}).committed
    assert store.read_tier("s", HOUR, "", T0, T0 + DAY, pane_ms=PANE) == []  # dropped
    rq = over(TARGET, step_ms=HOUR, window_ms=HOUR, from_text=str(T0), to_text=str(T0 + 6 * HOUR), relative=False)
    lo, hi = T0, T0 + 6 * HOUR
    watermark = store.watermarks().get("s")
    rest = [series_json(s) for s in compute(store, rq, lo, hi, watermark_ms=watermark, max_points=1000, now_ms=now)]
    assert [p["count"] for s in rest for p in s["points"]] == [6] * 6
    # A tick where every window changed (a watermark seen for the first time finalizes them all).
    pushed = changed_points(store, rq, {t: ALL_GROUPS for t in range(lo, hi, HOUR)}, watermark, 1000, kept_at_ms=now)
    assert pushed == rest
    store.close()
