"""Dead letters per stream over a span of arrival time (the dead_letters alert kind asks every
evaluation, 10 s by default): SQL the same for both backends, `%s` placeholders (SQLite's `?`
put in by the caller).

The index is (stream, at_ms). Asked by time alone, a count scanned the whole index: every dead
letter kept, ~14 a second at 20 000 events/s of the demo's traffic over its streams' retention
(millions), under the store's lock. The streams are found with a loose index scan instead (one
index lookup per stream, as retention_clock.NEWEST_COMMIT_SQL finds pipelines), and each count
reads its stream's span of the index only."""

from __future__ import annotations

DEAD_LETTER_COUNTS = """
WITH RECURSIVE streams(name) AS (
    SELECT MIN(stream) FROM dead_letters
    UNION ALL
    SELECT (SELECT MIN(stream) FROM dead_letters WHERE stream > streams.name) FROM streams
    WHERE streams.name IS NOT NULL
)
SELECT name, (SELECT COUNT(*) FROM dead_letters WHERE stream = streams.name AND at_ms >= %s AND at_ms < %s) AS n
FROM streams WHERE name IS NOT NULL
"""


def counts(rows) -> dict[str, int]:
    """The query's rows as {stream: count}, streams without any in the span left out."""
    return {stream: n for stream, n in rows if n}
