"""Webhook notifier: the grouping/dedup decisions as pure functions with a fake clock, then
the notifier against a real HTTP receiver on loopback (tests/receiver.py), with the backoff
sleep injected so that retries cost no time."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import replace
from datetime import datetime

import pytest

from alerts.dedup import GroupMemory, Plan, Why, coalesce, plan, with_undelivered
from alerts.rules import parse_rule
from alerts.states import AlertState, Notice, RuleNotices
from alerts.webhook import NOT_ENDED, WebhookNotifier, rfc3339
from tests.receiver import Receiver

RULE = "search_p99"
HOUR = 3600.0
REPEAT = 4 * HOUR


def firing(fp: str, *, starts_at_ms: int = 1_000, value: float = 300.0) -> Notice:
    return Notice(rule=RULE, fingerprint=fp, status="firing", state=AlertState.FIRING,
                  labels={"alertname": RULE, "severity": "page", "endpoint": f"/{fp}"},
                  annotations={"summary": f"p99 of /{fp} is {value} ms"},
                  starts_at_ms=starts_at_ms, value=value)


def resolved(fp: str, *, ends_at_ms: int = 9_000) -> Notice:
    n = firing(fp)
    return Notice(rule=RULE, fingerprint=fp, status="resolved", state=AlertState.RESOLVED, labels=n.labels,
                  annotations=n.annotations, starts_at_ms=n.starts_at_ms, ends_at_ms=ends_at_ms, value=120.0)


def batch(*notices: Notice, at_ms: int = 10_000, silenced: bool = False, rule: str = RULE) -> RuleNotices:
    return RuleNotices(rule=rule, at_ms=at_ms, notices=list(notices), silenced=silenced)


class Group:
    """The notifier's memory of one rule, moved forward as if every planned send succeeded."""

    def __init__(self) -> None:
        self.memory: GroupMemory | None = None

    def evaluate(self, b: RuleNotices, now: float) -> Plan:
        p = plan(b, self.memory, now, REPEAT)
        if p.send:
            self.memory = p.remember
        return p


def sent(p: Plan) -> list[tuple[str, str]]:
    return [(n.fingerprint, n.status) for n in p.alerts]


# -- pure decisions ------------------------------------------------------------------------


def test_first_firing_is_sent():
    p = Group().evaluate(batch(firing("a")), now=0)
    assert p.send and p.why is Why.NEW
    assert sent(p) == [("a", "firing")]


def test_identical_repeat_is_deduplicated_until_repeat_interval():
    g = Group()
    g.evaluate(batch(firing("a")), now=0)
    for now in (10, 60, REPEAT - 1):
        p = g.evaluate(batch(firing("a", value=999.0)), now=now)  # a new value alone is no change
        assert not p.send and p.why is Why.DUPLICATE
    p = g.evaluate(batch(firing("a", value=999.0)), now=REPEAT)
    assert p.why is Why.REPEAT and sent(p) == [("a", "firing")]
    assert p.alerts[0].value == 999.0  # a repeat carries the current value
    assert not g.evaluate(batch(firing("a")), now=REPEAT + 10).send  # the interval restarts at the repeat


def test_a_new_instance_resends_the_whole_group():
    g = Group()
    g.evaluate(batch(firing("a")), now=0)
    p = g.evaluate(batch(firing("a"), firing("b", starts_at_ms=5_000)), now=10)
    assert p.why is Why.NEW
    assert sent(p) == [("a", "firing"), ("b", "firing")]


def test_resolved_is_sent_once_then_forgotten():
    g = Group()
    g.evaluate(batch(firing("a"), firing("b")), now=0)
    p = g.evaluate(batch(firing("a"), resolved("b")), now=10)
    assert p.why is Why.RESOLVED
    assert sent(p) == [("a", "firing"), ("b", "resolved")]
    assert p.alerts[1].ends_at_ms == 9_000
    assert not g.evaluate(batch(firing("a")), now=20).send  # b is gone: no change
    assert not g.evaluate(batch(firing("a"), resolved("b")), now=30).send  # b forgotten

    p = g.evaluate(batch(resolved("a")), now=40)
    assert sent(p) == [("a", "resolved")]
    assert g.memory is None  # nothing fires: the group is forgotten
    assert g.evaluate(batch(), now=50).why is Why.QUIET


def test_resolved_of_a_never_sent_firing_is_not_sent():
    g = Group()
    p = g.evaluate(batch(resolved("a")), now=0)
    assert not p.send and p.why is Why.QUIET
    g.evaluate(batch(firing("b")), now=10)
    p = g.evaluate(batch(firing("b"), resolved("a")), now=20)
    assert not p.send and p.why is Why.DUPLICATE


def test_silenced_sends_nothing_and_remembers_nothing():
    g = Group()
    for now in (0, 10, REPEAT * 2):
        p = g.evaluate(batch(firing("a"), silenced=True), now=now)
        assert not p.send and p.why is Why.SILENCED
    assert g.memory is None
    p = g.evaluate(batch(firing("a")), now=REPEAT * 2 + 10)  # the silence ended, still firing
    assert p.why is Why.NEW and sent(p) == [("a", "firing")]


def test_a_silence_keeps_what_was_sent_before_it():
    g = Group()
    g.evaluate(batch(firing("a"), firing("b")), now=0)
    before = g.memory
    assert not g.evaluate(batch(firing("a"), resolved("b"), silenced=True), now=10).send
    assert g.memory is before
    assert not g.evaluate(batch(firing("a"), silenced=True), now=20).send
    # The silence ends: a still fires (already sent: no repeat yet); b resolved during the
    # silence and the receiver still has it firing, so it is sent as resolved now.
    p = g.evaluate(batch(firing("a"), at_ms=30_000), now=30)
    assert p.why is Why.RESOLVED
    assert sent(p) == [("a", "firing"), ("b", "resolved")]
    assert p.alerts[1].ends_at_ms == 30_000


def test_an_undelivered_plan_is_planned_again():
    first = plan(batch(firing("a")), None, 0, REPEAT)
    # The send failed, so the caller kept its memory (None): the next evaluation sends again.
    again = plan(batch(firing("a")), None, 10, REPEAT)
    assert first.send and again.send and sent(first) == sent(again)


def test_coalesce_keeps_the_newer_batch_and_older_resolutions():
    older = batch(resolved("a"), firing("b"), firing("c"), at_ms=10_000)
    newer = batch(firing("b"), resolved("c", ends_at_ms=19_000), at_ms=20_000)
    merged = coalesce(older, newer)
    assert merged.at_ms == 20_000
    assert [(n.fingerprint, n.status, n.ends_at_ms) for n in merged.notices] == [
        ("b", "firing", None), ("c", "resolved", 19_000), ("a", "resolved", 9_000)]
    refired = coalesce(batch(resolved("a")), batch(firing("a")))
    assert [(n.fingerprint, n.status) for n in refired.notices] == [("a", "firing")]


# -- the message and the notifier over real HTTP ---------------------------------------------

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_a_new_incident_after_a_resolution_given_up_on_is_resolved_first():
    """The resolution of a (ended at 4 s) was given up on and a fires again (startsAt 5 s): the
    receiver is told the old incident ended, with its own end, then that the new one fires. A
    startsAt that moves without a resolution (a nodata spell that turned into firing) is no new
    incident: the group is left as it is."""
    g = Group()
    g.evaluate(batch(firing("a"), firing("b")), now=0)
    given_up = {"a": resolved("a", ends_at_ms=4_000)}
    parts = with_undelivered(batch(firing("a", starts_at_ms=5_000), firing("b")), g.memory, given_up)
    first = g.evaluate(parts[0], now=10)
    assert sent(first) == [("b", "firing"), ("a", "resolved")] and first.alerts[1].ends_at_ms == 4_000
    second = g.evaluate(parts[1], now=10)
    assert second.why is Why.NEW and sent(second) == [("b", "firing"), ("a", "firing")]
    moved = batch(firing("a", starts_at_ms=9_000), firing("b"), at_ms=20_000)
    assert with_undelivered(moved, g.memory, {}) == [moved]
    assert g.evaluate(moved, now=20).why is Why.DUPLICATE


class Sleeps(list):
    """The backoff sleep: records each delay instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def notifier(url: str, **kwargs) -> WebhookNotifier:
    kwargs.setdefault("sleep", Sleeps())
    return WebhookNotifier(url, **{"timeout_s": 2.0, "external_url": "http://sketchboard.test:8000/", **kwargs})


def ms_of(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def test_rfc3339_is_utc_with_exact_milliseconds():
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_714_564_800_250) == "2024-05-01T12:00:00.250Z"


def test_the_body_is_alertmanager_v4_json():
    starts = 1_714_564_800_250
    with Receiver() as rx:
        n = notifier(rx.url)
        n.observe(batch(firing("a", starts_at_ms=starts), firing("b", starts_at_ms=starts + 1)))
        n.close()
        n2 = notifier(rx.url)  # a fresh memory that only knows "a" can resolve it
        n2.observe(batch(firing("a", starts_at_ms=starts)))
        rx.wait_for(lambda reqs: len(reqs) == 2)  # (queued together, the two would coalesce to nothing)
        n2.observe(batch(resolved("a", ends_at_ms=starts + 60_000)))
        n2.close()
        got = rx.wait_for(lambda reqs: len(reqs) == 3)

    assert got[0].headers["Content-Type"] == "application/json"
    body = json.loads(got[0].raw)  # strict JSON: no NaN
    assert set(body) == {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
                         "commonLabels", "commonAnnotations", "externalURL", "alerts"}
    assert body["version"] == "4" and body["status"] == "firing" and body["truncatedAlerts"] == 0
    assert body["groupKey"] == '{}:{alertname="search_p99"}'
    assert body["groupLabels"] == {"alertname": RULE}
    assert body["commonLabels"] == {"alertname": RULE, "severity": "page"}  # endpoint differs
    assert body["commonAnnotations"] == {}
    assert body["externalURL"] == "http://sketchboard.test:8000/"
    a, b = body["alerts"]
    assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint", "value"}
    assert (a["fingerprint"], a["status"], a["value"]) == ("a", "firing", 300.0)
    assert a["labels"]["endpoint"] == "/a" and a["annotations"]["summary"] == "p99 of /a is 300.0 ms"
    assert a["generatorURL"] == "http://sketchboard.test:8000/api/v1/alerts?rule=search_p99"
    assert RFC3339_UTC.match(a["startsAt"]) and ms_of(a["startsAt"]) == starts
    assert ms_of(b["startsAt"]) == starts + 1
    assert a["endsAt"] == NOT_ENDED and RFC3339_UTC.match(NOT_ENDED)

    done = got[2].body
    assert done["status"] == "resolved" and [x["status"] for x in done["alerts"]] == ["resolved"]
    ended = done["alerts"][0]["endsAt"]
    assert RFC3339_UTC.match(ended) and ms_of(ended) == starts + 60_000


@pytest.mark.parametrize("status", [503, 500, 429])
def test_retryable_status_is_retried_with_growing_backoff(status):
    sleeps = Sleeps()
    with Receiver(fail_first=2, fail_status=status) as rx:
        n = notifier(rx.url, sleep=sleeps, backoff_s=0.5, max_backoff_s=8.0)
        n.observe(batch(firing("a")))
        n.close()
        got = rx.requests
    assert [r.status for r in got] == [status, status, 200]
    assert got[0].raw == got[2].raw  # the same message each attempt
    assert sleeps == [0.5, 1.0]
    stats = n.stats()
    assert (stats["sent"], stats["retried"], stats["failed"]) == (1, 2, 0)
    assert stats["last_error"] == f"HTTP {status}"


def test_backoff_is_capped_and_a_give_up_is_counted_and_tried_again_later(caplog):
    sleeps = Sleeps()
    with Receiver(fail_first=5) as rx:
        n = notifier(rx.url, sleep=sleeps, max_attempts=5, backoff_s=1.0, max_backoff_s=3.0)
        n.observe(batch(firing("a")))
        rx.wait_for(lambda reqs: len(reqs) == 5)
        assert sleeps == [1.0, 2.0, 3.0, 3.0]
        n.observe(batch(firing("a")))  # nothing was remembered as sent: the next evaluation sends
        n.close()
        assert [r.status for r in rx.requests] == [503] * 5 + [200]
    stats = n.stats()
    assert (stats["sent"], stats["failed"], stats["retried"]) == (1, 1, 4)
    assert "gave up on rule 'search_p99' after 5 attempt(s): HTTP 503" in caplog.text


def test_other_4xx_is_not_retried():
    sleeps = Sleeps()
    with Receiver(fail_first=1, fail_status=400) as rx:
        n = notifier(rx.url, sleep=sleeps)
        n.observe(batch(firing("a")))
        n.close()
        assert [r.status for r in rx.requests] == [400]
    assert sleeps == []
    assert (n.stats()["failed"], n.stats()["retried"], n.stats()["last_error"]) == (1, 0, "HTTP 400")


def test_connection_refused_is_retried_then_given_up():
    with Receiver() as rx:
        url = rx.url  # a port that was free a moment ago and is closed now
    sleeps = Sleeps()
    n = notifier(url, sleep=sleeps, max_attempts=3)
    n.observe(batch(firing("a")))
    n.close()
    assert sleeps == [0.5, 1.0]
    stats = n.stats()
    assert (stats["sent"], stats["failed"], stats["retried"]) == (0, 1, 2)
    assert "ConnectError" in stats["last_error"]


def test_a_receiver_slower_than_the_timeout_is_a_failed_attempt():
    with Receiver(delay_s=2.0, delay_first=1) as rx:
        n = notifier(rx.url, timeout_s=0.4)
        n.observe(batch(firing("a")))
        n.close()
        assert [r.delay_s for r in rx.requests] == [2.0, 0.0]  # the first timed out, the retry went through
    stats = n.stats()
    assert (stats["sent"], stats["retried"], stats["failed"]) == (1, 1, 0)
    assert "timed out after 0.4 s" in stats["last_error"]

    with Receiver(delay_s=2.0) as rx:
        n = notifier(rx.url, timeout_s=0.2, max_attempts=2)
        started = time.monotonic()
        n.observe(batch(firing("a")))
        n.close()
        assert time.monotonic() - started < 1.5  # two attempts of 0.2 s each, not the receiver's 2 s
        assert len(rx.requests) == 2
    assert (n.stats()["sent"], n.stats()["failed"]) == (0, 1)


def test_many_instances_of_one_rule_in_one_evaluation_are_one_post():
    with Receiver() as rx:
        n = notifier(rx.url)
        n.observe(batch(*(firing(f"fp{i:03d}", starts_at_ms=1_000 + i) for i in range(200))))
        n.close()
        assert len(rx.requests) == 1
        assert [a["fingerprint"] for a in rx.delivered[0]["alerts"]] == [f"fp{i:03d}" for i in range(200)]


def test_evaluations_queued_behind_a_retrying_send_send_no_stale_duplicates():
    with Receiver(fail_first=2) as rx:
        n: WebhookNotifier

        def sleep_while_evaluations_arrive(seconds: float) -> None:
            # The scheduler keeps evaluating while the worker backs off: the same firing
            # instance again and again. Once the retry succeeds nothing new is left to send.
            n.observe(batch(firing("a", value=301.0)))
            n.observe(batch(firing("a", value=302.0)))

        n = notifier(rx.url, sleep=sleep_while_evaluations_arrive)
        n.observe(batch(firing("a")))
        rx.wait_for(lambda reqs: len(reqs) == 3)  # (close() would refuse evaluations arriving after it)
        n.close()
        assert [r.status for r in rx.requests] == [503, 503, 200]
    stats = n.stats()
    assert (stats["sent"], stats["deduplicated"], stats["dropped"]) == (1, 1, 0)


def test_a_change_queued_behind_a_retrying_send_is_sent_once_after_it():
    with Receiver(fail_first=1) as rx:
        n: WebhookNotifier

        def sleep_while_b_starts_firing(seconds: float) -> None:
            n.observe(batch(firing("a"), firing("b")))
            n.observe(batch(firing("a"), firing("b"), firing("c")))  # the newest wins

        n = notifier(rx.url, sleep=sleep_while_b_starts_firing)
        n.observe(batch(firing("a")))
        rx.wait_for(lambda reqs: len(reqs) == 2)
        n.close()
        fingerprints = [[a["fingerprint"] for a in body["alerts"]] for body in rx.delivered]
    assert fingerprints == [["a"], ["a", "b", "c"]]


def test_observe_does_not_wait_and_a_full_queue_drops():
    backing_off, release = threading.Event(), threading.Event()

    def backoff(seconds: float) -> None:
        backing_off.set()
        release.wait(5)

    with Receiver(fail_first=1) as rx:
        n = notifier(rx.url, queue_size=2, sleep=backoff)
        n.observe(batch(firing("a"), rule="r0"))
        assert backing_off.wait(5)  # the worker is busy with r0 until released
        started = time.monotonic()
        for i in (1, 2, 3):
            n.observe(batch(firing("a"), rule=f"r{i}"))
        n.observe(batch(firing("a"), firing("b"), rule="r1"))  # a rule already queued is updated, not dropped
        assert time.monotonic() - started < 0.1
        assert n.stats()["dropped"] == 1 and n.stats()["queued"] == 2
        release.set()
        n.close()
        assert [body["groupLabels"]["alertname"] for body in rx.delivered] == ["r0", "r1", "r2"]
        assert [a["fingerprint"] for a in rx.delivered[1]["alerts"]] == ["a", "b"]


def test_close_flushes_the_queue():
    with Receiver(delay_s=0.05) as rx:
        n = notifier(rx.url)
        for i in range(5):
            n.observe(batch(firing("a"), rule=f"rule{i}"))
        n.close()
        assert len(rx.delivered) == 5  # no waiting: close() returned after the last answer
        n.observe(batch(firing("a"), rule="late"))
    assert n.stats()["dropped"] == 1 and n.stats()["sent"] == 5


def test_close_gives_up_after_its_timeout():
    release = threading.Event()
    with Receiver(fail_first=10) as rx:
        n = notifier(rx.url, sleep=lambda s: release.wait(5))
        n.observe(batch(firing("a"), rule="r0"))
        n.observe(batch(firing("a"), rule="r1"))
        rx.wait_for(lambda reqs: len(reqs) == 1)
        started = time.monotonic()
        n.close(timeout_s=0.2)
        assert time.monotonic() - started < 1.0
        release.set()
        # The worker wakes, sees that close() gave up on it, and sends nothing more.
        deadline = time.monotonic() + 5
        while n.stats()["failed"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert n.stats()["failed"] == 1
        assert len(rx.requests) == 1


def test_what_was_delivered_survives_a_restart_with_a_memory_store(tmp_path):
    """Firing delivered, the API restarts, the alert resolves: the receiver gets the resolution
    (and no second firing). Without the store the new process would know of nothing delivered."""
    from store.alerts import SqliteAlertStore

    store = SqliteAlertStore(tmp_path / "store.db")
    with Receiver() as rx:
        before = notifier(rx.url, memory_store=store)
        before.observe(batch(firing("a")))
        before.close()
        after = notifier(rx.url, memory_store=SqliteAlertStore(tmp_path / "store.db"))
        after.observe(batch(firing("a"), at_ms=20_000))  # still firing: nothing new to say
        after.observe(batch(rule="other"))
        after.observe(batch(resolved("a"), at_ms=30_000))
        after.close()
        assert [b["status"] for b in rx.delivered] == ["firing", "resolved"]
        forgetful = notifier(rx.url)
        forgetful.observe(batch(resolved("a")))
        forgetful.close()
        assert len(rx.delivered) == 2
    assert store.notifier_memory(rx.url) == {}  # resolved: forgotten in the store too


def test_a_file_rule_removed_while_the_api_was_down_is_resolved_and_forgotten(tmp_path):
    """The rules file lost a firing rule across a restart: the new process never saw it fire,
    but the webhook's memory says the receiver knows it as firing, so it gets the resolution,
    the memory is dropped and the history says why."""
    from alerts.outcome import StreamLagView
    from alerts.service import AlertService
    from catalog import load_catalog
    from store.alerts import SqliteAlertStore
    from tests.api.conftest import CONFIG

    class Stalled:
        def lag(self):
            return {"orders": StreamLagView("STALL", "stalled", 600.0)}

    catalog, clock = load_catalog(CONFIG), [1_800_000_000.0]
    lagging = parse_rule({"name": "lagging", "kind": "lag", "stream": "orders", "threshold": 60}, catalog)
    with Receiver() as rx:
        for rules in ({"lagging": lagging}, {}):  # the second process starts without the rule
            store = SqliteAlertStore(tmp_path / "store.db")
            hook = notifier(rx.url, memory_store=store, clock=lambda: clock[0])
            service = AlertService(catalog, store, Stalled(), notifiers=[hook], clock=lambda: clock[0])
            removed = service.sync_file(rules)
            clock[0] += 10
            service.evaluate_due()
            service.stop()
            store.close()
        assert removed == ["lagging"]
        assert [b["status"] for b in rx.delivered] == ["firing", "resolved"]
    store = SqliteAlertStore(tmp_path / "store.db")
    assert store.notifier_memory(rx.url) == {}
    assert [(h.data["to_state"], h.data["reason"]) for h in store.history()][0] == ("normal", "rule deleted")
    store.close()


def test_only_the_lease_holder_notifies_and_a_new_holder_continues_from_the_store(tmp_path):
    """Two replicas' notifiers on one store (sketchboard/leader.py): the standby one sends nothing;
    when it takes the lease it reads what the other delivered, so a still-firing alert is not
    sent again, and its resolution is."""
    from store.alerts import SqliteAlertStore

    leader = {"name": "a"}
    with Receiver() as rx:
        a = notifier(rx.url, memory_store=SqliteAlertStore(tmp_path / "store.db"),
                     active=lambda: leader["name"] == "a")
        b = notifier(rx.url, memory_store=SqliteAlertStore(tmp_path / "store.db"),
                     active=lambda: leader["name"] == "b")  # started before anything was delivered
        a.observe(batch(firing("x")))
        b.observe(batch(firing("x")))  # a follower's evaluation (e.g. a rule deleted through it): dropped
        rx.wait_for(lambda reqs: len(reqs) == 1, 5)
        a.close()
        assert b.stats()["standby"] == 1
        leader["name"] = "b"  # a died; b holds the lease now
        b.reload_memory()
        b.observe(batch(firing("x"), at_ms=20_000))
        b.observe(batch(resolved("x"), at_ms=30_000))
        b.close()
        assert [body["status"] for body in rx.delivered] == ["firing", "resolved"]
        assert b.stats()["sent"] == 1  # the resolution only


class Stalled:
    """Alert data where the demo's orders stream lags 600 s: a lag rule fires."""

    def lag(self):
        from alerts.outcome import StreamLagView

        return {"orders": StreamLagView("STALL", "stalled", 600.0)}


LAGGING = {"name": "lagging", "kind": "lag", "stream": "orders", "threshold": 60}


def test_a_deleted_rules_resolution_given_up_on_is_sent_again(store_backend):
    """A rule delivered as firing is deleted while the receiver is down: the resolution is given
    up, but the next evaluation (of other rules) sends it again, since the notifier still
    remembers the rule as firing at the receiver and the rule is gone; and so does the next
    process, for a file rule whose removal's resolution was given up at start."""
    from alerts.service import AlertService
    from catalog import load_catalog
    from store.alerts import AlertStore
    from tests.api.conftest import CONFIG

    catalog, clock = load_catalog(CONFIG), [1_800_000_000.0]
    panes = store_backend.create()

    def service(url: str):
        store = AlertStore(store_backend.reopen(panes).side_db())
        hook = notifier(url, memory_store=store, max_attempts=2, clock=lambda: clock[0])
        return store, hook, AlertService(catalog, store, Stalled(), notifiers=[hook], clock=lambda: clock[0])

    with Receiver() as rx:
        store, hook, svc = service(rx.url)
        svc.create(LAGGING)
        svc.evaluate_due()
        rx.wait_for(lambda reqs: len(reqs) == 1)
        rx.fail_next(2, 503)
        assert svc.delete("lagging")
        rx.wait_for(lambda reqs: len(reqs) == 3)
        deadline = time.monotonic() + 5
        while hook.stats()["failed"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        clock[0] += 10
        svc.evaluate_due()  # no rule left to evaluate: the resolution goes out all the same
        rx.wait_for(lambda reqs: len(reqs) == 4)
        svc.stop()
        assert [b["status"] for b in rx.delivered] == ["firing", "resolved"]
        assert store.notifier_memory(rx.url) == {}

        # A file rule, removed across a restart while the receiver is down: a later start sends it.
        for rules, failing in (({"lagging": parse_rule(LAGGING, catalog)}, 0), ({}, 2), ({}, 0)):
            rx.fail_next(failing, 503)
            store, hook, svc = service(rx.url)
            svc.sync_file(rules)
            clock[0] += 10
            svc.evaluate_due()
            svc.stop()
        assert [b["status"] for b in rx.delivered] == ["firing", "resolved", "firing", "resolved"]
        assert store.notifier_memory(rx.url) == {}


def test_the_api_s_shutdown_flushes_the_queue_before_handing_the_lease_over(store_backend):
    """sketchboard/cli.py cmd_api ends with leader.stand_down(): a rule deleted just before the
    shutdown gets its resolution, though a slow answer keeps it queued until the shutdown began
    (the lease released first, the notifier would count it as standby); then the lease is free."""
    from alerts.service import AlertService
    from catalog import load_catalog
    from sketchboard.leader import lead, stand_down
    from store.alerts import AlertStore
    from store.lease import Leadership, LeaseStore
    from tests.api.conftest import CONFIG

    catalog, panes = load_catalog(CONFIG), store_backend.create()
    store = AlertStore(panes.side_db())
    leadership = Leadership(LeaseStore(panes.side_db()), "api-leader", "a", ttl_s=2.0)
    with Receiver() as rx:
        hook = notifier(rx.url, memory_store=store, active=leadership.leading)
        svc = AlertService(catalog, store, Stalled(), notifiers=[hook])
        lead(leadership, alerts=svc)
        leadership.start()
        for name in ("a", "b"):
            svc.create({**LAGGING, "name": name})
        rx.wait_for(lambda reqs: len(reqs) == 2)
        rx.delay_next(0.5, n=1)
        svc.delete("a")  # in flight, slowly
        svc.delete("b")  # queued behind it
        rx.wait_for(lambda reqs: len(reqs) == 3)
        stand_down(leadership, alerts=svc)
        assert sorted((b["groupLabels"]["alertname"], b["status"]) for b in rx.delivered) == [
            ("a", "firing"), ("a", "resolved"), ("b", "firing"), ("b", "resolved")]
        assert hook.stats()["standby"] == 0
    assert not leadership.leading() and leadership.holder().record.holder is None  # handed over at once


def _leading_service(panes, rx_url: str, *, ttl_s: float, close_timeout_s: float, names, replica: str = "a"):
    """An alert service on store `panes` whose webhook sends while `leadership` leads, with rules
    `names` firing and delivered as such: (leadership, service, notifier, alert store)."""
    from alerts.service import AlertService
    from catalog import load_catalog
    from sketchboard.leader import lead
    from store.alerts import AlertStore
    from store.lease import Leadership, LeaseStore
    from tests.api.conftest import CONFIG

    store = AlertStore(panes.side_db())
    leadership = Leadership(LeaseStore(panes.side_db()), "api-leader", replica, ttl_s=ttl_s)
    hook = notifier(rx_url, memory_store=store, active=leadership.leading, close_timeout_s=close_timeout_s)
    svc = AlertService(load_catalog(CONFIG), store, Stalled(), notifiers=[hook])
    lead(leadership, alerts=svc)
    leadership.start()
    for name in names:
        svc.create({**LAGGING, "name": name})
    return leadership, svc, hook, store


def test_the_shutdown_flush_keeps_the_lease_past_its_ttl_for_a_slow_receiver(store_backend):
    """A receiver that takes 0.4 s per answer, five resolutions queued at shutdown: the flush takes
    about 2 s, five times the lease's ttl (0.4 s). The lease is renewed while it flushes (bounded by
    the shutdown timeout, 10 s here), so every resolution is delivered and remembered; none is
    counted standby (cut at the ttl, the notifier took itself for a replica that no longer leads),
    and then the lease is handed over at once."""
    from sketchboard.leader import stand_down

    names = [f"r{i}" for i in range(5)]
    with Receiver() as rx:
        leadership, svc, hook, store = _leading_service(store_backend.create(), rx.url, ttl_s=0.4,
                                                        close_timeout_s=10.0, names=names)
        rx.wait_for(lambda reqs: len(reqs) == len(names))
        rx.delay_next(0.4)
        for name in names:
            svc.delete(name)  # queued behind one another
        rx.wait_for(lambda reqs: len(reqs) == len(names) + 1)
        stand_down(leadership, alerts=svc)
        resolved = sorted(b["groupLabels"]["alertname"] for b in rx.delivered if b["status"] == "resolved")
        assert resolved == names
        assert hook.stats()["standby"] == 0 and store.notifier_memory(rx.url) == {}
    assert not leadership.leading() and leadership.holder().record.holder is None  # handed over at once


def test_what_the_shutdown_timeout_leaves_unsent_is_the_next_leaders_to_send(store_backend):
    """The flush is bounded by the shutdown timeout (0.6 s here), not held for a receiver that takes
    0.5 s an answer: the shutdown ends on time, and what was not delivered is not remembered as
    delivered, so the next leader (another process on the same store) sends it."""
    from sketchboard.leader import stand_down

    names = [f"r{i}" for i in range(5)]
    with Receiver() as rx:
        panes = store_backend.create()
        leadership, svc, hook, store = _leading_service(panes, rx.url, ttl_s=2.0, close_timeout_s=0.6, names=names)
        rx.wait_for(lambda reqs: len(reqs) == len(names))
        rx.delay_next(0.5)
        for name in names:
            svc.delete(name)
        started = time.monotonic()
        stand_down(leadership, alerts=svc)
        assert time.monotonic() - started < 3.0
        assert leadership.holder().record.holder is None
        sent = {b["groupLabels"]["alertname"] for b in rx.delivered if b["status"] == "resolved"}
        left = set(store.notifier_memory(rx.url))
        assert left and left | sent >= set(names)  # some not delivered, and remembered as firing still
        rx.delay_next(0.0)
        # The next leader, on the same store: it resolves what the receiver still knows as firing.
        nxt_leadership, nxt_svc, _, _ = _leading_service(panes, rx.url, ttl_s=2.0, close_timeout_s=5.0, names=[],
                                                          replica="b")
        try:
            rx.wait_for(lambda reqs: {b["groupLabels"]["alertname"] for b in rx.delivered
                                      if b and b["status"] == "resolved"} >= set(names), timeout=10)
        finally:
            stand_down(nxt_leadership, alerts=nxt_svc)


@pytest.mark.parametrize("then_fires_again", [False, True])
def test_a_resolution_given_up_on_keeps_its_end_and_comes_before_a_new_incident(then_fires_again):
    """The resolution at 20 s is given up on. The next evaluation sends it with its own end (20 s,
    not the evaluation's 30 s); and if the instance fires again by then (a new startsAt), the
    resolution goes first and the new incident after it, not taken for the old one still firing."""
    with Receiver() as rx:
        n = notifier(rx.url, max_attempts=2)
        n.observe(batch(firing("a", starts_at_ms=10_000), at_ms=10_000))
        rx.wait_for(lambda reqs: len(reqs) == 1)
        rx.fail_next(2, 503)
        n.observe(batch(replace(resolved("a", ends_at_ms=20_000), starts_at_ms=10_000), at_ms=20_000))
        rx.wait_for(lambda reqs: len(reqs) == 3)
        n.observe(batch(*([firing("a", starts_at_ms=30_000)] if then_fires_again else []), at_ms=30_000))
        n.close()
        got = [[(a["status"], ms_of(a["startsAt"]), a["endsAt"]) for a in body["alerts"]] for body in rx.delivered]
    expected = [[("firing", 10_000, NOT_ENDED)], [("resolved", 10_000, rfc3339(20_000))]]
    if then_fires_again:
        expected.append([("firing", 30_000, NOT_ENDED)])
    assert got == expected


def test_a_replica_that_loses_the_lease_mid_retry_stops_retrying(store_backend):
    """Replica a's first attempt fails; while it backs off, b takes the lease and sees the alert
    resolved (it never heard of it firing: nothing to send). a must not retry (its late firing
    would never be resolved by anyone) nor write what it remembers into the shared store."""
    from store.alerts import AlertStore

    panes, leader, backing_off, woken = store_backend.create(), ["a"], threading.Event(), threading.Event()

    def backoff(seconds: float) -> None:
        backing_off.set()
        woken.wait(5)

    with Receiver(fail_first=1) as rx:
        a = notifier(rx.url, memory_store=AlertStore(panes.side_db()), sleep=backoff,
                     active=lambda: leader[0] == "a")
        b = notifier(rx.url, memory_store=AlertStore(store_backend.reopen(panes).side_db()),
                     active=lambda: leader[0] == "b")
        a.observe(batch(firing("x")))
        assert backing_off.wait(5)
        leader[0] = "b"
        b.reload_memory()
        b.observe(batch(resolved("x"), at_ms=20_000))
        b.close()
        woken.set()
        a.close()
        assert [r.status for r in rx.requests] == [503]
    assert a.stats()["standby"] == 1 and a.stats()["sent"] == 0
    assert AlertStore(store_backend.reopen(panes).side_db()).notifier_memory(rx.url) == {}


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_timeout():
    """Headers at once, then one byte of the body every 0.15 s: every read is well inside the 0.4 s
    timeout, but the attempt as a whole is not, and the other rules must not wait behind it."""
    with Receiver() as rx:
        rx.trickle_next(0.15, n=1)
        n = notifier(rx.url, timeout_s=0.4)
        started = time.monotonic()
        n.observe(batch(firing("a"), rule="slow"))
        n.observe(batch(firing("a"), rule="other"))
        rx.wait_for(lambda reqs: len(reqs) == 3)
        took = time.monotonic() - started
        n.close()
    assert took < 1.5  # the trickled answer (16 bytes: 2.4 s) was not waited for
    assert (n.stats()["sent"], n.stats()["retried"]) == (2, 1)
    assert "timed out after 0.4 s" in n.stats()["last_error"]
