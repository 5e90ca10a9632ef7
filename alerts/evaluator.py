"""One evaluation of one rule: the rule's `Outcome` applied to its instances' previous states.
Pure: returns the instances to keep, the state changes (history) and the notices.

Instances are keyed by a fingerprint of their labels (alertname, the rule's labels and the
group's). An instance whose group no longer appears reads as "condition false" (Prometheus:
the series went away), so a firing one resolves rather than vanishing (an absence rule's
group is the exception: it goes away because it stayed silent). When the rule as a
whole has no data or fails, every known instance goes to NoData/Error (a firing alert must
not quietly look resolved because its data stopped); with none known, one instance carrying
only the rule's labels does.

Normal instances are not kept: the history records how they got there.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from alerts.machine import Instance, Reading, step
from alerts.outcome import Outcome, Sample
from alerts.rules import AbsenceRule, Rule
from alerts.states import AlertState, Notice
from alerts.templating import render_all
from catalog import format_duration_ms


@dataclass(frozen=True)
class Transition:
    """One history entry: an instance changed state at an evaluation."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    from_state: AlertState
    to_state: AlertState
    value: float | str | None
    at_ms: int
    window_start_ms: int | None
    window_end_ms: int | None
    revision: int | None
    reason: str | None


@dataclass(frozen=True)
class Evaluation:
    rule: str
    at_ms: int
    instances: list[Instance]  # every instance not Normal after this evaluation
    transitions: list[Transition]
    notices: list[Notice]  # firing now, and resolved by this evaluation
    cursor: int | None = None  # pattern rules: the last match id read, saved with the instances


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def evaluate(rule: Rule, outcome: Outcome, previous: dict[str, Instance], now_ms: int) -> Evaluation:
    readings = _readings(rule, outcome, previous)
    instances, transitions, notices = [], [], []
    for fp, (labels, reading, sample) in readings.items():
        prev = previous.get(fp)
        inst = step(prev, _mapped(rule, reading), rule=rule.name, fingerprint=fp, labels=labels, now_ms=now_ms,
                    for_ms=rule.for_,
                    keep_firing_for_ms=0 if sample is not None and sample.withdrawn else rule.keep_firing_for)
        if sample is not None and sample.withdrawn:  # what fired stays shown, with why it was withdrawn
            inst = replace(inst, reason=sample.reason, details={**inst.details, **sample.details})
        elif sample is not None:
            inst = replace(inst, value=sample.value, window_start_ms=sample.window_start_ms,
                           window_end_ms=sample.window_end_ms, revision=sample.revision, reason=sample.reason,
                           details=sample.details or inst.details)
        elif reading is Reading.FALSE and inst.state is AlertState.FIRING:
            # Gone, but kept firing (keep_firing_for): its last value stays, as Prometheus keeps it,
            # so a notice sent meanwhile reads as the one that fired, not "no data".
            inst = replace(inst, reason="no longer reported by the rule's query; kept firing (keep_firing_for)")
        elif reading is Reading.FALSE:  # the group is gone: nothing to show but that, and the window read
            # (kinds without a metric window name none: the instance keeps the one it had)
            read = outcome.window_start_ms is not None
            inst = replace(inst, value=None, window_start_ms=outcome.window_start_ms if read else inst.window_start_ms,
                           window_end_ms=outcome.window_end_ms if read else inst.window_end_ms, revision=None,
                           reason="no longer reported by the rule's query")
        # The data's own annotations (a match's events) stay with the instance until it resolves.
        inst = replace(inst, annotations={**inst.details, **render_all(rule.annotations, value=inst.value,
                                                                       labels=labels, rule=rule.name,
                                                                       state=inst.state.value)})
        was = prev.state if prev is not None else AlertState.NORMAL
        if inst.state is not was and not (was is AlertState.RESOLVED and inst.state is AlertState.NORMAL):
            transitions.append(Transition(rule.name, fp, labels, inst.annotations, was, inst.state, inst.value,
                                          now_ms, inst.window_start_ms, inst.window_end_ms, inst.revision,
                                          inst.reason))
        if inst.state.notifies_firing:
            notices.append(_notice(inst, "firing"))
        elif was.notifies_firing:  # resolved by this evaluation; it started when the previous spell did
            shown = replace(inst, active_since_ms=prev.active_since_ms)
            if sample is None and reading is Reading.FALSE:
                # Its group is gone: no value of its own. The receiver is told the value it was told
                # last, as Prometheus keeps a resolved alert's last value (not "no data"), rendered
                # as resolved ({{ $state }} must not read "firing" in a resolved notice).
                shown = replace(shown, value=prev.value, annotations={
                    **inst.details, **render_all(rule.annotations, value=prev.value, labels=labels, rule=rule.name,
                                                 state=inst.state.value)})
            notices.append(replace(_notice(shown, "resolved"), ends_at_ms=now_ms))
        if inst.state is not AlertState.NORMAL:
            instances.append(inst)
    return Evaluation(rule.name, now_ms, instances, transitions, notices, outcome.cursor)


def _readings(rule: Rule, outcome: Outcome, previous: dict[str, Instance]):
    """fingerprint -> (labels, reading, sample or None) for every instance this evaluation touches."""
    out: dict[str, tuple[dict[str, str], Reading, Sample | None]] = {}
    whole = Reading.ERROR if outcome.error is not None else Reading.NODATA if outcome.no_data is not None else None
    if whole is not None:
        reason = outcome.error if outcome.error is not None else outcome.no_data
        watched = {fp: i.labels for fp, i in previous.items() if i.state is not AlertState.RESOLVED}
        for fp, labels in (watched or _rule_level(rule)).items():  # an empty window is still the one read
            out[fp] = (labels, whole, Sample({}, None, None, outcome.window_start_ms, outcome.window_end_ms,
                                             reason=reason))
    else:
        for sample in outcome.samples:
            labels = {"alertname": rule.name, **_labels(rule, sample.value, sample.group), **sample.group}
            reading = Reading.NODATA if sample.condition is None else Reading.TRUE if sample.condition else Reading.FALSE
            out[fingerprint(labels)] = (labels, reading, sample)
    for fp, inst in previous.items():
        if fp not in out:
            out[fp] = _gone(rule, inst)
    return out


def _gone(rule: Rule, inst: Instance) -> tuple[dict[str, str], Reading, Sample | None]:
    """The reading of a known instance the outcome no longer mentions: "condition false" (the
    series went away), except for an absence rule's group, which drops out of the outcome
    because its newest event left `lookback`: it is as silent as ever, not back."""
    if isinstance(rule, AbsenceRule) and _is_group_instance(rule, inst) and inst.state is not AlertState.RESOLVED:
        lookback_s = rule.lookback / 1000
        return inst.labels, Reading.TRUE, Sample({k: inst.labels[k] for k in rule.group_by}, lookback_s, True,
                                                 reason=f"no events in the last {format_duration_ms(rule.lookback)}")
    return inst.labels, Reading.FALSE, None


def _is_group_instance(rule: AbsenceRule, inst: Instance) -> bool:
    # Not the rule-level instance ("nothing at all in lookback"): that one clears once groups report.
    return bool(rule.group_by) and all(k in inst.labels for k in rule.group_by)


def _rule_level(rule: Rule) -> dict[str, dict[str, str]]:
    labels = {"alertname": rule.name, **_labels(rule, None, {})}
    return {fingerprint(labels): labels}


def _labels(rule: Rule, value, group: dict[str, str]) -> dict[str, str]:
    """The rule's labels, templated like Prometheus' (they are part of the instance's identity, so
    a label using {{ $value }} makes a new instance whenever the value changes: use annotations)."""
    return render_all(rule.labels, value=value, labels=group, rule=rule.name, state="")


def _mapped(rule: Rule, reading: Reading) -> Reading:
    if reading is Reading.NODATA and rule.no_data_state == "firing":
        return Reading.TRUE
    if reading is Reading.ERROR and rule.error_state == "firing":
        return Reading.TRUE
    return reading


def _notice(inst: Instance, status: str) -> Notice:
    return Notice(rule=inst.rule, fingerprint=inst.fingerprint, status=status, state=inst.state,
                  labels=inst.labels, annotations=inst.annotations,
                  starts_at_ms=inst.active_since_ms if inst.active_since_ms is not None else inst.last_eval_ms,
                  value=inst.value if isinstance(inst.value, (int, float)) else None)
