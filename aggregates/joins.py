"""Stream-stream window joins in the pane pipeline's micro-batch (catalog/joins.py declares them,
aggregates/window_join.py is the rule, store/joins.py the state).

Per batch, on the driver: the records of the joined streams that the batch merges (not dead
letters) are collected once (one Arrow transfer of stream, partition, offset, event time, dims
and ids), each join reads the stored state its keys touch (one lookup), the rule pairs them,
and the derived rows are rolled up into pane partials of the join's derived stream here (count,
per value n/sum/min/max, a KLL sketch of latency_ms). The partials and the state changes go
into the batch's own store commit: the same transaction as its panes and batch id, so the join
is exactly once across restarts and a late pair merges into its left event's pane through the
normal late path (a correction when that pane was final).

Why not Spark's stream-stream join: it drops rows behind its watermark (a click later than the
allowed lateness would vanish silently) and keeps its state in the checkpoint, apart from the
store transaction that records the batch (docs/architecture.md, "Window joins").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from aggregates.driver_rules import list_get
from aggregates.partials import merged_records
from aggregates.window_join import DerivedColumns, DerivedRow, JoinRule, expire_through, join_batch, join_clock
from catalog import Catalog
from catalog.joins import JOIN_VALUES, JoinDef, key_slot
from sketches import DEFAULT_K, KllSketch
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats
from store.joins import JoinCommit, JoinEvent
from store.panes import advance_watermark, pane_start
from store.commit_plan import partition_clock_ms
from store.watermarks import advance_stream

LATENCY = "latency_ms"
RECORD_COLUMNS = ("stream", "partition", "offset", "event_time", "dims", "ids")  # what the joins read


@dataclass(frozen=True)
class JoinedBatch:
    partials: list[PanePartial] = field(default_factory=list)
    commits: list[JoinCommit] = field(default_factory=list)
    max_event_ms: dict[str, int] = field(default_factory=dict)  # per derived stream: its newest left time
    watermark_cap_ms: dict[str, int | None] = field(default_factory=dict)  # per derived stream: its join's clock - within
    pairs: int = 0
    unmatched_right: int = 0


def rule_of(join: JoinDef) -> JoinRule:
    return JoinRule(join.name, join.within, join.late_horizon)


def side_events(records: pa.Table, catalog: Catalog, stream: str, key: str, *, with_dims: bool) -> list[JoinEvent]:
    """The batch's records of one side of a join, as join events (the key read where the
    source carries it: ids or dims); a record without a key gets the key None. An empty key is
    none either: a missing dimension is stored as "", and as a key it would pair every search
    without one with every click without one (as the Bloom and session keys, key_rows.py)."""
    rows = records.filter(pc.equal(records["stream"], stream))
    kind, index = key_slot(catalog.streams[stream], key)
    keys = [k or None for k in list_get(rows[kind], index).to_pylist()]  # null past the end, as F.get
    dims = rows["dims"].to_pylist() if with_dims else [()] * rows.num_rows
    width = len(catalog.streams[stream].dimensions)
    return [JoinEvent(t, p, o, k, tuple((d or [])[:width]) + (None,) * (width - len(d or [])) if with_dims else ())
            for t, p, o, k, d in zip(rows["event_time"].to_pylist(), rows["partition"].to_pylist(),
                                     rows["offset"].to_pylist(), keys, dims, strict=True)]


def derived_partials(rows: Iterable[DerivedRow], stream_name: str, dimensions: tuple[str, ...], pane_ms: int,
                     kll_k: int = DEFAULT_K, sketched: Collection[str] = (LATENCY,)) -> list[PanePartial]:
    """The derived rows rolled up per (pane, dimension values): count = rows; per value field
    n/sum/min/max; a KLL sketch for the `sketched` values (latency_ms: its percentiles), none for
    the 0/1 counters."""
    groups: dict[tuple[int, tuple], dict] = {}
    for row in rows:
        start = pane_start(row.time_ms, pane_ms)
        g = groups.setdefault((start, row.dims), {"count": 0, "values": {}, "klls": {}})
        g["count"] += 1
        for name, v in row.values.items():
            n, s, lo, hi = g["values"].get(name, (0, 0, None, None))
            g["values"][name] = (n + 1, s + v, v if lo is None else min(lo, v), v if hi is None else max(hi, v))
            if name in sketched:
                kll = g["klls"]
                if name not in kll:
                    kll[name] = KllSketch(kll_k)
                kll[name].update(v)
    out = []
    for (start, dims), g in sorted(groups.items(), key=lambda kv: (kv[0][0], [str(d) for d in kv[0][1]])):
        klls = g["klls"]
        values = {name: ValueStats(n, float(s), float(lo), float(hi),
                                   klls[name].to_bytes() if name in klls else None)
                  for name, (n, s, lo, hi) in g["values"].items()}
        dim_map = {d: v for d, v in zip(dimensions, dims) if v is not None}
        out.append(PanePartial(stream_name, start, start + pane_ms, dim_map, PaneData(g["count"], values, {})))
    return out


def join_partials(cols: DerivedColumns, stream_name: str, dimensions: tuple[str, ...], pane_ms: int,
                  kll_k: int = DEFAULT_K) -> list[PanePartial]:
    """A join's derived rows (as columns) rolled up per (pane, dimension values): what
    `derived_partials` makes of the same rows (count = rows; per value field n/sum/min/max; a KLL
    of latency_ms fed in the pairs' order), computed with numpy per kind of row."""
    sides = ((cols.search_ms, cols.search_dims), (cols.pair_ms, cols.pair_dims),
             (cols.unmatched_ms, [()] * len(cols.unmatched_ms)))
    dims_of = list(dict.fromkeys(d for _, dims in sides for d in dims))  # the few distinct combinations
    if not dims_of:
        return []
    code_of = {d: i for i, d in enumerate(dims_of)}
    times = np.concatenate([np.asarray(t, np.int64) for t, _ in sides])
    combos = np.concatenate([np.fromiter(map(code_of.__getitem__, dims), np.int64, len(dims)) for _, dims in sides])
    # One int64 per (pane, combination): the pane's number times the combinations, plus its own.
    group_keys, gid = np.unique(np.floor_divide(times, pane_ms) * len(dims_of) + combos, return_inverse=True)
    gid = gid.reshape(-1)
    g = len(group_keys)
    pane_of, combo_of = np.divmod(group_keys, len(dims_of))
    groups = zip((pane_of * pane_ms).tolist(), combo_of.tolist())
    n_search, n_pair = len(cols.search_ms), len(cols.pair_ms)
    g_search, g_pair, g_unmatched = gid[:n_search], gid[n_search:n_search + n_pair], gid[n_search + n_pair:]
    count = np.bincount(gid, minlength=g)

    def ones(at: np.ndarray) -> np.ndarray:  # n per group of a value that is always 1 (sum n, min = max = 1)
        return np.bincount(at, minlength=g)

    searches, pairs, unmatched = ones(g_search), ones(g_pair), ones(g_unmatched)
    clicked = np.asarray(cols.pair_clicked, np.int64)
    latency = np.asarray(cols.pair_latency, np.int64)
    clicked_sum = np.bincount(g_pair, weights=clicked, minlength=g).astype(np.int64)
    latency_sum = np.zeros(g, np.int64)
    np.add.at(latency_sum, g_pair, latency)
    latency_lo, latency_hi = np.full(g, np.iinfo(np.int64).max), np.full(g, np.iinfo(np.int64).min)
    np.minimum.at(latency_lo, g_pair, latency)
    np.maximum.at(latency_hi, g_pair, latency)
    # Each group's latencies in the pairs' order (a stable sort by group), one KLL update call each.
    order = np.argsort(g_pair, kind="stable")
    bounds = np.searchsorted(g_pair[order], np.arange(g + 1))
    latency_f = latency[order].astype(np.float64)
    out = []
    for i, ((start, combo), n) in enumerate(zip(groups, count.tolist(), strict=True)):
        values = {}
        if searches[i]:
            values["searches"] = ValueStats(int(searches[i]), float(searches[i]), 1.0, 1.0, None)
        if pairs[i]:
            n_p, c = int(pairs[i]), int(clicked_sum[i])
            kll = KllSketch(kll_k)
            kll.update_all(latency_f[bounds[i]:bounds[i + 1]])
            values["pairs"] = ValueStats(n_p, float(n_p), 1.0, 1.0, None)
            values["clicked"] = ValueStats(n_p, float(c), float(int(c == n_p)), float(int(c > 0)), None)
            values[LATENCY] = ValueStats(n_p, float(latency_sum[i]), float(latency_lo[i]), float(latency_hi[i]),
                                         kll.to_bytes())
        if unmatched[i]:
            values["unmatched_right"] = ValueStats(int(unmatched[i]), float(unmatched[i]), 1.0, 1.0, None)
        dim_map = {d: v for d, v in zip(dimensions, dims_of[combo]) if v is not None}
        out.append(((start, [str(d) for d in dims_of[combo]]),
                    PanePartial(stream_name, start, start + pane_ms, dim_map, PaneData(n, values, {}))))
    out.sort(key=lambda pair: pair[0])  # derived_partials' order
    return [partial for _, partial in out]


class WindowJoins:
    def __init__(self, catalog: Catalog, store: PaneStore, *, kll_k: int = DEFAULT_K):
        self.catalog, self.store, self.kll_k = catalog, store, kll_k
        self.joins = list(catalog.joins)
        self.enabled = bool(self.joins)
        self.names = [j.name for j in self.joins]
        self.streams = sorted({s for j in self.joins for s in (j.left.stream, j.right.stream)})

    def records(self, batch: DataFrame, batch_now_ms: int, *, on_driver: bool = False,
                streams: Collection[str] | None = None, rows=None) -> pa.Table:
        """The batch's records of the joined streams that it merges (dead letters join nothing)."""
        return merged_records(batch, self.catalog, batch_now_ms, self.streams, RECORD_COLUMNS, present=streams,
                              on_driver=on_driver, rows=rows)

    def process(self, batch: DataFrame, batch_now_ms: int, commit: BatchCommit,
                idle_timeout_ms: Mapping[str, int] | None = None, *, on_driver: bool = False,
                streams: Collection[str] | None = None, rows=None) -> JoinedBatch:
        """`rows`: the batch on the driver collected once (aggregates/driver_rows.py), or None."""
        return self.join(self.records(batch, batch_now_ms, on_driver=on_driver, streams=streams, rows=rows), commit,
                         now_ms=batch_now_ms, idle_timeout_ms=idle_timeout_ms)

    def join(self, records: pa.Table, commit: BatchCommit, *, now_ms: int,
             idle_timeout_ms: Mapping[str, int] | None = None) -> JoinedBatch:
        """Every join over the batch's records (JOIN columns), with the state the store holds;
        `commit` is the batch's own commit (its streams' progress: the join's clock)."""
        out = JoinedBatch()
        pairs = unmatched = 0
        marks = self.watermarks_after(commit, now_ms=now_ms, idle_timeout_ms=idle_timeout_ms)
        for join in self.joins:
            rule = rule_of(join)
            lefts = side_events(records, self.catalog, join.left.stream, join.left.key, with_dims=True)
            rights = side_events(records, self.catalog, join.right.stream, join.right.key, with_dims=False)
            # A record without the key can match nothing: a left one still counts as a search,
            # a right one is unmatched at once.
            keyless_lefts = [e for e in lefts if e.key is None]
            keyless_rights = [e for e in rights if e.key is None]
            lefts = [e for e in lefts if e.key is not None]
            rights = [e for e in rights if e.key is not None]
            stored_clock = self.store.join_state(join.name, [], None).clock_ms
            clock = join_clock(stored_clock, marks.get(join.left.stream), marks.get(join.right.stream))
            through = expire_through(clock, rule.keep_ms)
            state_before = self.store.join_state(join.name, sorted({e.key for e in [*lefts, *rights]}), through)
            outcome = join_batch(rule, state_before, lefts, rights, clock)
            columns, commit = outcome.columns, outcome.commit
            columns.search_ms += [e.time_ms for e in keyless_lefts]
            columns.search_dims += [e.dims for e in keyless_lefts]
            columns.unmatched_ms += [e.time_ms for e in keyless_rights]
            if keyless_rights:
                commit = replace(commit, unmatched_right=commit.unmatched_right + len(keyless_rights))
            stream = self.catalog.streams[join.name]
            out.partials.extend(join_partials(columns, join.name, stream.dimensions, stream.pane, self.kll_k))
            out.commits.append(commit)
            left_times = [e.time_ms for e in lefts] + [e.time_ms for e in keyless_lefts]
            if left_times:
                out.max_event_ms[join.name] = max(left_times)
            out.watermark_cap_ms[join.name] = None if clock is None else clock - join.within
            pairs += commit.pairs
            unmatched += commit.unmatched_right
        return JoinedBatch(out.partials, out.commits, out.max_event_ms, out.watermark_cap_ms, pairs, unmatched)

    def watermarks_after(self, commit: BatchCommit, *, now_ms: int,
                         idle_timeout_ms: Mapping[str, int] | None = None) -> dict[str, int | None]:
        return stream_watermarks_after(self.store, self.catalog, self.streams, commit, now_ms=now_ms,
                                       idle_timeout_ms=idle_timeout_ms)


def stream_watermarks_after(store: PaneStore, catalog: Catalog, streams: Iterable[str], commit: BatchCommit, *,
                            now_ms: int, idle_timeout_ms: Mapping[str, int] | None = None) -> dict[str, int | None]:
    """Each of `streams`' watermark once this batch is committed, by the rule the store's
    commit applies (store/commit_plan.py): per partition where the commit carries partition
    marks (a partition with unread records holds it back), else its newest event - lateness.
    (The joins' clock, and what closes sessions: aggregates/session_batch.py.) Idle partitions
    are judged at the instant the store's commit judges them (`partition_clock_ms`: the commit's
    `batch_now_ms`; `now_ms` only for a commit without one), so what closes here is what is stored."""
    before = store.progress(commit.pipeline, row_counts=False).streams  # every batch: no count of the panes
    judged_ms = partition_clock_ms(commit, now_ms)
    out: dict[str, int | None] = {}
    for name in streams:
        stream, stored = catalog.streams[name], before.get(name)
        previous = None if stored is None else stored.watermark_ms
        if name in commit.partition_max_event_ms:
            marks = {p: pp.mark for p, pp in (stored.partitions if stored is not None else {}).items()}
            _, after = advance_stream(
                previous, marks, batch_max_event_ms=commit.partition_max_event_ms[name],
                read_offsets=commit.end_offsets.get(name, {}), log_end_offsets=commit.log_end_offsets.get(name, {}),
                lateness_ms=stream.allowed_lateness, now_ms=judged_ms,
                idle_timeout_ms=(idle_timeout_ms or {}).get(name, stream.partition_idle_timeout))
            out[name] = after.watermark_ms
        else:
            out[name] = advance_watermark(previous, commit.max_event_ms.get(name), stream.allowed_lateness)
    return out


def with_joins(commit: BatchCommit, joined: JoinedBatch, join_names: Iterable[str]) -> BatchCommit:
    """The batch's commit with the joins' derived partials and state. A join's derived stream
    is read from no log partition: its watermark follows the stream-wide rule (its newest left
    time - its allowed lateness, which includes `within`), not per-partition marks, and never
    passes the join's clock - within: while a lagging partition of either side holds the clock,
    pairs can still come for the panes behind it, so they must not be final yet."""
    names = set(join_names)
    max_event = commit.max_event_with(joined.max_event_ms)
    return replace(commit, partials=[*commit.partials, *joined.partials], joins=joined.commits, max_event_ms=max_event,
                   watermark_cap_ms={**commit.watermark_cap_ms, **joined.watermark_cap_ms},
                   partition_max_event_ms={s: m for s, m in commit.partition_max_event_ms.items() if s not in names})


__all__ = ["JOIN_VALUES", "JoinedBatch", "WindowJoins", "derived_partials", "join_partials", "side_events",
           "with_joins"]
