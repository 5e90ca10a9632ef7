"""The alert state machine and one-rule evaluation, pure: fake outcomes, times as numbers.

Every transition of alerts/machine.py, `for`, `keep_firing_for`, NoData and Error (and
their "firing" mappings), group instances coming and going, history and notices."""

from __future__ import annotations

import pytest

from alerts.dedup import Why, plan
from alerts.evaluator import evaluate, fingerprint
from alerts.machine import Reading, step
from alerts.outcome import Outcome, Sample
from alerts.rules import parse_rule
from alerts.states import AlertState, RuleNotices

S = AlertState
T0 = 1_800_000_000_000
STEP = 10_000  # the evaluation interval used in these tests


def make_rule(catalog, **fields):
    definition = {"name": "r", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m",
                  "threshold": 100, **fields}
    return parse_rule(definition, catalog)


def run(rule, outcomes, start=T0):
    """Evaluate a sequence of outcomes one interval apart; return every Evaluation."""
    previous, results = {}, []
    for i, outcome in enumerate(outcomes):
        result = evaluate(rule, outcome, previous, start + i * STEP)
        previous = {inst.fingerprint: inst for inst in result.instances}
        results.append(result)
    return results


def value(v):
    return Outcome([Sample({}, v, v > 100, T0 - 60_000, T0, 1)])


def states(results):
    return [r.instances[0].state if r.instances else S.NORMAL for r in results]


# -- the machine alone ------------------------------------------------------------------------

def test_step_covers_every_transition():
    kw = dict(rule="r", fingerprint="f", labels={}, for_ms=20_000, keep_firing_for_ms=0)
    normal = step(None, Reading.FALSE, now_ms=0, **kw)
    assert normal.state is S.NORMAL
    pending = step(normal, Reading.TRUE, now_ms=10_000, **kw)
    assert (pending.state, pending.active_since_ms) == (S.PENDING, 10_000)
    still = step(pending, Reading.TRUE, now_ms=20_000, **kw)
    assert still.state is S.PENDING and still.active_since_ms == 10_000
    firing = step(still, Reading.TRUE, now_ms=30_000, **kw)
    assert (firing.state, firing.fired_at_ms, firing.active_since_ms) == (S.FIRING, 30_000, 10_000)
    resolved = step(firing, Reading.FALSE, now_ms=40_000, **kw)
    assert resolved.state is S.RESOLVED
    assert step(resolved, Reading.FALSE, now_ms=50_000, **kw).state is S.NORMAL
    assert step(resolved, Reading.TRUE, now_ms=50_000, **kw).state is S.PENDING
    assert step(pending, Reading.FALSE, now_ms=20_000, **kw).state is S.NORMAL  # pending never fired
    nodata = step(pending, Reading.NODATA, now_ms=40_000, **kw)  # a spell that never fired
    assert (nodata.state, nodata.active_since_ms) == (S.NODATA, 40_000)
    assert step(nodata, Reading.NODATA, now_ms=50_000, **kw).active_since_ms == 40_000
    assert step(nodata, Reading.FALSE, now_ms=50_000, **kw).state is S.NORMAL
    assert step(nodata, Reading.TRUE, now_ms=50_000, **kw).state is S.PENDING
    error = step(pending, Reading.ERROR, now_ms=30_000, **kw)
    assert error.state is S.ERROR
    assert step(error, Reading.FALSE, now_ms=40_000, **kw).state is S.NORMAL


def test_for_zero_fires_at_once():
    inst = step(None, Reading.TRUE, rule="r", fingerprint="f", labels={}, now_ms=5, for_ms=0, keep_firing_for_ms=0)
    assert inst.state is S.FIRING and inst.fired_at_ms == 5


# -- `for` and `keep_firing_for` over evaluations -------------------------------------------------

def test_for_holds_pending_until_the_period_has_passed(catalog):
    rule = make_rule(catalog, **{"for": "30s"})
    results = run(rule, [value(50), value(150), value(150), value(150), value(150), value(50), value(50)])
    assert states(results) == [S.NORMAL, S.PENDING, S.PENDING, S.PENDING, S.FIRING, S.RESOLVED, S.NORMAL]
    firing = results[4].instances[0]
    assert firing.fired_at_ms - firing.active_since_ms == 30_000  # pending at T0+10s, firing at T0+40s


def test_a_dip_during_pending_starts_the_period_again(catalog):
    rule = make_rule(catalog, **{"for": "20s"})
    results = run(rule, [value(150), value(150), value(50), value(150), value(150), value(150)])
    assert states(results) == [S.PENDING, S.PENDING, S.NORMAL, S.PENDING, S.PENDING, S.FIRING]


def test_keep_firing_for_bridges_short_gaps(catalog):
    rule = make_rule(catalog, keep_firing_for="25s")
    results = run(rule, [value(150), value(50), value(50), value(150), value(50), value(50), value(50), value(50)])
    # True at 0 and 30 s; false afterwards: keeps firing until 25 s after the last true reading.
    assert states(results) == [S.FIRING, S.FIRING, S.FIRING, S.FIRING, S.FIRING, S.FIRING, S.RESOLVED, S.NORMAL]
    assert results[6].at_ms - results[3].at_ms == 30_000


def test_without_keep_firing_for_one_false_reading_resolves(catalog):
    results = run(make_rule(catalog), [value(150), value(50)])
    assert states(results) == [S.FIRING, S.RESOLVED]


# -- NoData and Error never read as Normal -----------------------------------------------------------

def test_no_data_goes_to_nodata_and_back(catalog):
    results = run(make_rule(catalog), [Outcome.nodata("no events"), Outcome.nodata("no events"), value(50)])
    assert states(results) == [S.NODATA, S.NODATA, S.NORMAL]
    assert results[0].transitions[0].reason == "no events"
    assert len(results[1].transitions) == 0  # still NoData: no new history entry
    assert results[0].notices[0].status == "firing" and results[0].notices[0].state is S.NODATA
    assert results[2].notices[0].status == "resolved"


def test_error_is_a_state_of_its_own(catalog):
    results = run(make_rule(catalog), [Outcome.failed("store locked"), value(150)])
    assert states(results) == [S.ERROR, S.FIRING]
    assert results[0].instances[0].reason == "store locked"


def test_no_data_and_error_can_be_mapped_to_firing(catalog):
    rule = make_rule(catalog, no_data_state="firing", error_state="firing", **{"for": "10s"})
    results = run(rule, [Outcome.nodata("x"), Outcome.nodata("x"), Outcome.failed("y")])
    assert states(results) == [S.PENDING, S.FIRING, S.FIRING]


def test_a_firing_group_whose_data_stops_goes_to_nodata_not_resolved(catalog):
    rule = make_rule(catalog, group_by=["endpoint"])
    firing = Outcome([Sample({"endpoint": "/a"}, 150, True), Sample({"endpoint": "/b"}, 50, False)])
    results = run(rule, [firing, Outcome.nodata("the pipeline stopped")])
    [inst] = results[1].instances
    assert inst.labels["endpoint"] == "/a" and inst.state is S.NODATA


def test_a_group_with_an_undefined_stat_is_nodata_alone(catalog):
    rule = make_rule(catalog, group_by=["endpoint"])
    outcome = Outcome([Sample({"endpoint": "/a"}, None, None, reason="no values"), Sample({"endpoint": "/b"}, 150, True)])
    [result] = run(rule, [outcome])
    by_endpoint = {i.labels["endpoint"]: i.state for i in result.instances}
    assert by_endpoint == {"/a": S.NODATA, "/b": S.FIRING}


def test_a_gap_in_a_firing_spell_neither_resolves_nor_restarts_it():
    kw = dict(rule="r", fingerprint="f", labels={}, for_ms=20_000, keep_firing_for_ms=0)
    firing = step(step(None, Reading.TRUE, now_ms=10_000, **kw), Reading.TRUE, now_ms=30_000, **kw)
    for gap in (Reading.NODATA, Reading.ERROR):
        blip = step(firing, gap, now_ms=40_000, **kw)
        # Still the incident the receiver was told about, since it began.
        assert (blip.active_since_ms, blip.fired_at_ms) == (10_000, 30_000)
        assert step(blip, gap, now_ms=50_000, **kw).fired_at_ms == 30_000
        back = step(blip, Reading.TRUE, now_ms=50_000, **kw)
        assert (back.state, back.active_since_ms, back.fired_at_ms) == (S.FIRING, 10_000, 30_000)
        assert step(blip, Reading.FALSE, now_ms=50_000, **kw).state is S.RESOLVED


@pytest.mark.parametrize("gap", [Outcome.nodata("stale window"), Outcome.failed("database is locked")])
def test_one_missing_evaluation_sends_no_false_resolution(catalog, gap):
    rule = make_rule(catalog, **{"for": "30s"})
    results = run(rule, [value(150)] * 5 + [gap] + [value(150)] * 5)
    assert states(results)[3:] == [S.FIRING, S.FIRING, gap_state(gap)] + [S.FIRING] * 5
    sent, memory = [], None
    for r in results:
        p = plan(RuleNotices("r", r.at_ms, r.notices), memory, r.at_ms / 1000, 14_400)
        if p.send:
            memory = p.remember
            sent.append((r.at_ms, p.why))
    assert sent == [(T0 + 3 * STEP, Why.NEW)]  # fired once; no resolved, no re-fire
    assert {n.starts_at_ms for r in results[3:] for n in r.notices} == {T0}


def test_keep_firing_for_holds_across_a_gap(catalog):
    rule = make_rule(catalog, keep_firing_for="5m")
    results = run(rule, [value(150), Outcome.nodata("stale window"), value(50), value(50)])
    assert states(results) == [S.FIRING, S.NODATA, S.FIRING, S.FIRING]
    assert all(n.status == "firing" for r in results for n in r.notices)


def test_a_gap_then_a_false_condition_resolves_the_incident(catalog):
    results = run(make_rule(catalog), [value(150), Outcome.failed("store locked"), value(50), value(50)])
    assert states(results) == [S.FIRING, S.ERROR, S.RESOLVED, S.NORMAL]
    assert [n.status for n in results[2].notices] == ["resolved"]


def gap_state(outcome):
    return S.ERROR if outcome.error is not None else S.NODATA


# -- instances, labels, annotations, history, notices ------------------------------------------------

def test_groups_are_instances_and_a_vanished_group_resolves(catalog):
    rule = make_rule(catalog, group_by=["endpoint"], labels={"severity": "page"},
                     annotations={"summary": "p99 of {{ $labels.endpoint }} is {{ $value }} ms ({{ $state }})"})
    both = Outcome([Sample({"endpoint": "/a"}, 150.5, True), Sample({"endpoint": "/b"}, 300, True)])
    only_a = Outcome([Sample({"endpoint": "/a"}, 150.5, True)])
    results = run(rule, [both, only_a, only_a])
    first = {i.labels["endpoint"]: i for i in results[0].instances}
    assert first["/b"].labels == {"alertname": "r", "severity": "page", "endpoint": "/b"}
    assert first["/b"].annotations == {"summary": "p99 of /b is 300 ms (firing)"}
    assert first["/a"].fingerprint == fingerprint({"alertname": "r", "severity": "page", "endpoint": "/a"})
    assert {i.labels["endpoint"]: i.state for i in results[1].instances} == {"/a": S.FIRING, "/b": S.RESOLVED}
    assert [(n.labels["endpoint"], n.status) for n in results[1].notices] == [("/a", "firing"), ("/b", "resolved")]
    resolved = next(n for n in results[1].notices if n.status == "resolved")
    assert resolved.ends_at_ms == T0 + STEP and resolved.starts_at_ms == T0
    assert [i.labels["endpoint"] for i in results[2].instances] == ["/a"]  # /b is Normal: not kept


def test_a_vanished_group_resolves_on_the_window_the_evaluation_read(catalog):
    """Its history entry names that window (not the firing's), with no revision: the group has
    no panes there; corrections_since then counts corrections to the window it was decided on."""
    rule = make_rule(catalog, group_by=["endpoint"])
    both = Outcome([Sample({"endpoint": "/a"}, 150.5, True, T0 - 60_000, T0, 2),
                    Sample({"endpoint": "/b"}, 300, True, T0 - 60_000, T0, 3)], window_start_ms=T0 - 60_000,
                   window_end_ms=T0)
    only_a = Outcome([Sample({"endpoint": "/a"}, 150.5, True, T0 - 50_000, T0 + STEP, 1)],
                     window_start_ms=T0 - 50_000, window_end_ms=T0 + STEP)
    [resolved] = run(rule, [both, only_a])[1].transitions
    assert (resolved.labels["endpoint"], resolved.to_state) == ("/b", S.RESOLVED)
    assert (resolved.window_start_ms, resolved.window_end_ms, resolved.revision) == (T0 - 50_000, T0 + STEP, None)


def test_a_vanished_group_is_resolved_with_the_value_and_annotations_it_fired_with(catalog):
    """Nothing is left to render {{ $value }} with: the resolved notice keeps the last firing
    annotations (as Prometheus does), not "no data"; the history says the group is gone."""
    rule = make_rule(catalog, group_by=["endpoint"], annotations={"summary": "p99 of {{ $labels.endpoint }} is {{ $value }}"})
    results = run(rule, [Outcome([Sample({"endpoint": "/b"}, 300, True)]), Outcome([Sample({"endpoint": "/a"}, 5, False)])])
    [resolved] = results[1].notices
    assert (resolved.status, resolved.value, resolved.annotations) == ("resolved", 300, {"summary": "p99 of /b is 300"})
    [gone] = results[1].transitions
    assert gone.value is None and gone.reason == "no longer reported by the rule's query"


def test_a_vanished_groups_resolved_notice_is_rendered_as_resolved(catalog):
    """{{ $state }} in the resolved notice of a group that is gone reads "resolved", with the value
    it fired with (it read "firing": the firing notice's annotations were copied)."""
    rule = make_rule(catalog, group_by=["endpoint"], annotations={"summary": "{{ $labels.endpoint }} is {{ $state }}"
                                                                             " at {{ $value }}"})
    results = run(rule, [Outcome([Sample({"endpoint": "/b"}, 300, True)]), Outcome([Sample({"endpoint": "/a"}, 5, False)])])
    [resolved] = results[1].notices
    assert (resolved.value, resolved.annotations) == (300, {"summary": "/b is resolved at 300"})


def test_a_vanished_group_of_a_rule_without_a_metric_window_keeps_its_window(catalog):
    """A rule kind whose outcome names no window read (patterns, absence, dead letters, lag): the
    resolution of a group that is gone keeps the window the instance had, not none."""
    rule = make_rule(catalog, group_by=["endpoint"])
    results = run(rule, [Outcome([Sample({"endpoint": "/b"}, 300, True, T0 - 60_000, T0)]),
                         Outcome([Sample({"endpoint": "/a"}, 5, False)])])
    gone = [t for t in results[1].transitions if t.labels.get("endpoint") == "/b"]
    assert [(t.window_start_ms, t.window_end_ms) for t in gone] == [(T0 - 60_000, T0)]


def test_a_rule_without_data_in_the_window_it_read_names_that_window(catalog):
    """An empty window is no data, but it is the window the decision read (corrections to it count)."""
    rule = make_rule(catalog, group_by=["endpoint"])
    [nodata] = run(rule, [Outcome.nodata("no events in the window", (T0 - 60_000, T0))])[0].transitions
    assert nodata.to_state is S.NODATA and (nodata.window_start_ms, nodata.window_end_ms) == (T0 - 60_000, T0)
    [unread] = run(rule, [Outcome.nodata("no events processed yet")])[0].transitions
    assert (unread.window_start_ms, unread.window_end_ms) == (None, None)


def test_history_records_each_change_once(catalog):
    rule = make_rule(catalog, **{"for": "10s"})
    results = run(rule, [value(150), value(150), value(150), value(50), value(50)])
    changes = [(t.from_state, t.to_state) for r in results for t in r.transitions]
    assert changes == [(S.NORMAL, S.PENDING), (S.PENDING, S.FIRING), (S.FIRING, S.RESOLVED)]
    firing = results[1].transitions[0]
    assert (firing.value, firing.window_start_ms, firing.window_end_ms, firing.revision) == (150, T0 - 60_000, T0, 1)


def test_pending_is_not_notified(catalog):
    results = run(make_rule(catalog, **{"for": "1m"}), [value(150)])
    assert results[0].notices == []


def test_rule_level_no_data_instance_clears_when_groups_report(catalog):
    rule = make_rule(catalog, group_by=["endpoint"])
    results = run(rule, [Outcome.nodata("nothing yet"), Outcome([Sample({"endpoint": "/a"}, 50, False)])])
    assert results[0].instances[0].labels == {"alertname": "r"}
    assert results[1].instances == []
    assert (results[1].transitions[0].from_state, results[1].transitions[0].to_state) == (S.NODATA, S.NORMAL)


def test_labels_are_templated_too(catalog):
    rule = make_rule(catalog, group_by=["endpoint"], labels={"team": "owner-of-{{ $labels.endpoint }}"})
    [result] = run(rule, [Outcome([Sample({"endpoint": "/a"}, 150, True)])])
    assert result.instances[0].labels == {"alertname": "r", "team": "owner-of-/a", "endpoint": "/a"}


def test_a_silent_absence_group_that_leaves_the_lookback_keeps_alerting(catalog):
    # Its last event left `lookback`, so the rule's query no longer reports the group: it is
    # as silent as ever, so it must not resolve (and then never alert again).
    rule = parse_rule({"name": "quiet", "kind": "absence", "stream": "http_requests", "duration": "5m",
                       "group_by": ["region"]}, catalog)
    silent = Outcome([Sample({"region": "eu"}, 3000.0, True), Sample({"region": "us"}, 0.0, False)])
    gone = Outcome([Sample({"region": "us"}, 0.0, False)])
    results = run(rule, [silent, gone, gone])
    eu = [[i for i in r.instances if i.labels["region"] == "eu"] for r in results]
    assert [i.state for [i] in eu] == [S.FIRING, S.FIRING, S.FIRING]
    assert eu[1][0].value == 3600.0 and "no events in the last 1h" in eu[1][0].reason
    assert [(n.labels["region"], n.status) for r in results for n in r.notices] == [("eu", "firing")] * 3


def test_an_absence_rule_level_instance_still_clears_when_groups_report(catalog):
    rule = parse_rule({"name": "quiet", "kind": "absence", "stream": "http_requests", "duration": "5m",
                       "group_by": ["region"]}, catalog)
    nothing = Outcome([Sample({}, 3600.0, True)])  # nothing at all within the lookback
    results = run(rule, [nothing, Outcome([Sample({"region": "us"}, 0.0, False)])])
    assert states(results) == [S.FIRING, S.RESOLVED]
