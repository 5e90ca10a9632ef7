"""The alert store (rules, instance state, history, what notifiers delivered) on every
backend: what a restart resumes from, and the rules' ownership (file vs API)."""

from __future__ import annotations

import pytest

from store.alerts import AlertStore, RuleConflict
from tests.support.side_race import race

RULE = {"name": "slow", "kind": "threshold", "stream": "http", "threshold": 5}


def test_rules_state_and_history_survive_a_restart(store_backend):
    panes = store_backend.create()
    alerts = AlertStore(panes.side_db())
    alerts.create_rule("slow", RULE, source="api", now_ms=1_000)
    with pytest.raises(RuleConflict, match="already exists"):
        alerts.create_rule("slow", RULE, source="api", now_ms=1_001)
    version = alerts.rules_version()
    alerts.replace_rule("slow", {**RULE, "threshold": 9}, now_ms=1_000)  # same clock: still a new version
    assert alerts.rules_version() != version and alerts.rule("slow").definition["threshold"] == 9
    alerts.set_silence("slow", 5_000, now_ms=2_000)
    firing = {"fingerprint": "f1", "state": "firing", "since_ms": 1_500}
    ids = alerts.save_evaluation("slow", [firing], [{"at_ms": 1_500, "to": "firing"}, {"at_ms": 1_600, "to": "x"}],
                                 now_ms=2_000)
    assert len(ids) == 2 and ids[0] < ids[1]
    assert alerts.save_evaluation("gone", [firing], [{"at_ms": 1, "to": "firing"}], now_ms=2_000) == []
    alerts.save_notifier_memory("http://hook", "slow", {"firing": ["f1"]})
    alerts.save_notifier_memory("http://hook", "slow", {"firing": ["f1", "f2"]})
    alerts.close()

    again = AlertStore(store_backend.reopen(panes).side_db(), history_retention_ms=10_000)
    rule = again.rule("slow")
    assert (rule.source, rule.silenced_until_ms, rule.definition["threshold"]) == ("api", 5_000, 9)
    assert again.instances("slow") == [firing] and again.instances() == [firing]
    assert [h.id for h in again.history(rule="slow", newest_first=False)] == ids
    assert again.notifier_memory("http://hook") == {"slow": {"firing": ["f1", "f2"]}}
    # A later evaluation replaces the instances and prunes history past the retention.
    again.save_evaluation("slow", [], [{"at_ms": 20_000, "to": "resolved"}], now_ms=20_000)
    assert again.instances("slow") == [] and [h.data["to"] for h in again.history()] == ["resolved"]
    assert again.delete_rule("slow") and again.rules() == [] and not again.delete_rule("slow")


def test_two_writers_of_one_rule_name_at_once_the_second_gets_the_conflict(store_backend):
    """Two API replicas creating one rule name at once: the second is told the name is taken
    (RuleConflict: HTTP 409), not the database's unique violation (a 500)."""
    store = store_backend.create()
    first_db = store_backend.side_db(store)
    first, second = AlertStore(first_db), AlertStore(store_backend.side_db(store))
    created, refused = race(first_db, "INSERT INTO alert_rules",
                            lambda: first.create_rule("slow", RULE, source="api", now_ms=1),
                            lambda: second.create_rule("slow", {**RULE, "threshold": 9}, source="api", now_ms=2))
    assert created.name == "slow" and isinstance(refused, RuleConflict)
    assert second.rule("slow").definition == RULE


def test_a_rule_removed_from_the_file_ends_in_the_history_once_when_two_replicas_reload_at_once(store_backend):
    store = store_backend.create()
    setup = AlertStore(store_backend.side_db(store))
    setup.sync_file_rules({"slow": RULE}, now_ms=1)
    setup.save_evaluation("slow", [{"fingerprint": "f1", "state": "firing"}], [], now_ms=2)
    first_db = store_backend.side_db(store)
    first, second = AlertStore(first_db), AlertStore(store_backend.side_db(store))

    def reload(replica: str, alerts: AlertStore):
        return lambda: alerts.sync_file_rules({}, now_ms=3, ended=lambda instances: [
            {"ended": i["fingerprint"], "by": replica} for i in instances])

    removed = race(first_db, "INSERT INTO alert_history", reload("a", first), reload("b", second))
    assert removed == (["slow"], [])
    assert [(h.rule, h.data) for h in setup.history()] == [("slow", {"ended": "f1", "by": "a"})]


def test_rules_are_listed_in_code_point_order_whatever_the_database_s_collation(store_backend):
    alerts = AlertStore(store_backend.side_db(store_backend.create(linguistic=True)))
    for name in ["b", "B", "a", "_z", "é", "e"]:
        alerts.create_rule(name, {**RULE, "name": name}, source="api", now_ms=1)
    assert [r.name for r in alerts.rules()] == ["B", "_z", "a", "b", "e", "é"]


def test_file_rules_are_the_file_s(store_backend):
    alerts = AlertStore(store_backend.side_db())
    alerts.create_rule("mine", RULE, source="api", now_ms=1)
    alerts.sync_file_rules({"mine": RULE, "other": {**RULE, "name": "other"}}, now_ms=2)
    assert {r.name: r.source for r in alerts.rules()} == {"mine": "file", "other": "file"}
    with pytest.raises(RuleConflict, match="alerts file"):
        alerts.replace_rule("mine", RULE, now_ms=3)
    alerts.save_evaluation("mine", [{"fingerprint": "f1", "state": "firing"}], [], now_ms=3)
    removed = alerts.sync_file_rules({"other": {**RULE, "name": "other"}}, now_ms=4,
                                     ended=lambda instances: [{"ended": i["fingerprint"]} for i in instances])
    assert removed == ["mine"] and [r.name for r in alerts.rules()] == ["other"]
    # The removed rule's instances end in the history, in the same transaction as the removal.
    assert alerts.instances("mine") == []
    assert [(h.rule, h.at_ms, h.data) for h in alerts.history()] == [("mine", 4, {"ended": "f1"})]
    assert alerts.sync_file_rules({"other": {**RULE, "name": "other"}}, now_ms=5) == []
    alerts.close()


def test_the_rules_version_changes_with_every_rule_write_whatever_the_clocks(store_backend):
    # Another replica deletes b and creates c with a clock 300 ms behind: the count and the
    # newest updated_ms stay as they were, yet a cache keyed on them would miss both changes.
    panes = store_backend.create()
    alerts = AlertStore(panes.side_db())
    alerts.create_rule("a", RULE, source="api", now_ms=1_000)
    alerts.create_rule("b", RULE, source="api", now_ms=1_000)
    versions = [alerts.rules_version()]
    other = AlertStore(store_backend.side_db(panes))
    for write in (lambda: other.delete_rule("b"),
                  lambda: other.create_rule("c", RULE, source="api", now_ms=700),
                  lambda: other.replace_rule("c", RULE, now_ms=700),
                  lambda: other.set_silence("c", 9_000, now_ms=700),
                  lambda: other.sync_file_rules({"f": RULE}, now_ms=700)):
        write()
        versions.append(alerts.rules_version())
    assert versions == sorted(set(versions))  # every write moved it on, seen from either handle
    other.sync_file_rules({"f": RULE}, now_ms=800)
    assert alerts.rules_version() == versions[-1]  # an unchanged rules file changes nothing
    other.close()
    alerts.close()


def test_a_store_from_before_the_rules_version_counter_gets_one(store_backend):
    panes = store_backend.create()
    AlertStore(panes.side_db()).close()
    db = store_backend.side_db(panes)
    with db.transaction():
        db.execute("DROP TABLE alert_rules_version")  # as a store written before the counter
    db.close()
    alerts = AlertStore(store_backend.side_db(panes))
    before = alerts.rules_version()
    alerts.create_rule("a", RULE, source="api", now_ms=1)
    assert alerts.rules_version() == before + 1
    alerts.close()


def test_a_value_stored_as_infinity_before_it_was_refused_reads_back_as_null(store_backend):
    # alerts/outcome.py refuses values that are no finite number now; an instance stored before
    # (json.dumps wrote Infinity) made GET /api/v1/alerts answer 500 for good.
    panes = store_backend.create()
    alerts = AlertStore(panes.side_db())
    alerts.create_rule("spike", RULE, source="api", now_ms=1_000)
    firing = {"fingerprint": "f1", "state": "firing", "value": float("inf")}
    alerts.save_evaluation("spike", [firing], [{"at_ms": 1_500, "to": "firing", "value": float("nan")}], now_ms=2_000)
    assert alerts.instances("spike") == [{**firing, "value": None}]
    assert [h.data["value"] for h in alerts.history(rule="spike")] == [None]
    alerts.close()
