"""The websocket protocol: validation of client messages (pydantic), and turning a
subscription's query object into a resolved query (query.resolve), with the same parameter
names, meanings and checks as GET /api/v1/query (metric, stat or stats, from, to, step,
window, group_by, filter). Pure: no I/O; `now_ms` is passed in.

Client -> server: subscribe, unsubscribe, topics, ping. See docs/websocket.md.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, TypeAdapter, ValidationError

from catalog import Catalog
from query import Query, QueryError, parse_filters, resolve
from query.model import MAX_STATS

TOPICS = ("corrections", "lag", "pipeline", "alerts")
MAX_MESSAGE_BYTES = 64 * 1024


def _no_boolean(value: Any) -> Any:
    """JSON true is not an instant (Python's bool is an int: it read as epoch 1 s, 1970)."""
    if isinstance(value, bool):
        raise ValueError("a time is 'now', 'now-15m', an RFC 3339 string or an epoch number, not a boolean")
    return value


# An instant as GET /api/v1/query takes it: a string, or an epoch number (ms or s, fractional too)
# given to the same parser as its text (catalog.times.parse_instant_ms, through query.resolve).
Instant = Annotated[StrictInt | StrictFloat | StrictStr, BeforeValidator(_no_boolean)]


class QueryIn(BaseModel):
    """A subscription's query: the parameters of GET /api/v1/query."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    metric: str
    stat: str | None = None
    stats: list[str] | None = Field(None, max_length=MAX_STATS)
    from_: Instant = Field("now-1h", alias="from")
    to: Instant = "now"
    step: str | None = None
    window: str | None = None
    group_by: list[str] | str = Field(default_factory=list)
    filter: list[str] | str = Field(default_factory=list)
    filters: dict[str, str] | None = None  # convenience: {"region": "eu"} = filter=region=eu
    # GET /api/v1/query's ?version= (docs/reprocessing.md): a version that is not the served one is
    # answered with one snapshot and no live points (api/ws_routes.py).
    version: str | None = Field(None, min_length=1, max_length=64)


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
    except RecursionError:  # a frame nested thousands deep (json.loads recurses per level)
        raise ProtocolError("not JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over Python's 4 300 digits
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


def resolve_query(q: QueryIn, catalog: Catalog, now_ms: int, max_points: int, kept_at_ms: int | None = None) -> Query:
    """The subscription's query, resolved like GET /api/v1/query's (query.resolve, retention measured
    at kept_at_ms: store.retention_clock); ProtocolError with the same reason otherwise."""
    try:
        filters = parse_filters(q.filter, q.filters)
        return resolve(catalog, metric=q.metric, stats=[*(q.stats or []), *([q.stat] if q.stat else [])],
                       start=q.from_, end=q.to, step=q.step, window=q.window, group_by=q.group_by, filters=filters,
                       now_ms=now_ms, max_points=max_points, kept_at_ms=kept_at_ms)
    except QueryError as exc:
        raise ProtocolError(str(exc)) from None


def error(reason: str, id: str | None = None) -> dict[str, Any]:
    return {"type": "error", "id": id, "reason": reason}
