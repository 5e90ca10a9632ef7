"""How pane-shaped rows (panes and tier rows) are stored, whatever the backend: the exact
stats as JSON text, the sketches as one blob per (field, kind), and the stored pieces put
back together as Panes. Pure: no I/O.

The stats stay JSON text (not PostgreSQL jsonb) so both backends keep the same bytes and a
float comes back bit for bit (jsonb would also reject an infinite sum)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from store.panes import Pane, PaneData, PaneKey, ValueStats
from store.rollup import BucketStats

KLL = "kll"  # the sketch of a value field
HLL = "hll"  # the sketch of a distinct field


_STATS_JSON = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps would build one per row


def stats_text(data: PaneData) -> str:
    """The JSON text of a row's exact stats, written field by field: the text the encoder wrote
    for {name: v.to_json()} (tests pin it), at a third of its cost, for every row a commit writes."""
    fields = []
    for name, v in sorted(data.values.items()):
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = _STATS_JSON.encode(name)
        fields.append(f'{key}:{{"n":{_number(v.n)},"sum":{_number(v.sum)},"min":{_number(v.min)},'
                      f'"max":{_number(v.max)}}}')
    return "{" + ",".join(fields) + "}"


_KEYS: dict[str, str] = {}  # field name -> its JSON string (field names are few)
_INF = float("inf")


def _number(x) -> str:
    """What the JSON encoder writes for a number or None (NaN and infinities as it spells them)."""
    if type(x) is float:
        if x != x:
            return "NaN"
        if x == _INF or x == -_INF:
            return "Infinity" if x > 0 else "-Infinity"
        return float.__repr__(x)
    if type(x) is int:
        return int.__repr__(x)
    if x is None:
        return "null"
    return _STATS_JSON.encode(x)  # anything else (a bool, a numpy number): the encoder's own text


def sketch_rows(data: PaneData) -> list[tuple[str, str, bytes]]:
    """(field, kind, blob) of every sketch a row holds."""
    rows = [(name, KLL, v.kll) for name, v in data.values.items() if v.kll is not None]
    rows += [(name, HLL, hll) for name, hll in data.distincts.items() if hll is not None]
    return rows


def load_data(count: int, stats: str, sketches: Iterable[tuple[str, str, bytes]]) -> PaneData:
    """A stored row's data with all its sketches (what a merge into it needs)."""
    klls: dict[str, bytes] = {}
    hlls: dict[str, bytes] = {}
    for name, kind, blob in sketches:
        (klls if kind == KLL else hlls)[name] = bytes(blob)
    values = {name: ValueStats(v["n"], v["sum"], v["min"], v["max"], klls.get(name))
              for name, v in json.loads(stats).items()}
    return PaneData(count=count, values=values, distincts=hlls)


def wanted_sketches(with_sketches: bool, value_field: str | None, distinct_field: str | None) -> list[tuple[str, str]]:
    """The (field, kind) sketches a read asks for."""
    if not with_sketches:
        return []
    return [(f, k) for f, k in ((value_field, KLL), (distinct_field, HLL)) if f]


def assemble(stream: str, rows: Iterable[tuple], blobs: Mapping[tuple[int, str, str, str], bytes],
             sketches: Sequence[tuple[str, str]] | None) -> list[Pane]:
    """Panes from stored rows (start, dims, end, count, stats text or None, revision, updated,
    last batch) and their sketch blobs keyed (start, dims, field, kind). Rows read without their
    stats (None) carry only the KLLs asked for."""
    hlls = {name for (_, _, name, kind) in blobs if kind == HLL}
    klls = [f for f, k in sketches or () if k == KLL]
    out = []
    for s, d, e, count, text, revision, updated, batch in rows:
        if text is not None:
            values = {name: ValueStats(v["n"], v["sum"], v["min"], v["max"], blobs.get((s, d, name, KLL)))
                      for name, v in json.loads(text).items()}
        else:
            values = {name: ValueStats(0, 0.0, None, None, blobs[(s, d, name, KLL)])
                      for name in klls if (s, d, name, KLL) in blobs}
        distincts = {f: blobs[(s, d, f, HLL)] for f in hlls if (s, d, f, HLL) in blobs}
        out.append(Pane(PaneKey(stream, s, d), e, PaneData(count, values, distincts), revision, updated, batch))
    return out


def bucket_stats(rows: Iterable[tuple], group_by: Sequence[str]) -> list[BucketStats]:
    """BucketStats from a store's grouped sums: rows of (bucket, dims text, count, highest
    revision, n, sum, min, max, newest batch, rows summed), grouped by the stored dimensions
    text (no JSON parsing per row); each distinct text is parsed once and mapped to its group."""
    groups: dict[str, tuple[str, ...]] = {}
    out = []
    for bucket, dims, count, revision, n, total, lo, hi, last_batch, summed in rows:
        group = groups.get(dims)
        if group is None:
            parsed = json.loads(dims)
            group = groups[dims] = tuple(parsed.get(name, "") for name in group_by)
        out.append(BucketStats(group, bucket, count, revision, int(n or 0), float(total or 0.0), lo, hi,
                               last_batch, summed))
    return out
