"""Which records are merged and which are dead-lettered: the rule, as plain Python.

The pipeline applies the same rule as a Spark expression on the executors
(`aggregates.partials.dead_letter_reason_column`); this pure form documents it and is
what tests check the Spark job against.
"""

from __future__ import annotations

# unparseable: the source could not decode the record; invalid: a record that bypassed the API
# (Kafka) fails its validation. The source says which (ingest.source_rows: `error_kind`).
from ingest.source_rows import INVALID, UNPARSEABLE

__all__ = ["BEYOND_RETENTION", "FUTURE_SKEW", "INVALID", "MISSING_EVENT_ID", "UNPARSEABLE", "dead_letter_reason"]

BEYOND_RETENTION = "beyond_retention"  # event_time < batch_now - retention
FUTURE_SKEW = "future_skew"            # event_time > ingest_time + max_future_skew
# The stream declares an event_id_field and the record has no value there (a record logged
# before the declaration; the API and the Kafka source's validation refuse such events).
MISSING_EVENT_ID = "missing_event_id"


def dead_letter_reason(event_time_ms: int | None, ingest_time_ms: int | None, error: str | None, *,
                       batch_now_ms: int, retention_ms: int, max_future_skew_ms: int,
                       error_kind: str | None = None, event_id_missing: bool = False) -> str | None:
    """None when the record is merged, else why it is not (first matching rule wins).

    `batch_now_ms` is the pipeline's clock at the start of the batch; future skew is judged
    against the record's ingest time, so replaying a record classifies it the same way.
    """
    if error is not None:
        return error_kind or UNPARSEABLE
    if event_time_ms is None or ingest_time_ms is None:
        return UNPARSEABLE
    if event_id_missing:
        return MISSING_EVENT_ID
    if event_time_ms < batch_now_ms - retention_ms:
        return BEYOND_RETENTION
    if event_time_ms > ingest_time_ms + max_future_skew_ms:
        return FUTURE_SKEW
    return None
