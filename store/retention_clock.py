"""The clock a query measures retention against: the API's "now", or the newest committed
batch's clock where the pipeline's runs ahead of it.

A retention run drops a granule's rows ending at or before `batch_now - keep`, `batch_now` being
the committing batch's clock (store/commit_plan.py `tier_horizons`), and the planner reads a
granule only from `now - keep` on (store/planner.py `kept_from_ms`): sound while no batch's
clock is ahead of the query's. A pipeline on a host whose clock is ahead (or an API whose clock
lags) drops rows the planner believes kept, and the query sums what is left: 0, marked final.
So the query's retention clock is the later of its own and the newest batch's
`committed_at_ms` (the pipeline's clock when the store took the batch, recorded never before the
`batch_now` it ran retention at: `recorded_commit_ms`; a clock that stepped back is held at an
earlier commit's instant, aggregates/batch_clock.py, and without that floor the recorded time
of the batches after a corrected clock forgot how far the one before had dropped rows).

Read cheaply: the batches table is never pruned and has no index on the commit time, so a
MAX over it scans every batch ever committed. Its key (pipeline, batch_id) finds each
pipeline (a loose index scan: the next pipeline name after the last) and its newest batch,
a few index probes whatever the table's size. The newest batch id's commit time is its
pipeline's newest unless the pipeline's clock stepped back meanwhile."""

from __future__ import annotations

from store.base import PaneStore

NEWEST_COMMIT_SQL = """
WITH RECURSIVE pipelines(name) AS (
    SELECT MIN(pipeline) FROM batches
    UNION ALL
    SELECT (SELECT MIN(pipeline) FROM batches WHERE pipeline > pipelines.name) FROM pipelines
    WHERE pipelines.name IS NOT NULL
)
SELECT MAX((SELECT committed_at_ms FROM batches WHERE pipeline = pipelines.name ORDER BY batch_id DESC LIMIT 1))
FROM pipelines WHERE name IS NOT NULL
"""


def retention_now_ms(store: PaneStore, now_ms: int) -> int:
    """The clock retention is measured against for a query asked at now_ms (the API's clock)."""
    committed = store.newest_commit_ms()
    return now_ms if committed is None else max(now_ms, committed)


def recorded_commit_ms(now_ms: int, batch_now_ms: int | None) -> int:
    """A batch's `committed_at_ms`: the store's clock at the commit, but never before the batch's
    own retention clock (held there when the pipeline's clock stepped back)."""
    return now_ms if batch_now_ms is None else max(now_ms, batch_now_ms)
