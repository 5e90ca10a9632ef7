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

from collections.abc import Mapping, Sequence


def in_stored_spans(cursor, p: str, table: str, key_columns: tuple[str, ...], keys: Sequence[tuple],
                    types: Mapping[str, str] | None = None) -> list[tuple]:
    """The keys (columns `key_columns`, start_ms among them) whose prefix holds any row of
    `table` within the keys' span of starts; the others cannot be stored. With the SQL `types`
    of the prefix's columns (PostgreSQL), every prefix's probes go in one statement."""
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
    bounds = (_bounds_at_once(cursor, table, key_columns[:prefix], spans, types) if types is not None
              else _bounds(cursor, p, table, key_columns[:prefix], spans))
    if all(bounds.get(head) == (lo, hi) for head, (lo, hi) in spans.items()):
        return list(keys)
    out = []
    for key in keys:
        span = bounds.get(key[:prefix])
        if span is not None and span[0] <= key[prefix] <= span[1]:
            out.append(key)
    return out


def _bounds(cursor, p: str, table: str, heads: tuple[str, ...],
            spans: Mapping[tuple, list[int]]) -> dict[tuple, tuple[int, int]]:
    """Per key prefix, the first and last stored start within its span (absent: none), two probes
    each: cheap where the database is in the process (SQLite)."""
    where = (f"FROM {table} WHERE {' AND '.join(f'{c} = {p}' for c in heads)}"
             f" AND start_ms BETWEEN {p} AND {p} ORDER BY start_ms")
    first, last = f"SELECT start_ms {where} LIMIT 1", f"SELECT start_ms {where} DESC LIMIT 1"
    bounds: dict[tuple, tuple[int, int]] = {}
    for head, (lo, hi) in spans.items():
        row = cursor.execute(first, (*head, lo, hi)).fetchone()
        if row is not None:
            bounds[head] = (row[0], cursor.execute(last, (*head, lo, hi)).fetchone()[0])
    return bounds


def _bounds_at_once(cursor, table: str, heads: tuple[str, ...], spans: Mapping[tuple, list[int]],
                    types: Mapping[str, str]) -> dict[tuple, tuple[int, int]]:
    """_bounds in one statement over arrays of the prefixes and spans (PostgreSQL): a round trip
    each, the demo's tier rows had ~70 probes a commit (~11 ms, bench.steady_commits --mix)."""
    if not spans:
        return {}
    columns = [*heads, "lo", "hi"]
    where = " AND ".join([*(f"t.{c} = h.{c}" for c in heads), "t.start_ms BETWEEN h.lo AND h.hi"])
    probe = f"SELECT t.start_ms FROM {table} t WHERE {where} ORDER BY t.start_ms"
    arrays = ", ".join(f"%s::{types.get(c, 'bigint')}[]" for c in columns)
    rows = cursor.execute(f"SELECT ({probe} LIMIT 1), ({probe} DESC LIMIT 1) FROM unnest({arrays})"
                          f" WITH ORDINALITY AS h({', '.join(columns)}, i) ORDER BY h.i",
                          [[head[k] for head in spans] for k in range(len(heads))]
                          + [[span[0] for span in spans.values()], [span[1] for span in spans.values()]]).fetchall()
    return {head: (first, last) for head, (first, last) in zip(spans, rows, strict=True) if first is not None}
