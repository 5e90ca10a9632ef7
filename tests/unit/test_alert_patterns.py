"""Alert rules of kind `pattern`: one alert per match of a pattern, read from the stored matches
after the rule's cursor. The rule checked against the catalog; the evaluation pure, at a fixed
time, over a fake `AlertData`; then the service over the real stores (SQLite and PostgreSQL),
where the cursor saved with the instances means a restart neither fires a match again nor
misses one, and the match's events reach the Alertmanager-format webhook body."""

from __future__ import annotations

import json

import pytest

from alerts.evaluator import evaluate
from alerts.kinds import evaluate_rule
from alerts.outcome import PatternMatch
from alerts.rules import RuleError, parse_rule
from alerts.service import AlertService
from alerts.source import StoreAlertData
from alerts.states import AlertState
from alerts.webhook import alertmanager_body
from catalog import parse_catalog
from store import BatchCommit
from store.alerts import AlertStore
from store.patterns import NewMatch, PatternCommit
from tests.support.patterns import EXAMPLES_YAML

CATALOG = parse_catalog(EXAMPLES_YAML)
T0 = 1_800_000_000_000
MIN = 60_000
RULE = {"name": "stuffing", "kind": "pattern", "pattern": "credential_stuffing", "labels": {"severity": "page"},
        "annotations": {"summary": "credential stuffing on {{ $labels.key }} ({{ $value }} events)"}}


def events(at: int, first_offset: int = 0) -> list[dict]:
    """A credential-stuffing match's events: five failures a minute apart, then the success at `at`."""
    failures = [{"step": "failures", "stream": "logins", "partition": 0, "offset": first_offset + i,
                 "time": at - (5 - i) * MIN} for i in range(5)]
    return [*failures, {"step": "success", "stream": "logins", "partition": 0, "offset": first_offset + 5,
                        "time": at}]


class FakeMatches:
    """AlertData with only a pattern's matches (what pattern rules read)."""

    def __init__(self, matches=(), fail=None):
        self.matches = list(matches)
        self.fail = fail

    def pattern_matches(self, pattern, after_id, limit):
        if self.fail:
            raise self.fail
        return [m for m in self.matches if m.id > after_id][:limit]

    def newest_match_id(self, pattern):
        return max((m.id for m in self.matches), default=None)


def match(id_: int, key: str, at: int) -> PatternMatch:
    return PatternMatch(id_, key, at, events(at), {"attempts": 5, "first_failure": at - 5 * MIN})


# -- the rule ---------------------------------------------------------------------------------------

def test_a_pattern_rule_must_name_a_declared_pattern_and_fire_at_once():
    rule = parse_rule(RULE, CATALOG)
    assert (rule.kind, rule.pattern, rule.max_matches) == ("pattern", "credential_stuffing", 100)
    with pytest.raises(RuleError, match=r"rule 'stuffing': pattern: unknown pattern 'credential_stufing';"
                                        r" defined: abandoned_checkout, credential_stuffing"):
        parse_rule({**RULE, "pattern": "credential_stufing"}, CATALOG)
    with pytest.raises(RuleError, match="for: must be 0 for a pattern rule"):
        parse_rule({**RULE, "for": "1m"}, CATALOG)
    with pytest.raises(RuleError, match="pattern: required"):
        parse_rule({"name": "x", "kind": "pattern"}, CATALOG)
    with pytest.raises(RuleError, match="max_matches"):
        parse_rule({**RULE, "max_matches": 0}, CATALOG)
    with pytest.raises(RuleError, match="defined: none"):
        parse_rule(RULE, parse_catalog("streams:\n  logins:\n    key_field: user_id\n"))


# -- one evaluation, pure ---------------------------------------------------------------------------

def test_a_new_rule_starts_after_the_newest_match():
    rule = parse_rule(RULE, CATALOG)
    outcome = evaluate_rule(rule, FakeMatches([match(7, "alice", T0)]), CATALOG, T0, cursor=None)
    assert (outcome.samples, outcome.cursor) == ([], 7)
    assert evaluate_rule(rule, FakeMatches(), CATALOG, T0, cursor=None).cursor == 0


def test_each_match_fires_once_with_its_events_then_resolves():
    rule = parse_rule(RULE, CATALOG)
    data = FakeMatches([match(3, "alice", T0 - MIN), match(4, "alice", T0), match(5, "bob", T0)])
    outcome = evaluate_rule(rule, data, CATALOG, T0, cursor=3)
    assert outcome.cursor == 5 and [s.group for s in outcome.samples] == [
        {"pattern": "credential_stuffing", "key": "alice", "match_id": "4"},
        {"pattern": "credential_stuffing", "key": "bob", "match_id": "5"}]
    first = evaluate(rule, outcome, {}, T0)
    assert first.cursor == 5
    assert [(n.status, n.labels["key"], n.labels["severity"]) for n in first.notices] == [
        ("firing", "alice", "page"), ("firing", "bob", "page")]
    alice = first.notices[0]
    assert json.loads(alice.annotations["events"]) == events(T0)
    assert json.loads(alice.annotations["measures"]) == {"attempts": 5, "first_failure": T0 - 5 * MIN}
    assert alice.annotations["summary"] == "credential stuffing on alice (6 events)"
    assert alice.annotations["decided_at"] == "2027-01-15T08:00:00.000Z"
    assert [t.to_state for t in first.transitions] == [AlertState.FIRING, AlertState.FIRING]
    assert first.transitions[0].window_start_ms == T0 - 5 * MIN  # the match's first event to its decision

    # The next evaluation reads nothing new: both resolve, still showing their events; nothing fires again.
    previous = {i.fingerprint: i for i in first.instances}
    quiet = evaluate_rule(rule, data, CATALOG, T0 + 10_000, cursor=5)
    assert (quiet.samples, quiet.cursor) == ([], 5)
    second = evaluate(rule, quiet, previous, T0 + 10_000)
    assert [n.status for n in second.notices] == ["resolved", "resolved"]
    assert [i.state for i in second.instances] == [AlertState.RESOLVED] * 2  # normal, and dropped, at the next
    assert json.loads(second.notices[0].annotations["events"]) == events(T0)


def test_keep_firing_for_holds_a_match_firing_and_a_burst_is_read_in_pages():
    rule = parse_rule({**RULE, "keep_firing_for": "1m", "max_matches": 2}, CATALOG)
    data = FakeMatches([match(i, f"user{i}", T0) for i in range(1, 6)])
    seen, cursor, previous = [], 0, {}
    for n in range(4):  # five matches, two per evaluation: all read, none twice
        now = T0 + n * 10_000
        outcome = evaluate_rule(rule, data, CATALOG, now, cursor=cursor)
        result = evaluate(rule, outcome, previous, now)
        seen += [s.group["match_id"] for s in outcome.samples]
        cursor, previous = outcome.cursor, {i.fingerprint: i for i in result.instances}
    assert seen == ["1", "2", "3", "4", "5"] and cursor == 5
    assert {i.labels["match_id"]: i.state for i in previous.values()} == {str(i): AlertState.FIRING for i in range(1, 6)}
    # Kept firing after their evaluation: each still reads as it fired (its value), not "no data".
    assert {i.annotations["summary"] for i in previous.values()} == {
        f"credential stuffing on user{i} (6 events)" for i in range(1, 6)}
    later = evaluate(rule, evaluate_rule(rule, data, CATALOG, T0 + 5 * MIN, cursor=5), previous, T0 + 5 * MIN)
    assert {i.state for i in later.instances} == {AlertState.RESOLVED} and len(later.notices) == 5
    assert {n.status for n in later.notices} == {"resolved"}


def test_a_failed_read_is_an_error_and_keeps_the_cursor():
    rule = parse_rule(RULE, CATALOG)
    outcome = evaluate_rule(rule, FakeMatches(fail=OSError("store unreadable")), CATALOG, T0, cursor=4)
    assert outcome.error == "OSError: store unreadable" and outcome.cursor is None
    result = evaluate(rule, outcome, {}, T0)
    assert [i.state for i in result.instances] == [AlertState.ERROR] and result.cursor is None


# -- the service over the real stores -------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.batches = []

    def observe(self, batch):
        self.batches.append(batch)

    def close(self, timeout_s=5.0):
        pass

    def fired(self) -> list[str]:
        return [f"{n.labels['key']}#{n.labels['match_id']}" for b in self.batches for n in b.notices
                if n.status == "firing"]


def commit_matches(panes, batch_id: int, *matches: tuple[str, int]) -> None:
    found = [NewMatch(key, at, events(at, batch_id * 10), {"attempts": 5}, dims={"client": f"{key}-laptop"})
             for key, at in matches]
    batch = BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                        patterns=[PatternCommit("credential_stuffing", T0, matches=found)])
    assert panes.commit_batch(batch, lateness_ms={}, now_ms=T0).committed


def service(panes, clock, recorder) -> AlertService:
    return AlertService(CATALOG, AlertStore(panes.side_db()), StoreAlertData(CATALOG, panes), notifiers=[recorder],
                        clock=lambda: clock[0] / 1000)


def test_matches_fire_once_across_a_restart_on_every_backend(store_backend):
    panes = store_backend.create()
    clock, recorder = [T0], Recorder()
    commit_matches(panes, 0, ("old", T0 - 10 * MIN))  # before the rule existed: not alerted on
    svc = service(panes, clock, recorder)
    svc.create(RULE)
    assert svc.evaluate_due() and recorder.fired() == []
    commit_matches(panes, 1, ("alice", T0), ("bob", T0))
    clock[0] += 10_000
    svc.evaluate_due()
    fired = recorder.fired()
    assert [f.split("#")[0] for f in fired] == ["alice", "bob"]
    [batch] = [b for b in recorder.batches if b.notices]
    body = alertmanager_body("stuffing", batch.notices, "http://sketchboard/")
    assert body["groupLabels"] == {"alertname": "stuffing"} and len(body["alerts"]) == 2
    assert body["commonLabels"] == {"alertname": "stuffing", "pattern": "credential_stuffing", "severity": "page"}
    sent = json.loads(body["alerts"][0]["annotations"]["events"])
    assert [(e["stream"], e["partition"], e["offset"], e["time"]) for e in sent] == [
        ("logins", 0, 10 + i, T0 - (5 - i) * MIN) for i in range(5)] + [("logins", 0, 15, T0)]
    # The match's dimensions (what <pattern>_matches groups it by) go with it.
    assert [json.loads(a["annotations"]["dims"]) for a in body["alerts"]] == [{"client": "alice-laptop"},
                                                                             {"client": "bob-laptop"}]
    svc.store.close()

    # A restart (the API and the store reopened) reads on from the saved cursor: the two fired
    # matches are not fired again, and one committed while the API was down is not missed.
    panes = store_backend.reopen(panes)
    commit_matches(panes, 2, ("carol", T0 + MIN))
    again = Recorder()
    svc = service(panes, clock, again)
    clock[0] += 10_000
    svc.evaluate_due()
    assert [f.split("#")[0] for f in again.fired()] == ["carol"]
    assert {n.labels["key"] for b in again.batches for n in b.notices if n.status == "resolved"} == {"alice", "bob"}
    assert svc.store.cursor("stuffing") == int(again.fired()[0].split("#")[1])
    svc.delete("stuffing")
    assert svc.store.cursor("stuffing") is None  # a rule created again under the name starts afresh
    svc.store.close()


# -- late matches and retractions (docs/patterns.md, "Late events") ------------------------------

def test_a_late_match_fires_and_a_retraction_resolves_its_alert_at_once_and_keeps_its_events():
    rule = parse_rule({**RULE, "keep_firing_for": "10m"}, CATALOG)
    late = PatternMatch(6, "alice", T0, events(T0), {"attempts": 5}, late=True)
    first = evaluate(rule, evaluate_rule(rule, FakeMatches([late]), CATALOG, T0, cursor=5), {}, T0)
    [fired] = first.notices
    assert (fired.status, fired.labels["match_id"], fired.annotations["late"]) == ("firing", "6", "true")
    # A late event broke it: the retraction (match 9) resolves it now, kept_firing_for aside, not deleted.
    retraction = PatternMatch(9, "alice", T0, events(T0), {"attempts": 5}, late=True, retracts=6)
    previous = {i.fingerprint: i for i in first.instances}
    outcome = evaluate_rule(rule, FakeMatches([late, retraction]), CATALOG, T0 + 10_000, cursor=6)
    assert outcome.cursor == 9 and [(s.group["match_id"], s.condition) for s in outcome.samples] == [("6", False)]
    second = evaluate(rule, outcome, previous, T0 + 10_000)
    [resolved] = second.notices
    assert (resolved.status, resolved.labels["match_id"]) == ("resolved", "6")
    assert resolved.annotations["retracted_by"] == "9" and json.loads(resolved.annotations["events"]) == events(T0)
    assert [i.state for i in second.instances] == [AlertState.RESOLVED]
    assert [(t.from_state, t.to_state) for t in second.transitions] == [(AlertState.FIRING, AlertState.RESOLVED)]
    # A match and its retraction read in one evaluation: it never fires.
    both = evaluate(rule, evaluate_rule(rule, FakeMatches([late, retraction]), CATALOG, T0, cursor=5), {}, T0)
    assert both.notices == [] and both.instances == []


def test_a_stored_retraction_resolves_the_late_matchs_alert_on_every_backend(store_backend):
    panes = store_backend.create()
    clock, recorder = [T0], Recorder()
    svc = service(panes, clock, recorder)
    svc.create({**RULE, "keep_firing_for": "10m"})
    svc.evaluate_due()
    late = NewMatch("alice", T0, events(T0), {"attempts": 5}, late=True)
    batch = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0,
                        patterns=[PatternCommit("credential_stuffing", T0, matches=[late])])
    assert panes.commit_batch(batch, lateness_ms={}, now_ms=T0).committed
    clock[0] += 10_000
    svc.evaluate_due()
    [fired] = [n for b in recorder.batches for n in b.notices if n.status == "firing"]
    assert fired.annotations["late"] == "true"
    retraction = NewMatch("alice", T0, events(T0), {"attempts": 5}, late=True, retraction=True)
    batch = BatchCommit(pipeline="main", batch_id=1, partials=[], events_read=0,
                        patterns=[PatternCommit("credential_stuffing", T0, matches=[retraction])])
    assert panes.commit_batch(batch, lateness_ms={}, now_ms=T0).committed
    clock[0] += 10_000  # well inside keep_firing_for
    svc.evaluate_due()
    resolved = [n for b in recorder.batches for n in b.notices if n.status == "resolved"]
    assert [(n.labels["match_id"], n.annotations["retracted_by"]) for n in resolved] == [
        (fired.labels["match_id"], str(int(fired.labels["match_id"]) + 1))]
    svc.store.close()
