"""Alert rule definitions: their shape (pydantic, one model per kind) and their checks
against the catalog. Pure: no I/O, so the API, the YAML loader and the tests share them.

Every field that Prometheus or Grafana users know keeps its name there: `for`,
`keep_firing_for`, `labels`, `annotations`, evaluation `interval`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from alerts.templating import check_template
from catalog import Catalog, parse_duration_ms
from catalog.durations import format_duration_ms
from catalog.model import DurationMs
from ingest.events import unstorable
from query import QueryError, resolve_target
from store.lag import LagStatus


def _not_a_boolean(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic's float takes true as 1.0: a typo, not a threshold
        raise ValueError("a number, not true or false")
    return value


# A rule's number: an int or a float, or a text of one (PyYAML reads 6e1 as text); never a boolean.
Number = Annotated[float, BeforeValidator(_not_a_boolean)]

NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"
LABEL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OPS = (">", ">=", "<", "<=", "==", "!=")
Op = Literal[">", ">=", "<", "<=", "==", "!="]
RESERVED_LABELS = ("alertname",)
MAX_WINDOW_MS = 7 * 86_400_000


class RuleError(ValueError):
    """A rule definition that cannot be accepted; the message names the field and the reason."""


class _RuleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="unique; letters, digits and _ . : - (not '.' or '..')")
    description: str = ""
    for_: DurationMs = Field(0, alias="for", description="how long the condition must hold before firing")
    keep_firing_for: DurationMs = Field(0, description="how long to keep firing after the condition stops")
    interval: DurationMs | None = Field(None, description="evaluation interval (default: the service's)")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    # What missing data or a failed evaluation reads as: never "normal" (that would hide the problem).
    no_data_state: Literal["nodata", "firing"] = "nodata"
    error_state: Literal["error", "firing"] = "error"

    @field_validator("name")
    @classmethod
    def _reachable_name(cls, value: str) -> str:
        # /api/v1/alerts/rules/{name}: HTTP clients and browsers resolve a '.' or '..' path segment
        # away before sending, so a rule of that name could be neither read nor deleted by them.
        if value in (".", ".."):
            raise ValueError(f"{value!r} cannot name a rule: clients resolve it away in a URL path")
        return value

    @field_validator("labels", "annotations")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not LABEL_PATTERN.match(key):
                raise ValueError(f"{key!r} is not a valid label name (letters, digits and _, not starting with a digit)")
        return value


class _OverMetric(_RuleBase):
    """Rules over a metric's windowed stat: evaluated on the newest final window by default."""

    metric: str
    stat: str = "count"
    window: DurationMs = 300_000
    group_by: tuple[str, ...] = ()
    filters: dict[str, str] = Field(default_factory=dict)
    op: Op = ">"
    threshold: Number = Field(allow_inf_nan=False)
    provisional: bool = Field(False, description="also evaluate the newest, not yet final window")
    stale_after: DurationMs = Field(300_000, description="NoData once the newest final window is this much older"
                                    " than expected (pipeline stopped or no traffic)")


class ThresholdRule(_OverMetric):
    kind: Literal["threshold"]


class TrendRule(_OverMetric):
    kind: Literal["trend"]
    against: str = Field("previous", description="'previous' window, or an offset such as 1d or 1w")
    mode: Literal["ratio", "diff", "rate"] = Field("ratio", description="ratio: now / then; diff: now - then;"
                                                   " rate: (now - then) per second between the windows")
    min_baseline: Number | None = Field(None, allow_inf_nan=False,
                                       description="condition false while the baseline is below this"
                                       " (PromQL's `and then > N`): a near-empty baseline makes any ratio huge")


class AbsenceRule(_RuleBase):
    kind: Literal["absence"]
    stream: str
    duration: DurationMs = Field(description="fire when the newest event is older than this")
    group_by: tuple[str, ...] = ()
    filters: dict[str, str] = Field(default_factory=dict)
    lookback: DurationMs = Field(3_600_000, description="how far back a group must have been seen to start being"
                                     " watched (one already alerting stays so)")


class LagRule(_RuleBase):
    kind: Literal["lag"]
    stream: str | None = None
    op: Op = ">"
    threshold: Number = Field(allow_inf_nan=False, description="consumer lag in seconds")


class LagStatusRule(_RuleBase):
    kind: Literal["lag_status"]
    stream: str | None = None
    statuses: tuple[LagStatus, ...] = (LagStatus.STALL, LagStatus.STOP)


class DeadLetterRule(_RuleBase):
    kind: Literal["dead_letters"]
    stream: str | None = None
    window: DurationMs = 300_000
    op: Op = ">"
    threshold: Number = Field(allow_inf_nan=False, description="dead letters per second over the window")


class PatternRule(_RuleBase):
    """Fires once per match of a pattern (catalog `patterns`): each match is an instance of its
    own, firing on the evaluation that reads it and resolved on the next (or after
    `keep_firing_for`). A match is an event, not a condition that holds, so `for` must be 0."""

    kind: Literal["pattern"]
    pattern: str
    max_matches: int = Field(100, ge=1, le=1_000, description="matches read per evaluation at most; the rest"
                             " are read by the next evaluations, none skipped")


Rule = Annotated[ThresholdRule | TrendRule | AbsenceRule | LagRule | LagStatusRule | DeadLetterRule | PatternRule,
                 Field(discriminator="kind")]
KINDS = ("threshold", "trend", "absence", "lag", "lag_status", "dead_letters", "pattern")
_ADAPTER: TypeAdapter = TypeAdapter(Rule)


def parse_rule(data: Any, catalog: Catalog) -> Rule:
    """Validate one definition (a dict from JSON or YAML) against its kind and the catalog."""
    if not isinstance(data, dict):
        raise RuleError(f"a rule must be an object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise RuleError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        rule = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise RuleError(_describe(exc, data)) from None
    check_rule(rule, catalog)
    return rule


def check_rule(rule: Rule, catalog: Catalog) -> None:
    """Cross-checks pydantic cannot make: names the catalog must know, windows vs panes, templates."""
    where = f"rule {rule.name!r}"
    for key in rule.labels:
        if key in RESERVED_LABELS:
            raise RuleError(f"{where}: labels: {key!r} is set from the rule's name")
    for part, templates in (("labels", rule.labels), ("annotations", rule.annotations)):
        for key, text in templates.items():
            try:
                check_template(text)
            except ValueError as exc:
                raise RuleError(f"{where}: {part}.{key}: {exc}") from None
    if rule.interval is not None and rule.interval < 1_000:
        raise RuleError(f"{where}: interval: must be at least 1s, got {rule.interval} ms")
    if isinstance(rule, _OverMetric):
        _check_metric_rule(rule, catalog, where)
    elif isinstance(rule, AbsenceRule):
        stream = _stream(catalog, rule.stream, where)
        _check_dimensions(rule.group_by, rule.filters, stream.dimensions, where)
        if rule.duration < stream.pane:
            raise RuleError(f"{where}: duration: must be at least the stream's pane ({stream.pane // 1000}s)")
        if rule.lookback <= rule.duration:
            raise RuleError(f"{where}: lookback: must be longer than duration")
    elif isinstance(rule, PatternRule):
        _check_pattern_rule(rule, catalog, where)
    elif isinstance(rule, (LagRule, LagStatusRule, DeadLetterRule)):
        if rule.stream is not None:
            _stream(catalog, rule.stream, where)
        if isinstance(rule, DeadLetterRule) and not 1_000 <= rule.window <= MAX_WINDOW_MS:
            raise RuleError(f"{where}: window: must be between 1s and 7d")
        if isinstance(rule, LagStatusRule) and not rule.statuses:
            raise RuleError(f"{where}: statuses: name at least one of {', '.join(s.value for s in LagStatus)}")


def against_ms(rule: TrendRule) -> int:
    """How far back the baseline window starts: one window for 'previous', else the offset."""
    if rule.against == "previous":
        return rule.window
    return parse_duration_ms(rule.against)


def rule_json(rule: Rule) -> dict:
    """The definition as the API shows it and the store keeps it (durations as text, `for` by its name)."""
    return rule.model_dump(mode="json", by_alias=True, exclude_none=True)


def _check_metric_rule(rule: _OverMetric, catalog: Catalog, where: str) -> None:
    # The metric, stat, group_by and filters are checked as every query's are (query.resolve_target).
    try:
        target = resolve_target(catalog, rule.metric, [rule.stat], rule.group_by, rule.filters)
    except QueryError as exc:
        field = {"filter": "filters"}.get(exc.param, exc.param)  # the rule's own field name
        raise RuleError(f"{where}: {field}: {exc}") from None
    stream = catalog.streams[target.stream]
    if rule.window % stream.pane or not stream.pane <= rule.window <= MAX_WINDOW_MS:
        raise RuleError(f"{where}: window: must be a multiple of the stream's pane ({stream.pane // 1000}s),"
                        f" at most 7d; got {rule.window} ms")
    if isinstance(rule, TrendRule):
        try:
            offset = against_ms(rule)
        except ValueError as exc:
            raise RuleError(f"{where}: against: 'previous' or a duration such as 1d or 1w; {exc}") from None
        if offset < rule.window or offset % stream.pane:
            raise RuleError(f"{where}: against: the offset must be at least the window and a multiple of the pane")
        # The rule's window ends at the watermark floored to the pane (alerts/kinds.py), the watermark
        # trailing the clock by allowed_lateness: its baseline starts offset + window + lateness and up
        # to a pane before the clock, and retention drops panes from clock - retention on.
        needed = offset + rule.window + stream.allowed_lateness + stream.pane
        if needed > stream.retention:
            raise RuleError(f"{where}: against: the baseline window would start up to {format_duration_ms(needed)}"
                            f" before the clock (against {format_duration_ms(offset)} + window"
                            f" {format_duration_ms(rule.window)} + the stream's allowed_lateness"
                            f" {format_duration_ms(stream.allowed_lateness)} + a pane {format_duration_ms(stream.pane)}),"
                            f" older than the stream's retention ({format_duration_ms(stream.retention)}): its first"
                            " events would be dropped already; use a shorter window or offset, or a longer retention")


def _check_pattern_rule(rule: PatternRule, catalog: Catalog, where: str) -> None:
    names = [p.name for p in catalog.patterns]
    if rule.pattern not in names:
        raise RuleError(f"{where}: pattern: unknown pattern {rule.pattern!r};"
                        f" defined: {', '.join(sorted(names)) or 'none (declare patterns in the catalog)'}")
    if rule.for_:
        raise RuleError(f"{where}: for: must be 0 for a pattern rule (each match fires once, at once; there is"
                        " no condition that keeps holding); use keep_firing_for to keep it firing")


def _stream(catalog: Catalog, name: str, where: str):
    stream = catalog.streams.get(name)
    if stream is None:
        raise RuleError(f"{where}: stream: unknown stream {name!r}; defined: {', '.join(sorted(catalog.streams))}")
    return stream


def _check_dimensions(group_by, filters, dimensions, where: str) -> None:
    for name in (*group_by, *filters):
        if name not in dimensions:
            raise RuleError(f"{where}: unknown dimension {name!r} in group_by/filters;"
                            f" dimensions: {', '.join(dimensions) or 'none'}")
    for name, value in filters.items():  # as the query's filters (query/model.py): no label holds one
        if problem := unstorable(value):
            raise RuleError(f"{where}: filters: {name}={value!r}: {problem}")


def _describe(exc: ValidationError, data: dict) -> str:
    """pydantic's first error as one line naming the field: 'rule x: threshold: ...'."""
    name = data.get("name") if isinstance(data.get("name"), str) else "?"
    parts = []
    for error in exc.errors()[:3]:
        loc = [str(p) for p in error["loc"]]
        if loc and loc[0] == data.get("kind"):  # the union's tag comes first
            loc = loc[1:]
        field = ".".join(loc) or "rule"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "missing":
            message = "required"
        given = error.get("input")
        if error["type"] not in ("missing", "extra_forbidden") and not isinstance(given, (dict, list)):
            shown = repr(given)  # a 400-digit number is not worth echoing whole
            message += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
        parts.append(f"{field}: {message}")
    return f"rule {name!r}: " + "; ".join(parts)
