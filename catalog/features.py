"""Per-stream Bloom-filter and session features: first-seen keys, membership lookups, sessions.

    first_seen:  {field: user_id, capacity: 1000000, fpp: 0.01, seed: 0}
    membership:  {field: user_id, bucket: 1h, capacity: 100000, fpp: 0.01, seed: 0}
    sessions:    {key: user_id, gap: 30m}

The fields must be ones the pipeline's source carries: a `distinct` field or a dimension.
A `sessions` declaration generates a derived stream `<stream>_sessions` (panes of session
start times, values `duration_ms` and `events`, distinct `<key>`) and three metrics:
`<stream>_sessions`, `<stream>_session_duration` and `<stream>_session_events`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from catalog.durations import DurationMs, format_duration_ms
from catalog.numbers import Integer
from catalog.patterns import matches_stream_name

if TYPE_CHECKING:
    from catalog.model import Catalog, MetricDef, StreamDef

_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_MAX_NAME = 63
_Field = Annotated[str, Field(pattern=_NAME)]
_Seed = Annotated[Integer, Field(ge=-(2**63), le=2**63 - 1)]

SESSION_VALUES = ("duration_ms", "events")
SESSION_TIME_FIELD = "session_start"
SESSION_METRICS = ("sessions", "session_duration", "session_events")  # <stream>_<suffix>


class FirstSeenDef(BaseModel):
    """A long-lived Bloom filter of the keys seen so far; counts keys not yet in it per pane."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: _Field
    capacity: Integer = Field(default=1_000_000, ge=1, le=1_000_000_000)
    fpp: float = Field(default=0.01, gt=0.0, lt=1.0)
    seed: _Seed = 0


class MembershipDef(BaseModel):
    """Bloom filters of the keys seen per coarse event-time bucket, OR-ed at query time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: _Field
    bucket: DurationMs = 3_600_000
    capacity: Integer = Field(default=100_000, ge=1, le=1_000_000_000)
    fpp: float = Field(default=0.01, gt=0.0, lt=1.0)
    seed: _Seed = 0

    @model_validator(mode="after")
    def _check_bucket(self) -> MembershipDef:
        if self.bucket < 60_000 or (86_400_000 % self.bucket and self.bucket % 86_400_000):
            raise ValueError("membership.bucket must be at least 1m and divide one day evenly or be whole days")
        return self


class SessionsDef(BaseModel):
    """Per-key sessions ended by `gap` of inactivity (Spark's session_window)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: _Field
    gap: DurationMs = 1_800_000

    @model_validator(mode="after")
    def _check_gap(self) -> SessionsDef:
        if self.gap < 1_000:
            raise ValueError("sessions.gap must be at least 1s")
        return self


def source_field(stream: StreamDef, name: str) -> tuple[str, int]:
    """Where the pipeline's source carries a string field: ('ids', i) or ('dims', i)."""
    if name in stream.distinct_fields:
        return "ids", stream.distinct_fields.index(name)
    if name in stream.dimensions:
        return "dims", stream.dimensions.index(name)
    raise ValueError(
        f"field {name!r} must be a distinct field or a dimension of stream {stream.name!r}"
        f" (distinct: {', '.join(stream.distinct_fields) or 'none'}; dimensions: {', '.join(stream.dimensions) or 'none'})"
    )


def check_stream(stream: StreamDef) -> None:
    """Validate a stream's feature declarations (raises ValueError naming the problem)."""
    for role, decl, attr in (("first_seen", stream.first_seen, "field"), ("membership", stream.membership, "field"),
                             ("sessions", stream.sessions, "key")):
        if decl is not None:
            try:
                source_field(stream, getattr(decl, attr))
            except ValueError as exc:
                raise ValueError(f"{role}.{attr}: {exc}") from None
    if stream.derived_from and (stream.first_seen or stream.membership or stream.sessions):
        raise ValueError("a derived stream cannot declare first_seen, membership or sessions")


def sessions_stream_name(stream: str) -> str:
    return f"{stream}_sessions"


def expand_derived(catalog: Catalog) -> None:
    """Add the derived session streams and their metrics to a validated catalog (idempotent:
    a catalog dumped and parsed again already has them)."""
    from catalog.model import MetricDef, StreamDef

    for name, stream in list(catalog.streams.items()):
        if stream.sessions is None or stream.derived_from:
            continue
        derived = sessions_stream_name(name)
        check_generated_names(("streams", name, "sessions"), "stream", name,
                              (derived, *(f"{name}_{suffix}" for suffix in SESSION_METRICS)))
        spec = generated_stream(
            ("streams", name, "sessions"), f"(sessions of {name}: its retention, its lateness + the gap)",
            name=derived,
            description=f"Sessions of {name} per {stream.sessions.key} (gap {format_duration_ms(stream.sessions.gap)}),"
                        " by session start",
            time_field=SESSION_TIME_FIELD,
            values=SESSION_VALUES,
            distinct=(stream.sessions.key,),
            # Durations as text: a bare number would be read as seconds.
            pane=format_duration_ms(stream.pane),
            # Sessions close when the watermark passes their last event + gap.
            allowed_lateness=format_duration_ms(stream.allowed_lateness + stream.sessions.gap),
            # The stream's own: sessions of events it still accepts are kept (the default 7d lost them).
            retention=format_duration_ms(stream.retention),
            partitions=1,
            tiers=stream.tiers,
            derived_from=name,
        )
        metrics = (
            MetricDef(name=f"{name}_sessions", stream=derived, distinct=stream.sessions.key,
                      description=f"Sessions started on {name} (count) and distinct {stream.sessions.key} with a session"),
            MetricDef(name=f"{name}_session_duration", stream=derived, value="duration_ms", unit="ms",
                      description=f"Session duration on {name}: last event - first event"),
            MetricDef(name=f"{name}_session_events", stream=derived, value="events",
                      description=f"Events per session on {name}"),
        )
        add_derived(catalog, spec, metrics, path=("streams", name, "sessions"), generated_for=f"{name}.sessions")


def watermark_trail_ms(catalog: Catalog, stream: str) -> int:
    """How far `stream`'s watermark trails, by construction, the newest event time of the streams
    it derives from, beyond its own `allowed_lateness` (0 for a stream read from the log).

    - `<stream>_sessions`: a session is emitted only when it closes, once the base stream's
      watermark (its newest event - its lateness) passes the session's last event + gap. So its
      newest session start is at least the base lateness + gap behind the base's newest event,
      and its watermark (that start - its own lateness) a further lateness + gap behind: under
      steady traffic a sessions window is final 2 x (lateness + gap) after real time, not just
      after its own lateness.
    - `<pattern>_matches`: its watermark is the pattern's, the lowest of its streams' (newest
      event - lateness), and it declares lateness 0: it trails by the largest of their lateness.
    - none for the others: a join's rows carry their left event's time and come as it is read
      (its own lateness holds the sides' and `within`, and its join clock caps it at that), and
      `<stream>_clocks` and a view's rows come at their source's newest time (within a pane).
    """
    if not catalog.streams[stream].derived_from:
        return 0
    base = sessions_base(catalog, stream)
    if base is not None:
        return base.allowed_lateness + base.sessions.gap
    for pattern in catalog.patterns:
        if stream == matches_stream_name(pattern.name):
            return max((catalog.streams[s].allowed_lateness for s in pattern.streams if s in catalog.streams), default=0)
    return 0


def sessions_base(catalog: Catalog, stream: str) -> StreamDef | None:
    """The stream whose sessions `stream` holds (`<base>_sessions`), None for any other stream."""
    spec = catalog.streams[stream]
    base = catalog.streams.get(spec.derived_from) if spec.derived_from else None
    if base is not None and base.sessions is not None and stream == sessions_stream_name(base.name):
        return base
    return None


def check_generated_names(path: tuple, what: str, base: str, names: Iterable[str]) -> None:
    """Refuse at the declaration (`path`) a name too long for the stream and metric names it
    generates (`<base>_unmatched_right`, `<base>_session_duration`...), saying which one and how
    long the declared name may be; not deep in a generated entry the user never wrote."""
    from catalog.model import CatalogReferenceError

    names = list(names)
    too_long = [n for n in names if len(n) > _MAX_NAME]
    if too_long and re.match(_NAME, base):
        longest = max(names, key=len)
        raise CatalogReferenceError(path, f"{what} name {base!r} is too long for its derived stream and metric names:"
                                    f" {too_long[0]!r} has {len(too_long[0])} characters, at most {_MAX_NAME}"
                                    f" (shorten the name to at most {_MAX_NAME - (len(longest) - len(base))})")


def generated_stream(path: tuple, what: str, **fields) -> StreamDef:
    """The StreamDef a declaration generates; a rule it breaks (its retention within its lateness,
    say) is an error at the declaration, saying what generated it, not at the top level about
    values the user never wrote."""
    from pydantic import ValidationError

    from catalog.model import CatalogReferenceError, StreamDef

    try:
        return StreamDef(**fields)
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise CatalogReferenceError(path, f"it generates the stream {fields['name']!r} {what}, which is refused: {reasons}") from None


def add_derived(catalog: Catalog, spec: StreamDef, metrics: Iterable[MetricDef], *, path: tuple,
                generated_for: str) -> None:
    """Register a generated stream and its metrics (idempotent: a catalog dumped and parsed again
    already has them); a name a declaration already took otherwise is an error at `path`."""
    from catalog.model import CatalogReferenceError

    existing = catalog.streams.get(spec.name)
    if existing is not None and existing != spec:
        raise CatalogReferenceError(path, f"the derived stream name {spec.name!r} is already declared")
    catalog.streams[spec.name] = spec
    for metric in metrics:
        have = catalog.metrics.get(metric.name)
        if have is not None and have != metric:
            raise CatalogReferenceError(("metrics", metric.name),
                                        f"this name is taken by the metrics generated for {generated_for}")
        catalog.metrics[metric.name] = metric


def check_catalog(catalog: Catalog) -> None:
    from catalog.model import CatalogReferenceError

    for name, metric in catalog.metrics.items():
        if metric.first_seen:
            stream = catalog.streams.get(metric.stream)
            if stream is not None and stream.first_seen is None:
                raise CatalogReferenceError(
                    ("metrics", name, "first_seen"),
                    f"stream {stream.name!r} declares no first_seen (add first_seen: {{field: ...}} to it)",
                )


def base_streams(catalog: Catalog) -> dict[str, StreamDef]:
    """The streams read from the log (not derived)."""
    return {n: s for n, s in catalog.streams.items() if not s.derived_from}
