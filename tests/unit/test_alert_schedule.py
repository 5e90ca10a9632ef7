"""The evaluation schedule with a fake clock: each rule on its own interval, aligned like
Prometheus rule groups; a new or changed rule evaluated at once; a broken notifier does not
stop evaluation."""

from __future__ import annotations

import pytest

from alerts.outcome import StreamLagView
from alerts.service import AlertService
from catalog import load_catalog
from store.alerts import SqliteAlertStore
from tests.api.conftest import CONFIG
from tests.support.alerts import evaluate_every_rule

T0 = 1_800_000_000_000


class Lagging:
    """AlertData with only lag (what lag rules read), counting reads."""

    def __init__(self):
        self.reads = 0

    def lag(self):
        self.reads += 1
        return {"orders": StreamLagView("OK", "", 1.0)}


class Broken:
    def observe(self, batch):
        raise RuntimeError("receiver module exploded")

    def close(self, timeout_s=5.0):
        pass


@pytest.fixture
def service(tmp_path):
    catalog = load_catalog(CONFIG)
    store = SqliteAlertStore(tmp_path / "store.db")
    svc = AlertService(catalog, store, Lagging(), default_interval_ms=10_000, notifiers=[Broken()],
                       clock=lambda: T0 / 1000)
    yield svc
    store.close()


def test_rules_run_on_their_interval_and_at_once_when_changed(service):
    service.create({"name": "fast", "kind": "lag", "stream": "orders", "threshold": 5, "interval": "2s"})
    service.create({"name": "slow", "kind": "lag", "stream": "orders", "threshold": 5})  # default 10 s

    def due(now):
        return sorted(e.rule for e in service.evaluate_due(now))

    assert due(T0 + 500) == ["fast", "slow"]  # new rules: at once
    assert due(T0 + 1_000) == []
    assert due(T0 + 2_000) == ["fast"]  # aligned to multiples of the interval
    assert due(T0 + 9_999) == ["fast"]
    assert due(T0 + 10_000) == ["fast", "slow"]
    service.replace("slow", {"kind": "lag", "stream": "orders", "threshold": 7})
    assert due(T0 + 10_500) == ["slow"]  # changed: at once, with the new definition
    assert service.store.rule("slow").definition["threshold"] == 7


def test_a_failing_notifier_does_not_stop_evaluation(service):
    service.create({"name": "lagging", "kind": "lag", "stream": "orders", "threshold": 0})
    [result] = evaluate_every_rule(service, T0)
    assert result.instances[0].state.value == "firing"
    assert service.store.instances("lagging")[0]["state"] == "firing"


def test_pause_and_resume_as_the_leader_lease_moves(service):
    """sketchboard/leader.py: pause() when another replica leads, resume() when this one leads
    again: the notifiers reload what was delivered, every rule is due at once, and the
    evaluator thread runs again (one thread, never two)."""
    import threading
    import time

    reloads = []
    service.notifiers.append(type("Reloading", (), {"observe": lambda self, b: None, "close": lambda self: None,
                                                    "reload_memory": lambda self: reloads.append(1)})())
    service.create({"name": "r", "kind": "lag", "stream": "orders", "threshold": 5})
    assert [e.rule for e in service.evaluate_due(T0)] == ["r"]
    assert service.evaluate_due(T0 + 1) == []
    reads = service.data.reads
    service.resume(tick_s=0.05)
    deadline = time.monotonic() + 10
    while service.data.reads == reads and time.monotonic() < deadline:  # evaluated at once after resume
        time.sleep(0.01)
    assert service.data.reads > reads and reloads == [1]
    service.pause()
    assert not [t for t in threading.enumerate() if t.name == "alert-evaluator"]
    service.resume(tick_s=0.05)
    service.resume(tick_s=0.05)  # already running: no second thread
    assert len([t for t in threading.enumerate() if t.name == "alert-evaluator"]) == 1
    service.stop()


def test_a_rule_swap_by_a_replica_with_a_slower_clock_reaches_the_leader_s_cache(service, tmp_path):
    service.create({"name": "a_keep", "kind": "lag", "stream": "orders", "threshold": 5})
    service.create({"name": "b_old", "kind": "lag", "stream": "orders", "threshold": 5})
    assert sorted(e.rule for e in service.evaluate_due(T0)) == ["a_keep", "b_old"]
    other = AlertService(service.catalog, SqliteAlertStore(tmp_path / "store.db"), Lagging(),
                         clock=lambda: T0 / 1000 - 0.3)
    other.delete("b_old")  # same count and newest updated_ms afterwards: only a counter tells
    other.create({"name": "c_new", "kind": "lag", "stream": "orders", "threshold": 5})
    assert sorted(e.rule for e in service.evaluate_due(T0 + 10_000)) == ["a_keep", "c_new"]
    other.store.close()


def test_an_evaluation_that_outlives_the_lease_writes_nothing(service):
    """The evaluator asks the lease right before each save: one still running when this replica's
    lease lapsed (its renewal blocked) must not write over, or notify beside, the new leader."""
    from sketchboard.leader import lead

    seen = []
    service.notifiers[:] = [type("Seen", (), {"observe": lambda self, b: seen.append(b),
                                              "close": lambda self, timeout_s=5.0: None})()]
    service.create({"name": "lagging", "kind": "lag", "stream": "orders", "threshold": 0})
    leading = {"now": False}
    leadership = type("Lease", (), {"leading": lambda self: leading["now"]})()
    lead(leadership, alerts=service)  # as sketchboard/wiring.py attaches it
    assert service.active is not None
    [result] = service.evaluate_due(T0)
    assert result.instances[0].state.value == "firing"  # judged...
    assert service.store.instances("lagging") == [] and seen == []  # ...but neither saved nor notified
    leading["now"] = True
    [result] = service.evaluate_due(T0 + 10_000)
    assert service.store.instances("lagging")[0]["state"] == "firing" and len(seen) == 1
