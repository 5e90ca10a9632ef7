"""Webhook notifier: the grouping/dedup decisions as pure functions with a fake clock, then
the notifier against a real HTTP receiver on loopback (tests/receiver.py), with the backoff
sleep injected so that retries cost no time."""

from __future__ import annotations

from alerts.dedup import GroupMemory, Plan, Why, coalesce, plan
from alerts.states import AlertState, Notice, RuleNotices

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
