"""The websocket protocol: validation of client messages (pydantic), and turning a
subscription's query object into a resolved query, with the same parameter names and
meanings as GET /api/v1/query (metric, stat or stats, from, to, step, window, group_by,
filter). Pure: no I/O; `now_ms` is passed in.

Client -> server: subscribe, unsubscribe, topics, ping. See docs/websocket.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from api.timeparams import _RELATIVE, default_step_ms, parse_duration_param, parse_instant_ms, parse_range_ms
from catalog import Catalog
from store.rollup import align_range

TOPICS = ("corrections", "lag", "pipeline", "alerts")
MAX_STATS = 8
MAX_MESSAGE_BYTES = 64 * 1024


class QueryIn(BaseModel):
    """A subscription's query: the parameters of GET /api/v1/query."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    metric: str
    stat: str | None = None
    stats: list[str] | None = Field(None, max_length=MAX_STATS)
    from_: str | int = Field("now-1h", alias="from")
    to: str | int = "now"
    step: str | None = None
    window: str | None = None
    group_by: list[str] | str = Field(default_factory=list)
    filter: list[str] | str = Field(default_factory=list)
    filters: dict[str, str] | None = None  # convenience: {"region": "eu"} = filter=region=eu


class Subscribe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["subscribe"]
    id: str = Field(min_length=1, max_length=128)
    query: QueryIn


class Unsubscribe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["unsubscribe"]
    id: str = Field(min_length=1, max_length=128)


class Topics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["topics"]
    topics: list[str]


class Ping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["ping"]


ClientMessage = Annotated[Subscribe | Unsubscribe | Topics | Ping, Field(discriminator="type")]
_ADAPTER: TypeAdapter = TypeAdapter(ClientMessage)


class ProtocolError(ValueError):
    """A message or query the server cannot accept; `id` is the subscription id when known."""

    def __init__(self, reason: str, id: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.id = id


def parse_message(text: str | bytes) -> Subscribe | Unsubscribe | Topics | Ping:
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(text)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("a message must be a JSON object with a 'type'")
    msg_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    kind = raw.get("type")
    if kind not in ("subscribe", "unsubscribe", "topics", "ping"):
        raise ProtocolError(f"unknown message type {kind!r}; expected subscribe, unsubscribe, topics or ping", msg_id)
    try:
        msg = _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise ProtocolError(_describe(exc), msg_id) from None
    if isinstance(msg, Topics):
        unknown = [t for t in msg.topics if t not in TOPICS]
        if unknown:
            raise ProtocolError(f"unknown topics {unknown}; known: {', '.join(TOPICS)}")
    return msg


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function")) or "message"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class ResolvedQuery:
    """A validated query: everything the hub needs to compute and recompute its points."""

    metric: str
    stream: str
    stats: tuple[str, ...]
    quantiles: tuple[float | None, ...]
    unit: str
    value_field: str | None
    distinct_field: str | None
    pane_ms: int
    from_text: str
    to_text: str
    relative: bool  # 'from' or 'to' is relative to now: the range slides with time
    step_ms: int
    window_ms: int
    group_by: tuple[str, ...]
    filters: tuple[tuple[str, str], ...]

    @property
    def needs_sketches(self) -> bool:
        return any(q is not None for q in self.quantiles) or "distinct" in self.stats

    def range_at(self, now_ms: int) -> tuple[int, int]:
        """The aligned [start, end) of the query's windows at this instant."""
        start = parse_instant_ms(self.from_text, now_ms)
        end = parse_instant_ms(self.to_text, now_ms)
        return align_range(start, end, self.step_ms)

    def shape_key(self) -> tuple:
        """Two subscriptions with the same key receive the same points: computed once."""
        return (self.metric, self.stats, self.from_text, self.to_text, self.step_ms, self.window_ms,
                self.group_by, self.filters)


def _as_list(value: list[str] | str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def resolve_query(q: QueryIn, catalog: Catalog, now_ms: int, max_points: int) -> ResolvedQuery:
    """Validate like GET /api/v1/query does; raise ProtocolError with the reason."""
    try:
        definition = catalog.metric(q.metric)
    except KeyError as exc:
        raise ProtocolError(str(exc.args[0])) from None
    stream = catalog.streams[definition.stream]
    stats = list(q.stats or []) + ([q.stat] if q.stat else [])
    stats = list(dict.fromkeys(stats)) or ["count"]
    if len(stats) > MAX_STATS:
        raise ProtocolError(f"{len(stats)} stats exceed the limit of {MAX_STATS}")
    quantiles = []
    for stat in stats:
        try:
            quantiles.append(definition.check_stat(stat))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
    from_text, to_text = str(q.from_), str(q.to)
    try:
        start_ms, end_ms = parse_range_ms(from_text, to_text, now_ms)
        step_ms = parse_duration_param(q.step, "step") if q.step else default_step_ms(max(end_ms - start_ms, 1),
                                                                                         stream.pane)
        window_ms = parse_duration_param(q.window, "window") if q.window else step_ms
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if step_ms <= 0 or step_ms % stream.pane:
        raise ProtocolError(f"step must be a positive multiple of the pane ({stream.pane} ms), got {step_ms} ms")
    if window_ms < step_ms or window_ms % stream.pane:
        raise ProtocolError(f"window must be >= step and a multiple of the pane ({stream.pane} ms), got {window_ms} ms")
    groups = _as_list(q.group_by)
    for g in groups:
        if g not in stream.dimensions:
            raise ProtocolError(f"unknown dimension {g!r} in group_by; dimensions: {', '.join(stream.dimensions) or 'none'}")
    filters = dict(q.filters or {})
    for item in _as_list(q.filter):
        name, sep, value = item.partition("=")
        if not sep:
            raise ProtocolError(f"filter {item!r} must look like dimension=value")
        filters[name] = value
    for name in filters:
        if name not in stream.dimensions:
            raise ProtocolError(f"unknown dimension {name!r} in filter; dimensions: {', '.join(stream.dimensions) or 'none'}")
    lo, hi = align_range(start_ms, end_ms, step_ms)
    if (hi - lo) // step_ms > max_points:
        raise ProtocolError(f"{(hi - lo) // step_ms} points per series exceed the limit of {max_points};"
                            " use a larger step or a shorter range")
    relative = bool(_RELATIVE.match(from_text.strip()) or _RELATIVE.match(to_text.strip()))
    return ResolvedQuery(
        metric=q.metric, stream=stream.name, stats=tuple(stats), quantiles=tuple(quantiles), unit=definition.unit,
        value_field=definition.value, distinct_field=definition.distinct, pane_ms=stream.pane,
        from_text=from_text, to_text=to_text, relative=relative, step_ms=step_ms, window_ms=window_ms,
        group_by=tuple(groups), filters=tuple(sorted(filters.items())),
    )


def error(reason: str, id: str | None = None) -> dict[str, Any]:
    return {"type": "error", "id": id, "reason": reason}
