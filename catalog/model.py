"""Stream and metric definitions: what events look like and what is computed from them.

A stream declares its fields by role. Every pane of a stream stores a count, per value
field n/sum/min/max and a KLL sketch, and per distinct field an HLL sketch; a metric is
a named view over those (a value field and/or a distinct field), so adding a metric
over declared fields needs no code change and no reprocessing.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from catalog.cdc import CdcSourceDef, check_catalog_sources, check_source
from catalog.durations import DurationMs, format_duration_ms
from catalog.numbers import Integer
from catalog.enrichment import (EnrichDef, check_catalog_enrichment, check_stream_enrichment, enriched_columns,
                                with_enriched_dimensions)
from catalog.tables import StreamKind, check_table, with_op_dimension
from catalog.features import FirstSeenDef, MembershipDef, SessionsDef, check_catalog, check_stream, expand_derived
from catalog.patterns import PatternDef, check_patterns, expand_patterns
from catalog.clocks import expand_clocks
from catalog.joins import JoinDef, expand_joins
from catalog.views import ViewDef, expand_views
from catalog.tiers import TierDef, check_tiers, default_tiers

NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
# ASCII digits only and the very end (`$` lets a final newline by): `p99\n` or `p٩٩` is no stat.
_QUANTILE_STAT = re.compile(r"\Ap([0-9]{1,2}(?:\.[0-9]+)?|100)\Z")

FieldName = Annotated[str, Field(pattern=NAME_RE)]

# Stats every metric answers, and those that need a value or a distinct field.
COUNT_STATS = ("count", "rate")
VALUE_STATS = ("sum", "avg", "min", "max")
DISTINCT_STATS = ("distinct",)
FIRST_SEEN_STATS = ("first_seen", "first-seen")  # the second spelling as the contract's prose writes it
RATIO_STATS = ("ratio",)  # sum(value) / sum(ratio_of) per window, for a metric that declares ratio_of


class CatalogReferenceError(ValueError):
    """A cross-reference problem, carrying the config path it is about (for line numbers)."""

    def __init__(self, path: tuple, message: str):
        super().__init__(f"{'.'.join(map(str, path))}: {message}")
        self.path = path


# How long a copy of an event id is remembered (by ingest time): a producer's retries come
# within seconds or minutes of the first send.
DEFAULT_DEDUP_WINDOW_MS = 3_600_000
MIN_DEDUP_WINDOW_MS = 1_000

# How long a partition may go unread before it stops holding the stream's watermark back.
DEFAULT_PARTITION_IDLE_TIMEOUT_MS = 300_000
# Below a second even a partition read in the batch being committed is idle by the next one (0:
# at once): no partition ever holds the watermark, and panes turn final while a partition still
# holds their events. So 0 is refused, not taken as "off".
MIN_PARTITION_IDLE_TIMEOUT_MS = 1_000


class StreamDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: FieldName
    description: str = ""
    # "table": a changelog table keyed by key_field (catalog/tables.py); "stream": events.
    kind: StreamKind = "stream"
    tombstone_retention: DurationMs | None = None  # tables: how long the log keeps a delete
    source: CdcSourceDef | None = None  # tables: fed by a PostgreSQL table (catalog/cdc.py), not by producers
    time_field: FieldName = "time"
    key_field: FieldName | None = None
    dimensions: tuple[FieldName, ...] = ()
    values: tuple[FieldName, ...] = ()
    distinct: tuple[FieldName, ...] | None = None  # default: (key_field,) when there is one
    pane: DurationMs = 10_000
    allowed_lateness: DurationMs = 30_000
    partitions: Integer = Field(default=4, ge=1, le=256)
    # A partition with unread records from which nothing was read for this long no longer holds
    # the stream's watermark back (store/watermarks.py; docs/event-time.md, "Watermark").
    partition_idle_timeout: DurationMs = DEFAULT_PARTITION_IDLE_TIMEOUT_MS
    # Bloom-filter and session features (catalog/features.py); derived_from: set on generated streams.
    first_seen: FirstSeenDef | None = None
    membership: MembershipDef | None = None
    sessions: SessionsDef | None = None
    derived_from: FieldName | None = None
    # Exact duplicate drops (aggregates/event_ids.py): each value of this field is counted once
    # per `dedup_window` of ingest time; an event without one is refused (API) or dead-lettered.
    event_id_field: FieldName | None = None
    dedup_window: DurationMs | None = None  # default DEFAULT_DEDUP_WINDOW_MS when event_id_field is set
    # Set by the catalog from `joins:` (catalog/joins.py), never written in YAML: the join keys the
    # source carries in `ids` because they are neither a dimension nor a distinct field.
    join_keys: tuple[FieldName, ...] = Field(default=(), exclude=True)
    # Stream-table join (catalog/enrichment.py): table columns added as dimensions, looked up per event.
    enrich: tuple[EnrichDef, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _table_op(cls, data: object) -> object:
        return with_enriched_dimensions(with_op_dimension(data))

    @model_validator(mode="after")
    def _check_features(self) -> StreamDef:
        check_stream(self)
        check_table(self)
        check_source(self)
        check_stream_enrichment(self)
        return self

    @field_serializer("dimensions")
    def _declared_dimensions(self, dims: tuple[str, ...]) -> tuple[str, ...]:
        # The enriched columns are added on load again (catalog/enrichment.py): a dump leaves them out.
        enriched = set(self.enriched_dimensions)
        return tuple(d for d in dims if d not in enriched)

    @property
    def enriched_dimensions(self) -> tuple[str, ...]:
        """The dimensions set by enrichment (the table columns of `enrich`), in declaration order."""
        return enriched_columns(self.enrich)
    # Events older than (pipeline clock - retention) are dead-lettered, and panes that old are dropped.
    retention: DurationMs = 7 * 86_400_000
    # Events more than this ahead of the time we received them are dead-lettered, so a device
    # clock gone wrong cannot drag the watermark ahead.
    max_future_skew: DurationMs = 300_000
    # Roll-up tiers (catalog/tiers.py): None = the default 1m and 1h; [] = panes only.
    tiers: tuple[TierDef, ...] | None = None
    rollup_group_bys: tuple[tuple[FieldName, ...], ...] = ()
    # Device clocks (aggregates/device_clocks.py): the time the device sent the event, by its own
    # clock; with our receive time it gives the device's clock offset, which corrects the event
    # time before pane assignment. device_field: whose clock (default: the key field).
    sent_time_field: FieldName | None = None
    device_field: FieldName | None = None
    # An offset within this (either way) is taken for network delay and left alone.
    clock_tolerance: DurationMs = 2_000
    # How far back (in receive time, per device) the smallest offset is looked for; also how long
    # a stale sample can hold a clock set back, and how far apart samples may be to agree.
    clock_window: DurationMs = 15 * 60_000

    @model_validator(mode="after")
    def _check_roles(self) -> StreamDef:
        if self.pane < 1_000 or 86_400_000 % self.pane != 0:
            raise ValueError("pane must be at least 1s and divide one day evenly (e.g. 1s, 10s, 1m, 5m, 1h)")
        if self.retention < self.pane:
            raise ValueError(f"retention ({format_duration_ms(self.retention)}) must be at least one pane"
                             f" ({format_duration_ms(self.pane)})")
        if self.retention <= self.allowed_lateness:
            raise ValueError(f"retention ({format_duration_ms(self.retention)}) must be longer than allowed_lateness"
                             f" ({format_duration_ms(self.allowed_lateness)}): late events inside the lateness"
                             " must still be accepted")
        roles: dict[str, str] = {}
        for role, names in (
            ("time_field", (self.time_field,)),
            ("dimensions", self.dimensions),
            ("values", self.values),
        ):
            for name in names:
                if name in roles:
                    raise ValueError(f"field {name!r} is declared twice (in {roles[name]} and {role})")
                roles[name] = role
        for name in self.distinct_fields:
            if roles.get(name) in ("values", "time_field"):
                raise ValueError(f"distinct field {name!r} is also a {roles[name]} field")
        self._check_event_id(roles)
        self._check_clock_fields(roles)
        check_tiers(self)
        return self

    def _check_event_id(self, roles: dict[str, str]) -> None:
        if self.event_id_field is None:
            if self.dedup_window is not None:
                raise ValueError("dedup_window needs event_id_field: the field whose value identifies an event")
            return
        if roles.get(self.event_id_field):
            raise ValueError(f"event_id_field {self.event_id_field!r} is also a {roles[self.event_id_field]} field"
                             " (an event id is a string of its own, not a dimension, value or the time)")
        window = self.dedup_window_ms
        if window < MIN_DEDUP_WINDOW_MS:
            raise ValueError(f"dedup_window ({format_duration_ms(window)}) must be at least"
                             f" {format_duration_ms(MIN_DEDUP_WINDOW_MS)}")
        if window > self.retention:
            raise ValueError(f"dedup_window ({format_duration_ms(window)}) must not be longer than retention"
                             f" ({format_duration_ms(self.retention)}): ids are remembered at most that long")

    @property
    def dedup_window_ms(self) -> int | None:
        """How long an event id counted is remembered (ingest time), None without event_id_field."""
        if self.event_id_field is None:
            return None
        return DEFAULT_DEDUP_WINDOW_MS if self.dedup_window is None else self.dedup_window

    @property
    def source_ids(self) -> tuple[str, ...]:
        """The string fields the pipeline's source carries in its `ids` array: the distinct
        fields, then the event id field, the join keys (`join_keys`) and the enrichment keys (`enrich`'s
        `by`) that are not among them."""
        extra = [f for f in (self.event_id_field, *self.join_keys, *(e.by for e in self.enrich))
                 if f and f not in self.distinct_fields]
        return (*self.distinct_fields, *dict.fromkeys(extra))

    def _check_clock_fields(self, roles: dict[str, str]) -> None:
        if self.sent_time_field is None:
            if self.device_field is not None:
                raise ValueError("device_field needs sent_time_field (the device's clock is read from it)")
            return
        sent = self.sent_time_field
        if sent in roles or sent in self.string_fields:
            raise ValueError(f"sent_time_field {sent!r} is also declared as {roles.get(sent, 'a string field')}")
        device = self.device_key_field
        if device is None:
            raise ValueError("sent_time_field needs a device_field or a key_field: whose clock it is")
        if device not in self.string_fields:
            raise ValueError(f"device_field {device!r} must be the key, a dimension or a distinct field"
                             f" (declared strings: {', '.join(self.string_fields) or 'none'})")
        if self.clock_window < 60_000:
            raise ValueError("clock_window must be at least 1m (one bucket of receive time)")
        if self.clock_tolerance >= self.max_future_skew:
            # A device ahead by between the two would be left uncorrected (within tolerance) and
            # have every event dead-lettered as future_skew.
            raise ValueError(f"clock_tolerance ({format_duration_ms(self.clock_tolerance)}) must be less than"
                             f" max_future_skew ({format_duration_ms(self.max_future_skew)})")

    @property
    def device_key_field(self) -> str | None:
        """Whose clock stamps the sent time: the device field, else the key field."""
        return self.device_field or self.key_field

    @property
    def tier_defs(self) -> tuple[TierDef, ...]:
        """The coarser granules kept beside the panes (the default when none are declared)."""
        return default_tiers(self.pane) if self.tiers is None else self.tiers

    @property
    def distinct_fields(self) -> tuple[str, ...]:
        if self.distinct is not None:
            return self.distinct
        return (self.key_field,) if self.key_field else ()

    @property
    def string_fields(self) -> tuple[str, ...]:
        """Fields stored as strings: dimensions, distinct fields, the key and the event id, each once."""
        seen: dict[str, None] = {}
        for name in (*self.dimensions, *self.distinct_fields, *((self.key_field,) if self.key_field else ()),
                     *((self.event_id_field,) if self.event_id_field else ())):
            seen.setdefault(name, None)
        return tuple(seen)


class MetricDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: FieldName
    stream: FieldName
    description: str = ""
    value: FieldName | None = None
    distinct: FieldName | None = None
    unit: str = ""
    first_seen: bool = False  # answers stat first_seen (the stream must declare first_seen)
    # Another value field of the stream: stat `ratio` = sum(value) / sum(ratio_of) (e.g. a click-through rate).
    ratio_of: FieldName | None = None

    def stats(self) -> tuple[str, ...]:
        """The stats this metric answers ("pNN" stands for any percentile)."""
        out: list[str] = list(COUNT_STATS)
        if self.value:
            out += [*VALUE_STATS, "pNN"]
        if self.distinct:
            out += list(DISTINCT_STATS)
        if self.first_seen:
            out.append("first_seen")
        if self.ratio_of:
            out += list(RATIO_STATS)
        return tuple(out)

    def check_stat(self, stat: str) -> float | None:
        """Validate a stat name; return the quantile in [0, 1] for pNN stats, else None."""
        match = _QUANTILE_STAT.match(stat)
        if match:
            if not self.value:
                raise ValueError(f"metric {self.name!r} has no value field, so it has no percentiles")
            return float(match.group(1)) / 100.0
        if stat in COUNT_STATS:
            return None
        if stat in FIRST_SEEN_STATS:
            if not self.first_seen:
                raise ValueError(f"metric {self.name!r} does not declare first_seen")
            return None
        if stat in RATIO_STATS:
            if not self.ratio_of:
                raise ValueError(f"metric {self.name!r} declares no ratio_of, so it has no ratio")
            return None
        if stat in VALUE_STATS:
            if not self.value:
                raise ValueError(f"metric {self.name!r} has no value field, so it has no {stat}")
            return None
        if stat in DISTINCT_STATS:
            if not self.distinct:
                raise ValueError(f"metric {self.name!r} declares no distinct field")
            return None
        raise ValueError(f"unknown stat {stat!r}; this metric answers: {', '.join(self.stats())} (e.g. p50, p99, p99.9)")


class Catalog(BaseModel):
    """All streams and metrics, cross-checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    streams: dict[str, StreamDef]
    metrics: dict[str, MetricDef] = {}
    patterns: tuple[PatternDef, ...] = ()  # sequences of events to match (catalog/patterns.py)
    # Patterns defined through the API (catalog/defined_patterns.py): name -> the store's version of it.
    defined_patterns: dict[str, int] = Field(default={}, exclude=True)
    # Streams computed as stored until a switch (catalog/versions.py pinned_catalog): name -> stored version.
    pinned_versions: dict[str, str] = Field(default={}, exclude=True)
    # Of those, the views their enrichments look up through as stored (a view declared otherwise
    # now): stream -> view name -> the stored declaration (catalog/enrichment.py enrichment_view).
    pinned_views: dict[str, dict[str, ViewDef]] = Field(default={}, exclude=True)
    # Stream-stream window joins (catalog/joins.py): each adds a derived stream and its metrics.
    joins: tuple[JoinDef, ...] = ()
    # Table-table joins maintained as views (catalog/views.py): each adds a derived change stream.
    views: dict[str, ViewDef] = {}

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: object) -> object:
        """A stream's, metric's or view's name is its key. A `name:` written inside must be the
        key: one that differs (`refunds: {name: orders}`) would make the entry the other one
        (its log topic, its panes) under a key that no longer says so."""
        if isinstance(data, dict):
            data = dict(data)
            for section in ("streams", "metrics", "views"):
                entries = data.get(section)
                if isinstance(entries, dict):
                    for key, value in entries.items():
                        name = value.get("name", key) if isinstance(value, dict) else getattr(value, "name", key)
                        if name != key:
                            raise CatalogReferenceError((section, key, "name"),
                                                        f"the name {name!r} differs from its key {key!r}")
                    data[section] = {
                        key: ({"name": key, **value} if isinstance(value, dict) else value)
                        for key, value in entries.items()
                    }
        return data

    @model_validator(mode="after")
    def _derived_streams(self) -> Catalog:
        expand_derived(self)  # session streams and metrics generated from `sessions:` declarations
        expand_joins(self)  # join streams and metrics generated from `joins:` declarations
        expand_clocks(self)  # device clock streams and metrics generated from `sent_time_field`
        expand_views(self)  # views' change streams generated from `views:` declarations
        expand_patterns(self)  # `<pattern>_matches` streams and metrics (catalog/patterns.py)
        return self

    @model_validator(mode="after")
    def _check_references(self) -> Catalog:
        if not self.streams:
            raise ValueError("at least one stream must be declared")
        # Checked on the catalog, not on StreamDef: a stream declaration stored before this bound
        # (catalog/versions.py stored_stream) still parses, and a configured catalog takes its own
        # partition_idle_timeout (a layout field) in place of the stored one.
        for name, stream in self.streams.items():
            if stream.partition_idle_timeout < MIN_PARTITION_IDLE_TIMEOUT_MS:
                raise CatalogReferenceError(
                    ("streams", name, "partition_idle_timeout"),
                    f"must be at least {format_duration_ms(MIN_PARTITION_IDLE_TIMEOUT_MS)}, not"
                    f" {format_duration_ms(stream.partition_idle_timeout)}: a partition with unread records stops"
                    " holding the stream's watermark once nothing was read from it for this long, so a shorter"
                    " timeout leaves out partitions still being read and turns panes final while they hold"
                    " events for them")
        for name, metric in self.metrics.items():
            stream = self.streams.get(metric.stream)
            if stream is None:
                raise CatalogReferenceError(("metrics", name, "stream"), f"unknown stream {metric.stream!r}")
            if metric.value and metric.value not in stream.values:
                raise CatalogReferenceError(
                    ("metrics", name, "value"),
                    f"{metric.value!r} is not a value field of stream {stream.name!r}"
                    f" (values: {', '.join(stream.values) or 'none'})"
                )
            if metric.ratio_of and (not metric.value or metric.ratio_of not in stream.values):
                raise CatalogReferenceError(
                    ("metrics", name, "ratio_of"),
                    f"ratio_of needs a value field and must name another value field of stream {stream.name!r}"
                    f" (values: {', '.join(stream.values) or 'none'})"
                )
            if metric.distinct and metric.distinct not in stream.distinct_fields:
                raise CatalogReferenceError(
                    ("metrics", name, "distinct"),
                    f"{metric.distinct!r} is not a distinct field of stream {stream.name!r}"
                    f" (distinct: {', '.join(stream.distinct_fields) or 'none'})"
                )
        check_catalog(self)
        check_patterns(self)
        check_catalog_enrichment(self)
        check_catalog_sources(self)
        return self

    def stream(self, name: str) -> StreamDef:
        try:
            return self.streams[name]
        except KeyError:
            raise KeyError(f"unknown stream {name!r}; defined: {', '.join(sorted(self.streams))}") from None

    def metric(self, name: str) -> MetricDef:
        try:
            return self.metrics[name]
        except KeyError:
            raise KeyError(f"unknown metric {name!r}; defined: {', '.join(sorted(self.metrics))}") from None
