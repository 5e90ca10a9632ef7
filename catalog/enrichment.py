"""Enrichment (stream-table join): an event stream adds columns of a changelog table as dimensions.

    http_requests:
      key_field: user_id
      dimensions: [method]
      enrich:
        - {table: users, by: user_id, columns: [plan, country]}

For each event the pipeline looks up the table row whose key is the event's `by` field, as the
table was at the event's time (aggregates/enrichment.py, docs/tables.md "Enrichment"), and sets
the dimensions `plan` and `country` from it: "" when the key has no row then. The enriched
columns keep the table's column names (no `users.` prefix: a dimension name is a plain field
name everywhere, in group_by, filters, alert rules and the dashboard), so a clash with a declared
field of the stream is refused.

`table` may also name a view (catalog/views.py, a join of two tables), so events are grouped by a
column two joins away (`http_requests.user_id -> users.plan_id -> plans.tier`): its columns are the
view's (the left table's and the right table's); the lookup joins the two tables' versions as of
the event's time (docs/tables.md, "Enrichment through a view"). `enrichment_tables` names the
changelog tables an enrichment reads, one or two.

The enriched names are appended to the stream's `dimensions` on load, so the rest of the product
(panes, queries, tiers, the dashboard) sees them as ordinary dimensions; a dump of the stream
leaves them out again (model.StreamDef's serializer), so a stored declaration loads back the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef
    from catalog.views import ViewDef

NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"


class EnrichDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    table: str = Field(pattern=NAME_RE)  # a stream of kind: table, or a view of two
    by: str = Field(pattern=NAME_RE)  # the event's field whose value is the table's key
    columns: tuple[str, ...] = Field(min_length=1)  # dimensions of the table, added to the stream


def enriched_columns(data_enrich) -> tuple[str, ...]:
    """The dimension names a raw or parsed `enrich` list adds, in declaration order."""
    out: list[str] = []
    for decl in data_enrich or ():
        columns = decl.columns if isinstance(decl, EnrichDef) else (decl or {}).get("columns") if isinstance(decl, dict) else ()
        for column in columns or ():
            if isinstance(column, str):
                out.append(column)
    return tuple(out)


def with_enriched_dimensions(data: object) -> object:
    """Raw stream data with its enriched columns appended to its dimensions. A name declared
    twice (a declared field, or two enrichments adding the same column) is refused here with the
    reason, since after this step it could no longer be told apart."""
    if not isinstance(data, dict) or not data.get("enrich"):
        return data
    if not isinstance(data["enrich"], (list, tuple)):
        return data  # the field's own validation says what is wrong
    added = enriched_columns(data["enrich"])
    declared = {data.get("time_field", "time"), data.get("key_field"), data.get("event_id_field"),
                *(data.get("dimensions") or ()), *(data.get("values") or ()), *(data.get("distinct") or ())}
    seen: set[str] = set()
    for name in added:
        if name in declared:
            raise ValueError(f"enrich: column {name!r} clashes with a declared field of the stream of that name"
                             " (an enriched column becomes a dimension of the same name)")
        if name in seen:
            raise ValueError(f"enrich: column {name!r} is added twice")
        seen.add(name)
    dims = data.get("dimensions") or ()
    if not isinstance(dims, (list, tuple)):
        return data
    return {**data, "dimensions": (*dims, *added)}


def check_stream_enrichment(stream: StreamDef) -> None:
    """What a stream with `enrich` may not be (ValueError naming why)."""
    if not stream.enrich:
        return
    if stream.kind == "table":
        raise ValueError("enrich: a table (kind: table) cannot be enriched; enrichment is for event streams")
    declared = set(stream.dimensions) - set(stream.enriched_dimensions)
    strings = {*declared, *stream.distinct_fields, *((stream.key_field,) if stream.key_field else ())}
    for decl in stream.enrich:
        if decl.by not in strings:
            raise ValueError(f"enrich: by {decl.by!r} must be the key_field, a dimension or a distinct field of the"
                             f" stream (declared strings: {', '.join(sorted(strings)) or 'none'})")


def check_catalog_enrichment(catalog: Catalog) -> None:
    """Cross-references: each enrichment names a table or a view of the catalog and dimensions of it."""
    from catalog.model import CatalogReferenceError
    from catalog.tables import OP_FIELD

    for name, stream in catalog.streams.items():
        for i, decl in enumerate(stream.enrich):
            table = catalog.streams.get(decl.table)
            view = catalog.views.get(decl.table)
            if table is None:
                raise CatalogReferenceError(("streams", name, "enrich", i, "table"),
                                            f"unknown table {decl.table!r} (tables and views:"
                                            f" {', '.join(_enrichable(catalog)) or 'none'})")
            if table.kind != "table" and view is None:
                raise CatalogReferenceError(("streams", name, "enrich", i, "table"),
                                            f"stream {decl.table!r} is not a table (declare it kind: table)"
                                            " or a view")
            what = "view" if view is not None else "table"
            # A view's derived stream has the dimensions op and the view row's string columns.
            columns = [d for d in table.dimensions if d != OP_FIELD]
            pinned = catalog.pinned_views.get(name, {}).get(decl.table)
            if pinned is not None:  # the declaration the stream's stored definition looked up through
                from catalog.views import view_columns

                columns = list(view_columns(catalog.streams[pinned.left], catalog.streams[pinned.right])[0])
            for j, column in enumerate(decl.columns):
                if column not in columns:
                    raise CatalogReferenceError(
                        ("streams", name, "enrich", i, "columns", j),
                        f"{column!r} is not a dimension of {what} {decl.table!r}"
                        f" (dimensions: {', '.join(columns) or 'none'})")


def _enrichable(catalog: Catalog) -> list[str]:
    return sorted(n for n, s in catalog.streams.items()
                  if (s.kind == "table" and not s.derived_from) or n in catalog.views)


def enrichment_view(catalog: Catalog, decl: EnrichDef, stream: str | None = None) -> ViewDef | None:
    """The view an enrichment of `stream` looks up through (None: a plain table). A stream computed
    as stored until its switch (catalog/versions.py pinned_catalog) keeps the view's declaration
    its stored definition was computed with (`Catalog.pinned_views`); the view's own rows follow
    the configured one (`catalog.views`)."""
    if stream is not None:
        pinned = catalog.pinned_views.get(stream, {}).get(decl.table)
        if pinned is not None:
            return pinned
    return catalog.views.get(decl.table)


def enrichment_tables(catalog: Catalog, decl: EnrichDef, stream: str | None = None) -> tuple[str, ...]:
    """The changelog tables an enrichment (of `stream`) reads: its table, or a view's left and right tables."""
    view = enrichment_view(catalog, decl, stream)
    return (decl.table,) if view is None else (view.left, view.right)


def enrichment_definition(stream: StreamDef, views: Mapping[str, ViewDef] | None = None) -> list[dict]:
    """The enrichment part of a stream's definition version (catalog/versions.py). Through a view
    (when `views` is given), its declaration counts too: another foreign key or kind enriches the
    same events with other rows. A plain table's entry has no `view` key (versions unchanged)."""
    out = []
    for d in stream.enrich:
        entry = {"table": d.table, "by": d.by, "columns": list(d.columns)}
        view = (views or {}).get(d.table)
        if view is not None:
            entry["view"] = {"left": view.left, "right": view.right, "foreign_key": view.foreign_key,
                             "kind": view.kind}
        out.append(entry)
    return out


def append_cut_streams(catalog: Catalog) -> tuple[list[str], list[str]]:
    """What a pipeline of `catalog` cuts each batch of at one log append time (ingest/append_cut.py):
    (the tables its streams are enriched from, directly or through a view, with the streams
    enriched; those tables), each sorted, of the catalog's streams only. Both empty where nothing
    is enriched: its batches are shared fairly across partitions, no cut needed."""
    tables = {t for name, s in catalog.streams.items() for decl in s.enrich
              for t in enrichment_tables(catalog, decl, name)}
    enriched = {name for name, s in catalog.streams.items() if s.enrich}
    return (sorted((tables | enriched) & set(catalog.streams)), sorted(tables & set(catalog.streams)))
