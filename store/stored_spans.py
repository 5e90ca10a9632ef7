"""Which of a batch's row keys could be stored at all, asked once per stream (and tier): SQL
over a DB-API cursor, the same for both backends (`p` is the backend's placeholder).

A backfill into new time, or into a fresh store, merges into none of the rows it writes, yet
the load before the merge staged its hundreds of thousands of keys and joined them to the
table (~0.8 s of a 1 M-event commit's 320 000 pane keys, SQLite). One indexed probe per key
prefix (the primary key's columns before start_ms: the stream, and a tier's granule and
projection) for any row within the keys' span of starts says which keys can be skipped."""

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
    probe = (f"SELECT 1 FROM {table} WHERE {' AND '.join(f'{c} = {p}' for c in key_columns[:prefix])}"
             f" AND start_ms BETWEEN {p} AND {p} LIMIT 1")
    stored = {head for head, (lo, hi) in spans.items() if cursor.execute(probe, (*head, lo, hi)).fetchone()}
    if len(stored) == len(spans):
        return list(keys)
    return [key for key in keys if key[:prefix] in stored]
