"""Patterns over event sequences (complex event processing): the declaration and its checks.

    patterns:
      - name: credential_stuffing
        key: user_id                  # matching runs per value of this field
        within: 10m                   # first to last matched event
        after_match: skip_past_last   # or no_skip
        steps:
          - {name: failures, stream: logins, where: {outcome: failure}, times: 5}
          - name: success
            stream: logins
            contiguity: followed_by   # or next
            where: {outcome: success, ip: {same_as: failures.ip}}
        not_followed_by: {name: ..., stream: ..., where: ..., within: 30m}   # optional absence
        measures:
          attempts: {count: failures}
        dimensions: [failures.client]   # optional: the match metrics' dimensions (step.field)

The semantics (what a match is, how contiguity, quantifiers, `within`, the absence step and the
skip policies combine) are written down in docs/patterns.md; the matcher is patterns/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from catalog.durations import DurationMs
from catalog.numbers import no_booleans
from catalog.labels import unstorable

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef

_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_Name = Annotated[str, Field(pattern=_NAME)]

# The most events one step may take: a bound on a run's size (the state is kept per partial match).
MAX_TIMES = 1_000
COMPARISONS = ("lt", "le", "gt", "ge")
OPERATORS = ("eq", "ne", "in", *COMPARISONS, "same_as")


@dataclass(frozen=True)
class Condition:
    """One test on one field of an event. `same_as` compares with the field of the last event an
    earlier step matched: value is then (step name, field name)."""

    field: str
    op: str
    value: Any


class StepDef(BaseModel):
    """One step: events of `stream` that pass `where`, taken `times` times (or a range, or one or
    more), possibly skipped (`optional`), each related to the event matched before it by `contiguity`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    stream: _Name
    where: dict[_Name, Any] = {}
    times: Annotated[int | tuple[int, int] | None, BeforeValidator(no_booleans)] = None
    one_or_more: bool = False
    optional: bool = False
    contiguity: Literal["next", "followed_by"] = "followed_by"

    @model_validator(mode="after")
    def _check_quantifier(self) -> StepDef:
        if self.one_or_more and self.times is not None:
            raise ValueError("a step takes either `times` or `one_or_more`, not both")
        if isinstance(self.times, int) and not 1 <= self.times <= MAX_TIMES:
            raise ValueError(f"times must be between 1 and {MAX_TIMES}")
        if isinstance(self.times, tuple):
            low, high = self.times
            if not 1 <= low <= high <= MAX_TIMES:
                raise ValueError(f"times: [n, m] needs 1 <= n <= m <= {MAX_TIMES}")
        return self

    @property
    def min_times(self) -> int:
        if self.optional:
            return 0
        if isinstance(self.times, tuple):
            return self.times[0]
        return self.times or 1

    @property
    def max_times(self) -> int | None:
        """None: unbounded (one_or_more; `within` bounds it)."""
        if self.one_or_more:
            return None
        if isinstance(self.times, tuple):
            return self.times[1]
        return self.times or 1

    def conditions(self) -> tuple[Condition, ...]:
        return parse_where(self.where)


class AbsenceDef(BaseModel):
    """The final `not_followed_by` step: no event passing it within `within` after the last
    matched event. The match is decided when the watermark passes that deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    stream: _Name
    where: dict[_Name, Any] = {}
    within: DurationMs

    @model_validator(mode="after")
    def _check_within(self) -> AbsenceDef:
        if self.within <= 0:
            raise ValueError("not_followed_by.within must be longer than 0")
        return self

    def conditions(self) -> tuple[Condition, ...]:
        return parse_where(self.where)


class MeasureDef(BaseModel):
    """Exactly one of: first_time / last_time / count of a step, sum of `step.field`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_time: _Name | None = None
    last_time: _Name | None = None
    count: _Name | None = None
    sum: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> MeasureDef:
        if sum(value is not None for value in (self.first_time, self.last_time, self.count, self.sum)) != 1:
            raise ValueError("a measure is exactly one of first_time, last_time, count (of a step) or sum (step.field)")
        return self

    @property
    def kind(self) -> str:
        for kind in ("first_time", "last_time", "count", "sum"):
            if getattr(self, kind) is not None:
                return kind
        raise AssertionError("unreachable: validated")

    @property
    def step(self) -> str:
        target = getattr(self, self.kind)
        return target.split(".", 1)[0]

    @property
    def field(self) -> str | None:
        return self.sum.split(".", 1)[1] if self.sum and "." in self.sum else None


class PatternDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    description: str = ""
    key: _Name
    steps: tuple[StepDef, ...]
    within: DurationMs | None = None
    not_followed_by: AbsenceDef | None = None
    after_match: Literal["skip_past_last", "no_skip"] = "skip_past_last"
    measures: dict[_Name, MeasureDef] = {}
    # The dimensions of the match metrics: `step.field` (or a bare field of the first step), read
    # from the first event that step took. None: the first step's stream's dimensions but the key.
    dimensions: tuple[str, ...] | None = None

    @property
    def single_event(self) -> bool:
        """True when the positive part is exactly one event: nothing to bound with `within`."""
        return len(self.steps) == 1 and self.steps[0].min_times == self.steps[0].max_times == 1

    def step_index(self, name: str) -> int | None:
        for i, step in enumerate(self.steps):
            if step.name == name:
                return i
        return None

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams whose events the pattern reads, each once."""
        names = [step.stream for step in self.steps]
        if self.not_followed_by is not None:
            names.append(self.not_followed_by.stream)
        return tuple(dict.fromkeys(names))


def parse_where(where: dict[str, Any]) -> tuple[Condition, ...]:
    """`{field: scalar}` is equality; `{field: {op: value, ...}}` any of OPERATORS (all must hold).
    ValueError names the field when the shape is wrong."""
    out: list[Condition] = []
    for field, spec in where.items():
        if isinstance(spec, dict):
            if not spec:
                raise ValueError(f"{field}: an empty test; use a value or {{op: value}} with op one of"
                                 f" {', '.join(OPERATORS)}")
            for op, value in spec.items():
                if op not in OPERATORS:
                    raise ValueError(f"{field}: unknown operator {op!r} (operators: {', '.join(OPERATORS)})")
                if op == "same_as":
                    if not isinstance(value, str) or value.count(".") != 1:
                        raise ValueError(f"{field}: same_as takes 'step.field', e.g. 'failures.ip'")
                    value = tuple(value.split("."))
                elif op == "in":
                    if not isinstance(value, list) or not value:
                        raise ValueError(f"{field}: `in` takes a non-empty list of values")
                    value = tuple(value)
                out.append(Condition(field, op, value))
        else:
            out.append(Condition(field, "eq", spec))
    return tuple(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field_role(stream: StreamDef, field: str) -> str | None:
    if field in stream.values:
        return "value"
    if field in stream.string_fields:
        return "string"
    return None


def _normalized(value: Any, role: str) -> Any:
    """A literal as the field holds it; ValueError when it cannot be one."""
    if role == "value":
        if not _is_number(value):
            raise ValueError(f"{value!r} is not a number (the field is a value field)")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # `status: 500` in YAML means the string "500"
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (the field is a string field)")
    if unstorable(value) is not None:  # ingest refuses such labels: the test could never hold
        raise ValueError(f"{value!r} contains a NUL character or a lone surrogate, which no event's field can hold")
    return value


def _check_where(catalog: Catalog, pattern: PatternDef, index: int, stream: StreamDef, where: dict,
                 path: tuple, earlier: dict[str, StreamDef]) -> None:
    from catalog.model import CatalogReferenceError

    try:
        conditions = parse_where(where)
    except ValueError as exc:
        raise CatalogReferenceError((*path, "where"), str(exc)) from None
    for condition in conditions:
        where_path = (*path, "where", condition.field)
        role = _field_role(stream, condition.field)
        if role is None:
            raise CatalogReferenceError(where_path, f"{condition.field!r} is not a field of stream {stream.name!r}"
                                        f" (fields: {', '.join((*stream.string_fields, *stream.values))})")
        if condition.op == "same_as":
            step_name, field = condition.value
            other = earlier.get(step_name)
            if other is None:
                known = ", ".join(earlier) or "none"
                raise CatalogReferenceError((*where_path, "same_as"),
                                            f"same_as names {step_name!r}, which is not an earlier step"
                                            f" (earlier steps: {known})")
            other_role = _field_role(other, field)
            if other_role is None:
                raise CatalogReferenceError((*where_path, "same_as"),
                                            f"{field!r} is not a field of stream {other.name!r} (step {step_name!r})")
            if other_role != role:
                raise CatalogReferenceError((*where_path, "same_as"),
                                            f"{condition.field!r} is a {role} field but {step_name}.{field} is a"
                                            f" {other_role} field: they can never be equal")
            continue
        if role == "string" and condition.field not in stream.dimensions and condition.field not in stream.source_ids:
            raise CatalogReferenceError(where_path, f"{condition.field!r} of stream {stream.name!r} is not carried to"
                                        " the pipeline: declare it as a dimension or a distinct field")
        if condition.op in COMPARISONS and role != "value":
            raise CatalogReferenceError(where_path, f"{condition.op} compares numbers, and {condition.field!r} is a"
                                        " string field (use eq, ne or in)")
        try:
            values = condition.value if condition.op == "in" else (condition.value,)
            for value in values:
                _normalized(value, role)
        except ValueError as exc:
            raise CatalogReferenceError(where_path, str(exc)) from None


def normalized_conditions(pattern_stream: StreamDef, conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    """The conditions with literals as the fields hold them (`500` -> "500" for a string field)."""
    out = []
    for condition in conditions:
        role = _field_role(pattern_stream, condition.field)
        if condition.op == "same_as" or role is None:
            out.append(condition)
        elif condition.op == "in":
            out.append(Condition(condition.field, "in", tuple(_normalized(v, role) for v in condition.value)))
        else:
            out.append(Condition(condition.field, condition.op, _normalized(condition.value, role)))
    return tuple(out)


def check_patterns(catalog: Catalog) -> None:
    """Cross-check every pattern against the streams; CatalogReferenceError with the config path."""
    from catalog.model import CatalogReferenceError

    seen: set[str] = set()
    for i, pattern in enumerate(catalog.patterns):
        base = ("patterns", i)
        if pattern.name in seen:
            raise CatalogReferenceError((*base, "name"), f"pattern {pattern.name!r} is declared twice")
        seen.add(pattern.name)
        if not pattern.steps:
            raise CatalogReferenceError((*base, "steps"), "a pattern needs at least one step")
        if all(step.min_times == 0 for step in pattern.steps):
            raise CatalogReferenceError((*base, "steps"), "every step is optional: a pattern must require at least"
                                        " one event")
        if pattern.within is None and not pattern.single_event:
            raise CatalogReferenceError(base, "`within` is required when a pattern matches more than one event:"
                                        " it bounds how long partial matches are kept")
        if pattern.within is not None and pattern.within <= 0:
            raise CatalogReferenceError((*base, "within"), "within must be longer than 0")
        earlier: dict[str, StreamDef] = {}
        for j, step in enumerate(pattern.steps):
            path = (*base, "steps", j)
            if step.name in earlier:
                raise CatalogReferenceError((*path, "name"), f"step {step.name!r} is declared twice in the pattern")
            stream = _stream(catalog, step.stream, (*path, "stream"))
            _check_key(pattern, stream, base)
            _check_where(catalog, pattern, j, stream, step.where, path, earlier)
            earlier[step.name] = stream
        absence = pattern.not_followed_by
        if absence is not None:
            path = (*base, "not_followed_by")
            if absence.name in earlier:
                raise CatalogReferenceError((*path, "name"), f"step {absence.name!r} is declared twice in the pattern")
            stream = _stream(catalog, absence.stream, (*path, "stream"))
            _check_key(pattern, stream, base)
            _check_where(catalog, pattern, len(pattern.steps), stream, absence.where, path, earlier)
        for name, measure in pattern.measures.items():
            _check_measure(pattern, measure, earlier, (*base, "measures", name))
        _check_dimensions(catalog, pattern, base)


def _stream(catalog: Catalog, name: str, path: tuple) -> StreamDef:
    from catalog.model import CatalogReferenceError

    stream = catalog.streams.get(name)
    if stream is None:
        raise CatalogReferenceError(path, f"unknown stream {name!r} (streams: {', '.join(catalog.streams)})")
    if stream.derived_from:
        raise CatalogReferenceError(path, f"stream {name!r} is derived; a pattern reads streams from the log")
    return stream


def _check_key(pattern: PatternDef, stream: StreamDef, base: tuple) -> None:
    from catalog.model import CatalogReferenceError

    if pattern.key not in stream.string_fields:
        raise CatalogReferenceError((*base, "key"), f"key {pattern.key!r} is not a string field of stream"
                                    f" {stream.name!r} (the key, a dimension or a distinct field:"
                                    f" {', '.join(stream.string_fields) or 'none'})")
    if pattern.key not in stream.dimensions and pattern.key not in stream.source_ids:
        raise CatalogReferenceError((*base, "key"), f"key {pattern.key!r} of stream {stream.name!r} is not carried to"
                                    " the pipeline: declare it as a dimension or a distinct field")


def _check_measure(pattern: PatternDef, measure: MeasureDef, steps: dict[str, StreamDef], path: tuple) -> None:
    from catalog.model import CatalogReferenceError

    if measure.kind == "sum" and (measure.sum or "").count(".") != 1:
        raise CatalogReferenceError(path, "sum takes 'step.field', e.g. 'payments.amount'")
    stream = steps.get(measure.step)
    if stream is None:
        raise CatalogReferenceError(path, f"{measure.step!r} is not a step of the pattern"
                                    f" (steps: {', '.join(steps)}; the absence step matches no event)")
    if measure.kind == "sum" and measure.field not in stream.values:
        raise CatalogReferenceError(path, f"{measure.field!r} is not a value field of stream {stream.name!r}"
                                    f" (values: {', '.join(stream.values) or 'none'})")


# The dimension every `<pattern>_matches` stream has besides the pattern's own: "true" for a match
# a late event brought (published flagged late), "false" for one decided in order.
LATE_DIMENSION = "late"


@dataclass(frozen=True)
class MatchDimension:
    """One dimension of a pattern's matches: named `field`, read from the first event step
    number `step` took in the match (absent when that step took none)."""

    name: str
    step: int
    field: str


def _split_dimension(pattern: PatternDef, entry: str) -> tuple[str, str]:
    """(step name, field) of a `dimensions:` entry; a bare field is the first step's."""
    if "." in entry:
        step, field = entry.split(".", 1)
        return step, field
    return (pattern.steps[0].name if pattern.steps else ""), entry


def match_dimensions(pattern: PatternDef, catalog: Catalog) -> tuple[MatchDimension, ...]:
    """The pattern's own dimensions of its matches (without `late`): those declared, or by
    default the string dimensions of its first step's stream, but the pattern's key (a pane per
    key is what the matches' page is for). Entries check_patterns refuses are left out here."""
    if not pattern.steps:
        return ()
    if pattern.dimensions is None:
        first = catalog.streams.get(pattern.steps[0].stream)
        if first is None:
            return ()
        return tuple(MatchDimension(d, 0, d) for d in first.dimensions if d != pattern.key)
    out = []
    for entry in pattern.dimensions:
        step_name, field = _split_dimension(pattern, entry)
        index = pattern.step_index(step_name)
        if index is not None:
            out.append(MatchDimension(field, index, field))
    return tuple(out)


def _check_dimensions(catalog: Catalog, pattern: PatternDef, base: tuple) -> None:
    from catalog.model import CatalogReferenceError

    if pattern.dimensions is None:
        if any(d.name == LATE_DIMENSION for d in match_dimensions(pattern, catalog)):
            raise CatalogReferenceError(base, f"pattern {pattern.name!r}: the first step's stream has a dimension"
                                        f" {LATE_DIMENSION!r}, which the matches' own `late` dimension takes;"
                                        " declare the pattern's `dimensions:` without it")
        return
    seen: dict[str, str] = {}
    for k, entry in enumerate(pattern.dimensions):
        path = (*base, "dimensions", k)
        step_name, field = _split_dimension(pattern, entry)
        index = pattern.step_index(step_name)
        if index is None or not re.match(_NAME, field):
            steps = ", ".join(s.name for s in pattern.steps)
            raise CatalogReferenceError(path, f"pattern {pattern.name!r}: dimension {entry!r} must name a field of"
                                        f" a step as 'step.field' (steps: {steps}; the absence step matches no event)")
        stream = catalog.streams[pattern.steps[index].stream]
        if field not in stream.string_fields:
            raise CatalogReferenceError(path, f"pattern {pattern.name!r}: dimension {entry!r}: {field!r} is not a"
                                        f" string field of stream {stream.name!r} (dimensions need strings:"
                                        f" {', '.join(stream.string_fields) or 'none'})")
        if field not in stream.dimensions and field not in stream.source_ids:
            raise CatalogReferenceError(path, f"pattern {pattern.name!r}: dimension {entry!r}: {field!r} of stream"
                                        f" {stream.name!r} is not carried to the pipeline: declare it as a"
                                        " dimension or a distinct field")
        if field == LATE_DIMENSION:
            raise CatalogReferenceError(path, f"pattern {pattern.name!r}: dimension {entry!r}: {LATE_DIMENSION!r} is"
                                        " the matches' own dimension (whether a late event brought the match)")
        if field in seen:
            raise CatalogReferenceError(path, f"pattern {pattern.name!r}: dimensions {seen[field]!r} and {entry!r}"
                                        f" would both be named {field!r}")
        seen[field] = entry


# Matches as metrics: each pattern's matches are rows of a derived stream, one per match at its
# decided_at, with the match's numeric measures as values (aggregates/patterns.py writes them).
MATCH_TIME_FIELD = "decided_at"


def matches_stream_name(pattern: str) -> str:
    return f"{pattern}_matches"


def match_metric_names(pattern: PatternDef) -> dict[str, str | None]:
    """The metrics generated for a pattern: metric name -> value field (None: the match count)."""
    stream = matches_stream_name(pattern.name)
    return {stream: None, **{f"{stream}_{measure}": measure for measure in pattern.measures}}


def expand_patterns(catalog: Catalog) -> None:
    """Add each pattern's derived stream `<pattern>_matches` and its metrics: the count (and rate)
    of matches per window, and each measure as a value (idempotent: a catalog dumped and parsed
    again already has them). A pattern whose first stream is unknown is left to check_patterns."""
    from catalog.durations import format_duration_ms
    from catalog.features import check_generated_names
    from catalog.model import CatalogReferenceError, MetricDef, StreamDef

    for i, pattern in enumerate(catalog.patterns):
        first = catalog.streams.get(pattern.steps[0].stream) if pattern.steps else None
        if first is None:
            continue
        name = matches_stream_name(pattern.name)
        check_generated_names(("patterns", i, "name"), "pattern", pattern.name, (name, *match_metric_names(pattern)))
        # A `late` of the pattern's own is refused by check_patterns, with its reason.
        dims = (*dict.fromkeys(d.name for d in match_dimensions(pattern, catalog) if d.name != LATE_DIMENSION),
                LATE_DIMENSION)
        taken = [d for d in dims if d in pattern.measures or d == MATCH_TIME_FIELD]
        if taken:
            raise CatalogReferenceError(("patterns", i, "dimensions"), f"pattern {pattern.name!r}: dimension"
                                        f" {taken[0]!r} has the name of a measure or of the matches' time field"
                                        f" {MATCH_TIME_FIELD!r}; rename the measure or declare `dimensions:`")
        spec = StreamDef(
            name=name,
            description=f"Matches of pattern {pattern.name} per key {pattern.key}, at the event time each was decided",
            time_field=MATCH_TIME_FIELD,
            # The pattern's dimensions (its first event's, by default), and whether a late event brought it.
            dimensions=dims,
            values=tuple(pattern.measures),
            distinct=(),
            pane=format_duration_ms(first.pane),
            # A match is decided once the pattern's watermark passes it, and that watermark is the
            # derived stream's (aggregates/patterns.py): no match comes behind it.
            allowed_lateness="0s",
            retention=format_duration_ms(first.retention),
            partitions=1,
            tiers=first.tiers,
            derived_from=first.name,
        )
        existing = catalog.streams.get(name)
        if existing is not None and existing != spec:
            raise CatalogReferenceError(("patterns", i, "name"), f"the derived stream name {name!r} is already declared")
        catalog.streams[name] = spec
        for metric_name, value in match_metric_names(pattern).items():
            metric = MetricDef(name=metric_name, stream=name, value=value,
                               description=f"matches of pattern {pattern.name}" if value is None
                               else f"measure {value} of pattern {pattern.name}'s matches")
            have = catalog.metrics.get(metric_name)
            if have is not None and have != metric:
                raise CatalogReferenceError(("metrics", metric_name),
                                            f"this name is taken by the metrics generated for pattern {pattern.name}")
            catalog.metrics[metric_name] = metric
