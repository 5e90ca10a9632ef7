"""Table-table joins as maintained views (top-level `views:`), as ksqlDB/Kafka Streams table joins.

    views:
      user_plans:
        left: users               # a changelog table (kind: table): one view row per left row
        right: plans              # another changelog table
        foreign_key: plan_id      # a dimension of the left table holding the right table's key;
                                  # left out: the two tables join on their primary keys
        kind: left                # inner (default): only left rows with a right row; left: every
                                  # left row, the right's columns empty when it has no match

A view's row is keyed by the left table's key and holds the left row's columns and the right
row's. The pipeline maintains it with each batch (aggregates/views.py, the rule in
aggregates/view_join.py) and its changes are a derived stream named after the view: dimensions
`op` (upsert/delete) and the view's string columns, values its number columns, so a metric over
the view counts its changes like a table's. Its current rows answer GET /api/v1/tables/{view}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from catalog.durations import format_duration_ms
from catalog.tables import OP_FIELD, row_columns

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef

_Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")]
ViewKind = Literal["inner", "left"]


class ViewDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    left: _Name
    right: _Name
    foreign_key: _Name | None = None  # None: join on the two primary keys
    kind: ViewKind = "inner"
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> ViewDef:
        if self.left == self.right:
            raise ValueError("a view joins two different tables (left and right name the same one)")
        return self


def view_columns(left: StreamDef, right: StreamDef) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(string columns, number columns) of a view's row: the left row's, then the right row's."""
    ls, ln = row_columns(left)
    rs, rn = row_columns(right)
    return (*ls, *rs), (*ln, *rn)


def expand_views(catalog: Catalog) -> None:
    """Check each view against its tables and add its derived change stream (idempotent: a
    catalog dumped and parsed again already has it). Errors carry the path of the bad entry."""
    from catalog.features import generated_stream
    from catalog.model import CatalogReferenceError

    for name, view in catalog.views.items():
        if name != view.name:
            raise CatalogReferenceError(("views", name, "name"), f"the name {view.name!r} differs from its key {name!r}")
        sides = {}
        for role in ("left", "right"):
            table = catalog.streams.get(getattr(view, role))
            if table is None or table.derived_from:
                tables = sorted(n for n, s in catalog.streams.items() if s.kind == "table" and not s.derived_from)
                raise CatalogReferenceError(("views", name, role), f"unknown table {getattr(view, role)!r}"
                                            f" (tables: {', '.join(tables) or 'none'})")
            if table.kind != "table":
                raise CatalogReferenceError(("views", name, role), f"{table.name!r} is an event stream; a view joins"
                                            " changelog tables (kind: table)")
            sides[role] = table
        left, right = sides["left"], sides["right"]
        left_strings, _ = row_columns(left)
        if view.foreign_key is not None and view.foreign_key not in left_strings:
            raise CatalogReferenceError(("views", name, "foreign_key"),
                                        f"{view.foreign_key!r} is not a dimension of table {left.name!r}"
                                        f" (dimensions: {', '.join(left_strings) or 'none'}); the foreign key"
                                        f" holds the key of {right.name!r}")
        strings, numbers = view_columns(left, right)
        columns = [*strings, *numbers]
        both = [c for c in dict.fromkeys(columns) if columns.count(c) > 1 or c == left.key_field]
        if both:
            raise CatalogReferenceError(("views", name, "right"),
                                        f"column {both[0]!r} is in both {left.name!r} and {right.name!r}: a view's"
                                        " row holds both rows' columns by name; rename one of them")
        spec = generated_stream(
            ("views", name), f"(its change stream: the time field of {left.name}, the columns of both tables)",
            name=name,
            description=view.description or f"view: {left.name} {view.kind} join {right.name} on"
                        f" {view.foreign_key or 'the key'}",
            time_field=left.time_field,
            dimensions=(OP_FIELD, *strings),
            values=numbers,
            distinct=(),
            pane=format_duration_ms(left.pane),
            allowed_lateness=format_duration_ms(max(left.allowed_lateness, right.allowed_lateness)),
            retention=format_duration_ms(max(left.retention, right.retention)),
            partitions=1,
            tiers=left.tiers,
            derived_from=left.name,
        )
        existing = catalog.streams.get(name)
        if existing is not None and existing != spec:
            raise CatalogReferenceError(("views", name), f"the name {name!r} is already a stream")
        catalog.streams[name] = spec


def view_of(catalog: Catalog, name: str) -> ViewDef | None:
    return catalog.views.get(name)
