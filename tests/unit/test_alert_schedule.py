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
    [result] = service.evaluate_all(T0)
    assert result.instances[0].state.value == "firing"
    assert service.store.instances("lagging")[0]["state"] == "firing"
