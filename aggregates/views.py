"""Table-table join views in the pipeline's batch (catalog/views.py declares them, the rule is
aggregates/view_join.py, the state store/view_state.py).

Per batch, on the driver, after the tables' newest change per key is known (aggregates/tables.py):
each view loads the state those changes touch (one lookup of its entries by left and right key,
one of each table's rows as the store holds them before the batch), applies the changes with the
rule and puts its changed entries into the batch's commit: the same transaction as the table
rows, so view and tables never disagree and a replayed batch changes neither twice. The view's
changes become panes of its derived stream (op upsert/delete, its columns), so its changelog is
a stream like a table's. A view whose stored rows were built for another declaration (a new view,
a changed one, or one dropped by `drop_view`) is rebuilt from the tables' stored rows first,
in the same batch: the state needs no log of its own, the compacted table logs rebuild it.

Event time: a view's change stream applies the rules of the table each change comes from
(aggregates/eventtime.py `dead_letter_reason`, the batch's `batch_now_ms` passed in): a view change
caused by a table change that the table's own panes dead-letter (too far in the future, beyond its
retention) is neither aggregated into the view's panes nor moves its watermark; it is counted per
view and reason (`ViewsBatch.dead`, the commit's `dead_by_stream`: the store's dead-letter counts),
one per view change, with no dead-letter row (those are one per log record, and the record is the
table's). The view's rows and changelog still take it, as the table's rows do: the view stays the
join of the tables.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from aggregates.eventtime import dead_letter_reason
from aggregates.view_join import TableEdit, ViewChange, ViewShape, ViewState, apply, from_scratch
from catalog import Catalog, StreamDef
from catalog.tables import DELETE, OP_FIELD, UPSERT, row_columns
from catalog.views import ViewDef, view_columns
from sketches import DEFAULT_K, KllSketch
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats
from store.panes import pane_start
from store.table_state import TableChange, TableRow
from store.view_state import ViewChangeRow, ViewCommit, ViewLink

PAGE = 1000


@dataclass(frozen=True)
class ViewsBatch:
    commits: list[ViewCommit] = field(default_factory=list)
    partials: list[PanePartial] = field(default_factory=list)
    max_event_ms: dict[str, int] = field(default_factory=dict)  # per view stream: its newest change time
    changes: int = 0  # view changes made (rows changed), aggregated or not
    rebuilt: tuple[str, ...] = ()
    # Per view stream and reason: its changes the event-time rules refused (not aggregated).
    dead: dict[str, dict[str, int]] = field(default_factory=dict)


def shape_of(catalog: Catalog, view: ViewDef) -> ViewShape:
    strings, numbers = row_columns(catalog.streams[view.right])
    return ViewShape(view.foreign_key, view.kind == "inner", (*strings, *numbers))


def definition_of(catalog: Catalog, view: ViewDef) -> str:
    """What the stored rows depend on: the declaration and both tables' columns."""
    left, right = catalog.streams[view.left], catalog.streams[view.right]
    return json.dumps({"view": view.model_dump(exclude={"description"}), "left": row_columns(left),
                       "right": row_columns(right)}, sort_keys=True)


def edits_of(view: ViewDef, changes: Mapping[str, Mapping[str, TableChange]]) -> list[TableEdit]:
    """The batch's changes of the view's tables, left then right, each in key order (the final
    view does not depend on the order: each change is applied against the state before it)."""
    return [TableEdit(side, key, c.row, c.event_time_ms, c.partition, c.offset)
            for side, table in (("left", view.left), ("right", view.right))
            for key, c in sorted(changes.get(table, {}).items())]


def refusals_of(catalog: Catalog, view: ViewDef, changes: Mapping[str, Mapping[str, TableChange]],
                batch_now_ms: int) -> list[str | None]:
    """Per edit of `edits_of` (same order): why the table it comes from dead-letters it, or None."""
    return [change_reason(catalog.streams[table], c, batch_now_ms)
            for table in (view.left, view.right)
            for _, c in sorted(changes.get(table, {}).items())]


def change_reason(table: StreamDef, change: TableChange, batch_now_ms: int) -> str | None:
    """The table's own dead-letter rule for one of its changes (the one its panes apply to the record)."""
    return dead_letter_reason(change.event_time_ms, change.ingest_time_ms, None, batch_now_ms=batch_now_ms,
                              retention_ms=table.retention, max_future_skew_ms=table.max_future_skew)


class Views:
    def __init__(self, catalog: Catalog, store: PaneStore, *, kll_k: int = DEFAULT_K):
        self.catalog = catalog
        self.store = store
        self.kll_k = kll_k

    @property
    def enabled(self) -> bool:
        return bool(self.catalog.views)

    @property
    def names(self) -> list[str]:
        return list(self.catalog.views)

    def process(self, changes: Mapping[str, Mapping[str, TableChange]], *, batch_now_ms: int) -> ViewsBatch:
        """`batch_now_ms`: the pipeline's clock at the start of the batch (the retention rule's now)."""
        commits, partials, newest, rebuilt, count = [], [], {}, [], 0
        dead: dict[str, dict[str, int]] = {}
        for name, view in self.catalog.views.items():
            definition = definition_of(self.catalog, view)
            fresh = self.store.view_definition(name) != definition
            edits = edits_of(view, changes)
            if not edits and not fresh:
                continue
            shape = shape_of(self.catalog, view)
            state, touched, stored = self._rebuilt(view, shape) if fresh else self._loaded(view, shape, edits)
            # Every edit changes the state (the view stays the join of the tables); only the changes
            # of the edits the table's rules accept are events of the view's stream. A rebuild joins
            # the stored rows without changes, so each refused change is counted once, by its batch.
            made, kept, refused = [], [], defaultdict(int)
            for edit, reason in zip(edits, refusals_of(self.catalog, view, changes, batch_now_ms), strict=True):
                caused = apply(shape, state, edit)
                made += caused
                if reason is None:
                    kept += caused
                elif caused:
                    refused[reason] += len(caused)
            touched = set(state.left) if fresh else touched | {e.key for e in edits if e.side == "left"}
            commits.append(ViewCommit(name, definition, self._links(state, touched, stored, made), rebuilt=fresh,
                                      changes=[ViewChangeRow(c.key, c.old, c.new, c.time_ms, c.partition, c.offset)
                                               for c in made],
                                      retention_ms=self.catalog.streams[name].retention))
            partials += change_partials(self.catalog, view, kept, self.kll_k)
            if kept:
                newest[name] = max(c.time_ms for c in kept)
            if refused:
                dead[name] = dict(refused)
            if fresh:
                rebuilt.append(name)
            count += len(made)
        return ViewsBatch(commits, partials, newest, count, tuple(rebuilt), dead)

    def _loaded(self, view: ViewDef, shape: ViewShape, edits: list[TableEdit]
                ) -> tuple[ViewState, set[str], dict[str, ViewLink]]:
        """The state the edits touch, as stored before the batch."""
        left_keys = [e.key for e in edits if e.side == "left"]
        right_keys = [e.key for e in edits if e.side == "right"]
        links = self.store.view_links(view.name, left_keys, right_keys)
        touched = {link.left_key for link in links} | set(left_keys)
        wanted = set(right_keys) | {link.right_key for link in links if link.right_key is not None}
        wanted |= {shape.right_key(e.key, e.row) for e in edits if e.side == "left" and e.row is not None} - {None}
        state = ViewState(left=self.store.table_rows_by_key(view.left, sorted(touched)),
                          right=self.store.table_rows_by_key(view.right, sorted(wanted)))
        for link in links:
            state.link(link.left_key, link.right_key)
            if link.row is not None:
                state.rows[link.left_key] = dict(link.row)
        return state, touched, {link.left_key: link for link in links}

    def _rebuilt(self, view: ViewDef, shape: ViewShape) -> tuple[ViewState, set[str], dict[str, ViewLink]]:
        """The whole view joined from the tables' stored rows (before the batch)."""
        lefts, rights = self._all_rows(view.left), self._all_rows(view.right)
        # An entry no change of this batch sets keeps the position of its left row's change.
        stored = {r.key: ViewLink(r.key, None, None, r.event_time_ms, r.partition, r.offset) for r in lefts}
        return (from_scratch(shape, {r.key: r.row for r in lefts}, {r.key: r.row for r in rights}), set(),
                stored)

    def _all_rows(self, table: str) -> list[TableRow]:
        rows: list[TableRow] = []
        after: str | None = None  # from the first row: a row keyed "" too (store/table_state.py page_compare)
        while True:
            page = self.store.table_rows(table, after=after, limit=PAGE)
            rows += page
            if len(page) < PAGE:
                return rows
            after = page[-1].key

    @staticmethod
    def _links(state: ViewState, touched: Iterable[str], stored: Mapping[str, ViewLink], made: list[ViewChange]
               ) -> dict[str, ViewLink | None]:
        """The touched left keys' new entries; each keeps the position of the change that last set
        its view row (or of its stored entry, or of the left row's change)."""
        source: dict[str, tuple[int, int, int]] = {c.key: (c.time_ms, c.partition, c.offset) for c in made}
        out: dict[str, ViewLink | None] = {}
        for key in touched:
            if key not in state.left:
                out[key] = None
                continue
            had = stored.get(key)
            t, p, o = source.get(key) or ((had.event_time_ms, had.partition, had.offset) if had else (0, -1, -1))
            out[key] = ViewLink(key, state.links.get(key), state.rows.get(key), t, p, o)
        return out


def change_partials(catalog: Catalog, view: ViewDef, changes: Iterable[ViewChange],
                    kll_k: int = DEFAULT_K) -> list[PanePartial]:
    """The view's changes as panes of its derived stream: one event per change, dimensions op and
    the row's strings (a delete: the old row's), values the new row's numbers."""
    stream = catalog.streams[view.name]
    strings, numbers = view_columns(catalog.streams[view.left], catalog.streams[view.right])
    groups: dict[tuple[int, tuple], dict] = {}
    for c in changes:
        row = c.new if c.new is not None else (c.old or {})
        dims = ((OP_FIELD, UPSERT if c.new is not None else DELETE),
                *((s, row.get(s)) for s in strings if row.get(s) not in (None, "")))
        g = groups.setdefault((pane_start(c.time_ms, stream.pane), dims), {"count": 0, "values": {}})
        g["count"] += 1
        for name in numbers if c.new is not None else ():
            v = c.new.get(name)
            if v is None:
                continue
            v = float(v)
            n, s, lo, hi, kll = g["values"].get(name, (0, 0.0, v, v, None))
            kll = kll or KllSketch(kll_k)
            kll.update(v)
            g["values"][name] = (n + 1, s + v, min(lo, v), max(hi, v), kll)
    return [PanePartial(view.name, start, start + stream.pane, dict(dims),
                        PaneData(g["count"], {name: ValueStats(n, s, lo, hi, kll.to_bytes())
                                              for name, (n, s, lo, hi, kll) in g["values"].items()}, {}))
            for (start, dims), g in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]


def with_views(commit: BatchCommit, batch: ViewsBatch, view_names: Iterable[str]) -> BatchCommit:
    """The batch's commit with the views' entries and change panes. A view's stream is read from
    no log partition: its watermark follows the stream-wide rule, as a join's derived stream. Its
    refused changes are counted as its dead letters by reason (no read_by_stream entry: the store
    takes read = aggregated + dead-lettered for it)."""
    names = set(view_names)
    max_event = commit.max_event_with(batch.max_event_ms)
    dead = {s: dict(r) for s, r in commit.dead_by_stream.items()}
    for stream, reasons in batch.dead.items():
        counts = dead.setdefault(stream, {})
        for reason, n in reasons.items():
            counts[reason] = counts.get(reason, 0) + n
    return replace(commit, partials=[*commit.partials, *batch.partials], views=batch.commits,
                   max_event_ms=max_event, dead_by_stream=dead,
                   partition_max_event_ms={s: m for s, m in commit.partition_max_event_ms.items() if s not in names})
