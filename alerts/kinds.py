"""Each kind of rule turned into an `Outcome` (samples with their condition) at time `now_ms`.
Pure: data comes through `AlertData`, time is a parameter.

Metric rules (threshold, trend) read the newest *final* window: the one ending at the last
pane boundary the watermark has passed, so late events can no longer change it except as a
published correction. With `provisional: true` they read the window ending with the newest
pane that has events instead (faster, may flap while it fills).
"""

from __future__ import annotations

import json
import math
import operator
from datetime import datetime, timezone

from alerts.outcome import AlertData, Outcome, PatternMatch, Sample, WindowValue
from alerts.rules import (
    AbsenceRule,
    DeadLetterRule,
    LagRule,
    LagStatusRule,
    PatternRule,
    Rule,
    ThresholdRule,
    TrendRule,
    against_ms,
)
from catalog import Catalog, StreamDef, format_duration_ms
from catalog.features import sessions_base, watermark_trail_ms

COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
           "==": operator.eq, "!=": operator.ne}


def evaluate_rule(rule: Rule, data: AlertData, catalog: Catalog, now_ms: int, *,
                  cursor: int | None = None) -> Outcome:
    """The rule's outcome; a failure reading or computing becomes the Error outcome, never an exception.
    `cursor`: for pattern rules, the last match id the rule read (None: it never read any)."""
    try:
        if isinstance(rule, PatternRule):
            return _pattern(rule, data, cursor)
        if isinstance(rule, ThresholdRule):
            return _threshold(rule, data, catalog, now_ms)
        if isinstance(rule, TrendRule):
            return _trend(rule, data, catalog, now_ms)
        if isinstance(rule, AbsenceRule):
            return _absence(rule, data, catalog, now_ms)
        if isinstance(rule, LagRule):
            return _lag(rule, data)
        if isinstance(rule, LagStatusRule):
            return _lag_status(rule, data)
        if isinstance(rule, DeadLetterRule):
            return _dead_letters(rule, data, catalog, now_ms)
        return Outcome.failed(f"unknown rule kind {type(rule).__name__}")
    except Exception as exc:  # a broken store or a bad query must show as Error, not as Normal
        return Outcome.failed(f"{type(exc).__name__}: {exc}")


def metric_window(rule: ThresholdRule | TrendRule, data: AlertData, catalog: Catalog,
                  now_ms: int) -> tuple[int, int] | Outcome:
    """[start, end) of the window the rule reads now, or the NoData outcome saying why there is none."""
    stream = catalog.streams[catalog.metric(rule.metric).stream]
    watermark = data.watermark(stream.name)
    if watermark is None:
        return Outcome.nodata(f"no events processed yet on stream {stream.name!r}")
    end = newest_window_end(stream, watermark, provisional=rule.provisional)
    base = sessions_base(catalog, stream.name)
    if base is not None and (base_watermark := data.watermark(base.name)) is not None:
        # A sessions stream's windows come as its sessions close: they trail by the sessions' own
        # length too (users active for 10 minutes: 10 minutes more), which no trail declared in the
        # catalog covers. Whether traffic comes and the pipeline keeps up is its base stream's to
        # say; the newest final sessions window is read wherever it is.
        behind = (expected_window_end(base, 0, now_ms, provisional=rule.provisional)
                  - newest_window_end(base, base_watermark, provisional=rule.provisional))
        why = f", judged by {base.name}, whose sessions {stream.name} counts as they close"
    else:
        trail = watermark_trail_ms(catalog, stream.name)
        behind = expected_window_end(stream, trail, now_ms, provisional=rule.provisional) - end
        # Say the trail was allowed for: "340s behind" must not read as the trail itself.
        why = (f", past the {format_duration_ms(trail)} by which {stream.name} trails {stream.derived_from}"
               if trail else "")
    if behind > rule.stale_after:
        what = f"{base.name}'s newest" if base is not None else "the newest"
        return Outcome.nodata(f"{what} {'window' if rule.provisional else 'final window'} ended"
                              f" {format_duration_ms(behind)} before expected (stale_after"
                              f" {format_duration_ms(rule.stale_after)}{why}): no traffic, or the pipeline is behind")
    return end - rule.window, end


def newest_window_end(stream: StreamDef, watermark_ms: int, *, provisional: bool) -> int:
    """Where the newest window a rule can read ends: the last pane boundary the watermark passed
    (final), or with `provisional` the end of the pane holding the newest event."""
    pane = stream.pane
    if provisional:
        return (watermark_ms + stream.allowed_lateness) // pane * pane + pane
    return watermark_ms // pane * pane


def expected_window_end(stream: StreamDef, trail_ms: int, now_ms: int, *, provisional: bool) -> int:
    """Where the newest window a rule reads should end at `now_ms` when the pipeline keeps up:
    the last final pane boundary (now - allowed lateness), or with `provisional` the end of the
    pane holding now, each moved back by the stream's structural trail (`watermark_trail_ms`:
    a sessions stream's rows come only as sessions close). A window further behind than
    `stale_after` is stale: without the trail every default rule on a sessions metric read
    `nodata` under healthy traffic, its windows always gap + lateness behind that."""
    pane = stream.pane
    if provisional:
        return (now_ms - trail_ms) // pane * pane + pane
    return (now_ms - trail_ms - stream.allowed_lateness) // pane * pane


def _threshold(rule: ThresholdRule, data: AlertData, catalog: Catalog, now_ms: int) -> Outcome:
    window = metric_window(rule, data, catalog, now_ms)
    if isinstance(window, Outcome):
        return window
    start, end = window
    values = data.window_values(rule.metric, rule.stat, start, end, rule.group_by, rule.filters, now_ms=now_ms)
    if not values:
        return Outcome.nodata(f"no events in the window ({_span(start, end)})", window)
    test = COMPARE[rule.op]
    return Outcome([_sample(v, v.value, start, end, None if v.value is None else test(v.value, rule.threshold),
                            None if v.value is not None else f"{rule.stat} is undefined: no values in the window")
                    for v in values], window_start_ms=start, window_end_ms=end)


def _trend(rule: TrendRule, data: AlertData, catalog: Catalog, now_ms: int) -> Outcome:
    window = metric_window(rule, data, catalog, now_ms)
    if isinstance(window, Outcome):
        return window
    start, end = window
    offset = against_ms(rule)
    now_values = data.window_values(rule.metric, rule.stat, start, end, rule.group_by, rule.filters, now_ms=now_ms)
    then_values = data.window_values(rule.metric, rule.stat, start - offset, end - offset, rule.group_by, rule.filters,
                                     now_ms=now_ms)
    then = {tuple(sorted(v.group.items())): v for v in then_values}
    # Like PromQL's `x / x offset 1w`: only groups present at both times get a sample.
    pairs = [(v, then[key]) for v in now_values if (key := tuple(sorted(v.group.items()))) in then]
    if not pairs:
        which = "previous window" if rule.against == "previous" else f"window {rule.against} earlier"
        return Outcome.nodata(f"no groups with data both now ({_span(start, end)}) and in the {which}", window)
    test = COMPARE[rule.op]
    samples = []
    for current, base in pairs:
        value, reason = _change(rule.mode, current.value, base.value, offset)
        condition = None if value is None else test(value, rule.threshold)
        if rule.min_baseline is not None and base.value is not None and base.value < rule.min_baseline:
            condition, reason = False, f"baseline {base.value:g} is below min_baseline {rule.min_baseline:g}"
        samples.append(_sample(current, value, start, end, condition, reason))
    return Outcome(samples, window_start_ms=start, window_end_ms=end)


def _change(mode: str, current: float | None, base: float | None, offset_ms: int) -> tuple[float | None, str | None]:
    if current is None or base is None:
        return None, "the stat is undefined in one of the two windows"
    if mode == "diff":
        return current - base, None
    if mode == "rate":
        return (current - base) / (offset_ms / 1000), None
    if base == 0:
        return None, "the baseline is 0, so the ratio is undefined"
    ratio = current / base
    if not math.isfinite(ratio):  # 1e290 against 1e-300: past a double
        return None, f"the ratio of {current!r} to {base!r} is past a double"
    return ratio, None


def _absence(rule: AbsenceRule, data: AlertData, catalog: Catalog, now_ms: int) -> Outcome:
    stream = catalog.streams[rule.stream]
    # Up to the pane holding now + max_future_skew: events stamped that far ahead of the clock
    # are accepted (a device clock running fast), and they are events, not silence.
    end = (now_ms + stream.max_future_skew) // stream.pane * stream.pane + stream.pane
    start = (now_ms - rule.lookback) // stream.pane * stream.pane
    seen = data.last_seen(rule.stream, start, end, rule.group_by, rule.filters)
    if not seen:  # nothing at all within the lookback: the stream (or every group) is silent
        return Outcome([Sample({}, rule.lookback / 1000, True, start, end,
                               reason=f"no events in the last {format_duration_ms(rule.lookback)}")])
    samples = []
    for group, last_end in sorted(seen.items()):
        silent_s = max(0, now_ms - last_end) / 1000
        samples.append(Sample(dict(zip(rule.group_by, group)), silent_s, silent_s * 1000 >= rule.duration,
                              start, end, reason=f"seconds since the newest event (pane ending {last_end})"))
    return Outcome(samples)


def _lag_views(rule: LagRule | LagStatusRule, data: AlertData):
    views = data.lag()
    if views is None:
        return Outcome.failed("consumer lag is not monitored in this process")
    if rule.stream is not None:
        views = {rule.stream: views[rule.stream]} if rule.stream in views else {}
    if not views:
        return Outcome.nodata("no lag samples yet")
    return views


def _lag(rule: LagRule, data: AlertData) -> Outcome:
    views = _lag_views(rule, data)
    if isinstance(views, Outcome):
        return views
    test = COMPARE[rule.op]
    return Outcome([Sample({"stream": name}, v.lag_seconds,
                           None if v.lag_seconds is None else test(v.lag_seconds, rule.threshold),
                           reason=None if v.lag_seconds is not None else "lag in seconds unknown")
                    for name, v in sorted(views.items())])


def _lag_status(rule: LagStatusRule, data: AlertData) -> Outcome:
    views = _lag_views(rule, data)
    if isinstance(views, Outcome):
        return views
    return Outcome([Sample({"stream": name}, v.status, v.status in rule.statuses, reason=v.reason)
                    for name, v in sorted(views.items())])


def _dead_letters(rule: DeadLetterRule, data: AlertData, catalog: Catalog, now_ms: int) -> Outcome:
    start = now_ms - rule.window
    counts = data.dead_letter_counts(start, now_ms)
    streams = [rule.stream] if rule.stream is not None else sorted(catalog.streams)
    test = COMPARE[rule.op]
    samples = []
    for name in streams:
        rate = counts.get(name, 0) / (rule.window / 1000)
        samples.append(Sample({"stream": name}, rate, test(rate, rule.threshold), start, now_ms,
                              reason=f"{counts.get(name, 0)} dead letters in {format_duration_ms(rule.window)}"))
    return Outcome(samples)


def _pattern(rule: PatternRule, data: AlertData, cursor: int | None) -> Outcome:
    """One sample per match committed since the last evaluation, each its own instance (labelled
    with its match id), so every match fires once. A rule reading for the first time starts after
    the newest match: a new rule alerts on what happens from now on, not on the pattern's history.
    A retraction (a late event broke a match) reads as the withdrawn match's instance with its
    condition false: one still firing resolves at once; one read in the same page never fires."""
    if cursor is None:
        return Outcome([], cursor=data.newest_match_id(rule.pattern) or 0)
    matches = data.pattern_matches(rule.pattern, cursor, rule.max_matches)
    samples = [_match_sample(rule.pattern, m) for m in matches]
    return Outcome(samples, cursor=matches[-1].id if matches else cursor)


def _match_sample(pattern: str, m: PatternMatch) -> Sample:
    if m.retracts is not None:
        return Sample({"pattern": pattern, "key": m.key, "match_id": str(m.retracts)}, float(len(m.events)), False,
                      reason=f"match {m.retracts} of pattern {pattern!r} for key {m.key!r} retracted by {m.id}:"
                             " a late event broke it", details={"retracted_by": str(m.id)}, withdrawn=True)
    times = [e["time"] for e in m.events if isinstance(e.get("time"), int)]
    details = {"events": json.dumps(m.events, separators=(",", ":"), sort_keys=True),
               "measures": json.dumps(m.measures, separators=(",", ":"), sort_keys=True),
               "decided_at": datetime.fromtimestamp(m.decided_at_ms / 1000, timezone.utc).isoformat(
                   timespec="milliseconds").replace("+00:00", "Z")}
    if m.dims:  # what the match's metric groups it by (the pattern's dimensions), e.g. the burst's client
        details["dims"] = json.dumps(m.dims, separators=(",", ":"), sort_keys=True)
    if m.late:
        details["late"] = "true"
    return Sample({"pattern": pattern, "key": m.key, "match_id": str(m.id)}, float(len(m.events)), True,
                  min(times, default=m.decided_at_ms), m.decided_at_ms,
                  reason=f"match {m.id} of pattern {pattern!r} for key {m.key!r}", details=details)


def _sample(v: WindowValue, value: float | None, start: int, end: int, condition: bool | None,
            reason: str | None) -> Sample:
    return Sample(v.group, value, condition, start, end, v.revision, reason)


def _span(start: int, end: int) -> str:
    return f"[{start}, {end}) ms"
