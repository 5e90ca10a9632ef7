"""Stream-stream window joins declared in the configuration (top-level `joins:`).

    joins:
      - name: search_clicks          # also the name of the derived stream the join writes
        left:  {stream: searches, key: search_id}
        right: {stream: clicks, key: search_id}
        within: 30m                  # a right event matches when its time is in [left time, left time + within]
        late_horizon: 1h             # how long past the window a late event still matches

A join generates a derived stream named after it (dimensions: the left stream's; values:
JOIN_VALUES, see below) and metrics over it: `<name>_searches`, `<name>_pairs`,
`<name>_clicked` (stat `ratio` = clicked / searches: the click-through rate), `<name>_latency`
(right time - left time, percentiles) and `<name>_unmatched_right`. The pipeline computes the
join in its micro-batch (aggregates/window_join.py, aggregates/joins.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from catalog.durations import DurationMs, format_duration_ms
from catalog.features import check_generated_names, generated_stream

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef

_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_Name = Annotated[str, Field(pattern=_NAME)]

# The derived stream's value fields. Every derived row carries the LEFT event's time (the pane
# of the search) and dimensions, except unmatched_right rows (the right event's own time, no
# dimensions: no left is known). searches: 1 per left event; pairs: 1 per matched (left, right);
# clicked: 1 on a left event's first match; latency_ms: right time - left time, on pair rows;
# unmatched_right: 1 per right event that matched no left before it left the join's state.
JOIN_VALUES = ("searches", "pairs", "clicked", "latency_ms", "unmatched_right")
JOIN_TIME_FIELD = "left_time"
DEFAULT_LATE_HORIZON_MS = 3_600_000


class JoinSide(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: _Name
    key: _Name


class JoinDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    left: JoinSide
    right: JoinSide
    within: DurationMs
    late_horizon: DurationMs = DEFAULT_LATE_HORIZON_MS
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> JoinDef:
        if self.left.stream == self.right.stream:
            raise ValueError("a join needs two different streams (left and right name the same one)")
        if self.within < 1_000:
            raise ValueError("within must be at least 1s")
        if self.late_horizon < 0:
            raise ValueError("late_horizon must not be negative")
        return self

    @property
    def keep_ms(self) -> int:
        """How long past its own time an event stays in the join's state (by the join's clock: the lower of its two streams' watermarks)."""
        return self.within + self.late_horizon


def join_metric_names(name: str) -> dict[str, str]:
    """The generated metrics of a join: metric name -> its value field."""
    return {f"{name}_searches": "searches", f"{name}_pairs": "pairs", f"{name}_clicked": "clicked",
            f"{name}_latency": "latency_ms", f"{name}_unmatched_right": "unmatched_right"}


def expand_joins(catalog: Catalog) -> None:
    """Check each join against its streams and add its derived stream and metrics (idempotent:
    a catalog dumped and parsed again already has them)."""
    from catalog.model import CatalogReferenceError, MetricDef, StreamDef

    names = [j.name for j in catalog.joins]
    carried: dict[str, set[str]] = {}  # per stream: join keys the source must carry in `ids`
    for i, join in enumerate(catalog.joins):
        if names.count(join.name) > 1:
            raise CatalogReferenceError(("joins", i, "name"), f"join {join.name!r} is declared twice")
        sides = {}
        for role, side in (("left", join.left), ("right", join.right)):
            stream = catalog.streams.get(side.stream)
            if stream is None:
                raise CatalogReferenceError(("joins", i, role, "stream"), f"unknown stream {side.stream!r}")
            if stream.derived_from:
                raise CatalogReferenceError(("joins", i, role, "stream"),
                                            f"stream {side.stream!r} is derived; a join reads streams from the log")
            if side.key not in stream.dimensions and side.key not in stream.string_fields:
                raise CatalogReferenceError(
                    ("joins", i, role, "key"),
                    f"field {side.key!r} must be the key_field, a dimension or a distinct field of stream"
                    f" {stream.name!r} (declared strings: {', '.join(stream.string_fields) or 'none'})")
            if side.key not in stream.dimensions:
                carried.setdefault(stream.name, set()).add(side.key)
            sides[role] = stream
        left, right = sides["left"], sides["right"]
        check_generated_names(("joins", i, "name"), "join", join.name, (join.name, *join_metric_names(join.name)))
        spec = generated_stream(
            ("joins", i), f"({left.name}'s retention, the sides' lateness + within)",
            name=join.name,
            description=join.description or f"{left.name} joined with {right.name} on {join.left.key}"
                        f" within {format_duration_ms(join.within)}, by {left.name} time",
            time_field=JOIN_TIME_FIELD,
            dimensions=left.dimensions,
            values=JOIN_VALUES,
            distinct=(),
            pane=format_duration_ms(left.pane),
            # A left event's pane gets its pairs while right events of up to `within` later come in.
            allowed_lateness=format_duration_ms(max(left.allowed_lateness, right.allowed_lateness) + join.within),
            retention=format_duration_ms(left.retention),
            partitions=1,
            tiers=left.tiers,
            derived_from=left.name,
        )
        existing = catalog.streams.get(join.name)
        if existing is not None and existing != spec:
            raise CatalogReferenceError(("joins", i, "name"), f"the derived stream name {join.name!r} is already declared")
        catalog.streams[join.name] = spec
        for metric_name, value in join_metric_names(join.name).items():
            metric = MetricDef(name=metric_name, stream=join.name, value=value,
                               unit="ms" if value == "latency_ms" else "",
                               ratio_of="searches" if value == "clicked" else None,
                               description=f"{value} of join {join.name}"
                                           + (" (stat ratio: clicked / searches)" if value == "clicked" else ""))
            have = catalog.metrics.get(metric_name)
            if have is not None and have != metric:
                raise CatalogReferenceError(("metrics", metric_name),
                                            f"this name is taken by the metrics generated for join {join.name}")
            catalog.metrics[metric_name] = metric
    for name, stream in list(catalog.streams.items()):
        keys = tuple(sorted(carried.get(name, ())))
        if stream.join_keys != keys:
            catalog.streams[name] = stream.model_copy(update={"join_keys": keys})


def key_slot(stream: StreamDef, key: str) -> tuple[str, int]:
    """Where the pipeline's source carries a join key: ('dims', i) or ('ids', i)."""
    if key in stream.dimensions:
        return "dims", stream.dimensions.index(key)
    return "ids", stream.source_ids.index(key)


def join_of(catalog: Catalog, stream: str) -> JoinDef | None:
    return next((j for j in catalog.joins if j.name == stream), None)
