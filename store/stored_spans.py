"""Which of a batch's row keys could be stored at all, asked once per stream (and tier): SQL
over a DB-API cursor, the same for both backends (`p` is the backend's placeholder).

A backfill into new time, or into a fresh store, merges into none of the rows it writes, yet
the load before the merge staged its hundreds of thousands of keys and joined them to the
table (~0.8 s of a 1 M-event commit's 320 000 pane keys, SQLite). Two indexed probes per key
prefix (the primary key's columns before start_ms: the stream, and a tier's granule and
projection) find the first and last stored row within the keys' span of starts; only keys
between those can be stored. A backfill's next batch (its span begins where the last one's
ended) then stages the few keys of the pane it shares with it, not all of its own."""

from __future__ import annotations

from collections.abc import Sequence


def in_stored_spans(cursor, p: str, table: str, key_columns: tuple[str, ...], keys: Sequence[tuple]) -> list[tuple]:
    """The keys (columns `key_columns`, start_ms among them) whose prefix holds any row of
    `table` within the keys' span of starts; the others cannot be stored."""
    prefix = key_columns.index("start_ms")
    spans: dict[tuple, list[int]] = {}
    for key in keys:
        span = spans.get(key[:prefix])
        start = key[prefix]
        if span is None:
            spans[key[:prefix]] = [start, start]
        elif start < span[0]:
            span[0] = start
        elif start > span[1]:
            span[1] = start
    where = (f"FROM {table} WHERE {' AND '.join(f'{c} = {p}' for c in key_columns[:prefix])}"
             f" AND start_ms BETWEEN {p} AND {p} ORDER BY start_ms")
    first, last = f"SELECT start_ms {where} LIMIT 1", f"SELECT start_ms {where} DESC LIMIT 1"
    bounds: dict[tuple, tuple[int, int]] = {}
    for head, (lo, hi) in spans.items():
        row = cursor.execute(first, (*head, lo, hi)).fetchone()
        if row is not None:
            bounds[head] = (row[0], cursor.execute(last, (*head, lo, hi)).fetchone()[0])
    if all(bounds.get(head) == (lo, hi) for head, (lo, hi) in spans.items()):
        return list(keys)
    out = []
    for key in keys:
        span = bounds.get(key[:prefix])
        if span is not None and span[0] <= key[prefix] <= span[1]:
            out.append(key)
    return out
