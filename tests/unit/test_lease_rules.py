"""The leader lease's decisions (store/lease_rules.py): plain numbers for time, a dict for the row."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.lease_rules import Action, LeaseRecord, LeaseTracker

TTL = 10.0


class Row:
    """The stored row with compare-and-set, as store/lease.py does it."""

    def __init__(self):
        self.record = LeaseRecord(None)

    def round(self, tracker: LeaseTracker, now: float):
        read = self.record
        step = tracker.step(read, now)
        won = False
        if step.write is not None and self.record.version == read.version:
            self.record, won = step.write, True
        tracker.done(step, won)
        return step, won


def test_a_free_lease_is_acquired_at_once_and_leads_for_a_ttl():
    row, a = Row(), LeaseTracker("a", TTL)
    step, won = row.round(a, 100.0)
    assert step.action is Action.ACQUIRE and won
    assert row.record == LeaseRecord("a", 1, 1)
    assert a.leading(100.0) and a.leading(109.9) and not a.leading(110.0)
    assert a.leader_until() == 110.0


def test_the_holder_renews_and_keeps_its_epoch():
    row, a = Row(), LeaseTracker("a", TTL)
    row.round(a, 0.0)
    step, won = row.round(a, 2.0)
    assert step.action is Action.RENEW and won
    assert row.record == LeaseRecord("a", 2, 1)
    assert a.leading(11.9) and not a.leading(12.0)


def test_the_holder_gives_up_a_margin_before_a_follower_may_take_over():
    """The time the holder's threads have to stop its work before another replica may start it
    (a watchdog on a loaded machine wakes late: without it the follower's on_gain came first)."""
    row, a, b = Row(), LeaseTracker("a", TTL, margin=2.0), LeaseTracker("b", TTL, margin=2.0)
    row.round(a, 0.0)
    assert row.round(b, 0.0)[0].action is Action.FOLLOW  # b sees a's row at once
    assert a.leading(7.9) and not a.leading(8.0) and a.leader_until() == 8.0
    assert row.round(b, 9.9)[0].action is Action.FOLLOW
    assert row.round(b, 10.0)[0].action is Action.ACQUIRE  # a whole ttl after it saw the row: 2.0 after a stopped
    with pytest.raises(ValueError, match="margin"):
        LeaseTracker("c", TTL, margin=TTL)


def test_a_leaderships_margin_keeps_renewals_on_time_leading_without_a_break():
    from store.lease import Leadership

    assert Leadership(None, "l", "a", ttl_s=10.0).tracker.margin == 2.0  # the renew interval (ttl / 5)
    assert Leadership(None, "l", "a", ttl_s=10.0, renew_s=9.0).tracker.margin == 0.5  # renewed at 9, led until 9.5
    row, a = Row(), LeaseTracker("a", TTL, margin=0.5)
    row.round(a, 0.0)
    for now in (9.0, 18.0, 27.0):  # renewals every 9 s
        assert a.leading(now - 0.01)
        row.round(a, now)
    assert a.leading(36.4) and not a.leading(36.5)


def test_a_follower_waits_a_whole_ttl_from_when_it_saw_the_row_change():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    row.round(a, 0.0)
    for now in (1.0, 5.0, 10.9):  # b first sees a's row at 1.0
        step, won = row.round(b, now)
        assert step.action is Action.FOLLOW and not won and not b.leading(now)
    row.round(a, 4.0)  # a renews: b's wait starts again when it sees the new version
    assert row.round(b, 11.0)[0].action is Action.FOLLOW  # seen at 11.0
    assert row.round(b, 20.9)[0].action is Action.FOLLOW
    step, won = row.round(b, 21.0)  # a stopped renewing at 4.0: b takes over
    assert step.action is Action.ACQUIRE and won and b.leading(21.0)
    assert row.record == LeaseRecord("b", 3, 2)
    assert not a.leading(21.0)  # a's last write (4.0) lapsed at 14.0


def test_the_old_leader_stops_before_any_follower_can_start():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    row.round(a, 0.0)
    row.round(b, 0.0)  # b sees a's write the moment it commits (the earliest possible)
    assert a.leader_until() <= 0.0 + TTL
    step, _ = row.round(b, TTL)
    assert step.action is Action.ACQUIRE and not a.leading(TTL)


def test_a_holder_that_lost_the_race_does_not_lead():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    row.round(a, 0.0)
    row.round(b, 0.5)
    # a is slow to renew; b takes over at 10.5; a's renewal then finds the row changed.
    assert row.round(b, 10.5)[1]
    read = LeaseRecord("a", 1, 1)  # what a read before b wrote
    step = a.step(read, 10.6)
    assert step.action is Action.RENEW
    a.done(step, won=row.record.version == read.version)
    assert not a.leading(10.6)
    assert row.round(a, 11.0)[0].action is Action.FOLLOW  # and now follows b


def test_two_contenders_for_a_free_lease_one_wins():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    read = row.record
    step_a, step_b = a.step(read, 1.0), b.step(read, 1.0)
    assert step_a.action is step_b.action is Action.ACQUIRE
    row.record = step_a.write
    a.done(step_a, True)
    b.done(step_b, False)  # its compare-and-set found version 1, not 0
    assert a.leading(1.0) and not b.leading(1.0)


def test_release_hands_the_lease_over_without_waiting():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    row.round(a, 0.0)
    row.round(b, 0.1)
    release = a.release()
    assert release == LeaseRecord(None, 2, 1) and not a.leading(0.2)
    row.record = release
    step, won = row.round(b, 0.3)
    assert step.action is Action.ACQUIRE and won and row.record == LeaseRecord("b", 3, 2)
    assert b.release() is not None and LeaseTracker("c", TTL).release() is None


def test_its_own_lapsed_row_is_renewed_no_epoch_change():
    """Nobody wrote since: nobody led in between, so taking it up again is safe."""
    row, a = Row(), LeaseTracker("a", TTL)
    row.round(a, 0.0)
    assert not a.leading(30.0)
    step, won = row.round(a, 30.0)
    assert step.action is Action.RENEW and won and a.leading(30.0) and row.record.epoch == 1


def test_a_clock_going_back_never_hastens_a_takeover_and_stops_the_holder_leading():
    row, a, b = Row(), LeaseTracker("a", TTL), LeaseTracker("b", TTL)
    row.round(a, 100.0)
    row.round(b, 100.0)
    # b's clock jumps back 50 s: its wait restarts from the new reading, it does not take over early.
    assert row.round(b, 50.0)[0].action is Action.FOLLOW
    assert row.round(b, 59.9)[0].action is Action.FOLLOW
    assert row.round(b, 60.0)[0].action is Action.ACQUIRE
    # a's clock jumps back: it stops leading until it writes again (its lease was judged on the other reading).
    row2, c = Row(), LeaseTracker("c", TTL)
    row2.round(c, 100.0)
    c.step(row2.record, 95.0)  # a round that read the row at the earlier time (its write not yet done)
    assert not c.leading(95.0)
    assert row2.round(c, 96.0)[1] and c.leading(96.0)


def test_a_clock_jumping_forward_ends_the_holders_leadership():
    row, a = Row(), LeaseTracker("a", TTL)
    row.round(a, 0.0)
    assert not a.leading(1_000.0)  # it learns it led too long ago: it must write again first


def test_ttl_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        LeaseTracker("a", 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.0, 6.0)), min_size=1, max_size=60))
def test_never_two_leaders_at_once(rounds):
    """Replicas step in any order at increasing times (some stall for a while): at no time do two
    of them lead."""
    row = Row()
    trackers = {name: LeaseTracker(name, TTL) for name in "abc"}
    now = 0.0
    for name, gap in rounds:
        now += gap
        row.round(trackers[name], now)
        leaders = [n for n, t in trackers.items() if t.leading(now)]
        assert len(leaders) <= 1, (now, leaders, row.record)
        assert not leaders or row.record.holder == leaders[0]
