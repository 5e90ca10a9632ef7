"""The Burrow-style lag status: every rule and edge case, with synthetic samples and a fake clock."""

from __future__ import annotations

import pytest

from lag.model import Verdict
from store.lag import LagSample, LagStatus
from lag.status import evaluate, evaluate_partition, worst
from tests.support.clock import FakeClock

T0 = 1_800_000_000_000
INTERVAL = 2_000
WINDOW = 5
WINDOW_MS = WINDOW * INTERVAL


def samples(ends, committed, *, commits=None, start=0, t0=T0, stream="s", partition=0):
    """One sample per INTERVAL from t0; `commits` gives last_commit_ms per sample (default:
    the sample's own time whenever the committed offset moved, else the previous one)."""
    out, last_commit = [], None
    for i, (end, c) in enumerate(zip(ends, committed, strict=True)):
        at = t0 + i * INTERVAL
        if commits is not None:
            last_commit = commits[i]
        elif c is not None and (i == 0 or c != committed[i - 1]):
            last_commit = at
        out.append(LagSample("main", stream, partition, at, start, end, c, last_commit))
    return out


def status(ss, now_ms=None, window=WINDOW, window_ms=WINDOW_MS):
    clock = FakeClock(now_ms if now_ms is not None else ss[-1].at_ms + 100 if ss else T0)
    return evaluate_partition(ss, now_ms=clock(), window=window, window_ms=window_ms)


def test_ok_when_caught_up():
    v = status(samples([10, 20, 30, 40, 50], [10, 20, 30, 40, 50]))
    assert v.status == LagStatus.OK and "caught up" in v.reason


@pytest.mark.parametrize("zero_at", range(5))
def test_zero_lag_anywhere_in_the_window_is_ok(zero_at):
    # Lag growing and the offset stuck everywhere else: still OK, the pipeline caught up in the window.
    ends = [100 + 10 * i for i in range(5)]
    committed = [50] * 5
    committed[zero_at] = ends[zero_at]
    committed = [max(committed[: i + 1]) for i in range(5)]  # never backwards
    v = status(samples(ends, committed))
    assert v.status == LagStatus.OK


def test_ok_when_moving_and_lag_fluctuates():
    v = status(samples([100, 120, 140, 160, 180], [90, 100, 135, 150, 160]))  # lag 10, 20, 5, 10, 20
    assert v.status == LagStatus.OK and "moving" in v.reason


def test_warn_when_lag_grows_in_every_sample_while_committing():
    v = status(samples([100, 150, 200, 250, 300], [90, 130, 170, 210, 250]))  # lag 10, 20, 30, 40, 50
    assert v.status == LagStatus.WARN
    assert "10 -> 50" in v.reason


def test_no_warn_when_growth_is_not_monotonic():
    # First -> last grew (10 -> 50) but one step fell: Burrow's rule wants growth at every step.
    v = status(samples([100, 150, 200, 250, 300], [90, 130, 185, 210, 250]))  # lag 10, 20, 15, 40, 50
    assert v.status == LagStatus.OK


def test_no_warn_when_lag_is_flat():
    v = status(samples([100, 110, 120, 130, 140], [90, 100, 110, 120, 130]))  # lag 10 each time
    assert v.status == LagStatus.OK


def test_stall_when_offset_does_not_move_but_the_pipeline_commits():
    ss = samples([100, 110, 120, 130, 140], [50] * 5, commits=[T0 + i * INTERVAL for i in range(5)])
    v = status(ss)
    assert v.status == LagStatus.STALL
    assert "stuck at 50" in v.reason and "90 events" in v.reason


def test_stop_when_no_commit_for_longer_than_the_window():
    ss = samples([100, 110, 120, 130, 140], [50] * 5, commits=[T0 - 1] * 5)
    now = T0 + WINDOW_MS  # last commit is WINDOW_MS + 1 ms old
    v = status(ss, now_ms=now, window_ms=WINDOW_MS)
    assert v.status == LagStatus.STOP
    assert "no commit for 10.0 s" in v.reason and "lag is 90 events" in v.reason


def test_not_stop_at_exactly_the_window():
    ss = samples([100, 110, 120, 130, 140], [50] * 5, commits=[T0] * 5)
    assert status(ss, now_ms=T0 + WINDOW_MS).status == LagStatus.STALL


def test_stop_even_when_lag_is_constant():
    # The producer stopped too: no growth, no commits, lag > 0.
    ss = samples([100] * 5, [50] * 5, commits=[T0 - 60_000] * 5)
    assert status(ss).status == LagStatus.STOP


def test_stop_when_never_committed_and_the_window_is_full():
    ss = samples([10, 20, 30, 40, 50, 60], [None] * 6)
    v = status(ss)
    assert v.status == LagStatus.STOP and "no batch committed yet" in v.reason


def test_stop_when_never_committed_and_watched_for_the_window_time():
    ss = samples([10, 20], [None] * 2)
    assert status(ss, now_ms=T0 + WINDOW_MS).status == LagStatus.STOP


def test_never_committed_with_a_short_watch_is_not_stop():
    ss = samples([10, 20], [None, None])
    v = status(ss, now_ms=T0 + INTERVAL + 100)
    assert v.status == LagStatus.OK and "not enough samples" in v.reason


def test_never_committed_and_empty_log_is_ok():
    assert status(samples([0, 0, 0], [None] * 3)).status == LagStatus.OK


def test_rewind_when_committed_goes_backwards():
    v = status(samples([100, 110, 120, 130, 140], [90, 100, 40, 60, 140]))
    # Rewind wins over the zero lag of the last sample (Burrow's order).
    assert v.status == LagStatus.REWIND
    assert "from 100 to 40" in v.reason


def test_rewind_when_committed_offsets_disappear():
    v = status(samples([100, 110, 120], [90, 100, None]))
    assert v.status == LagStatus.REWIND and "to nothing" in v.reason


def test_rewind_outside_the_window_is_forgotten():
    ss = samples([100, 110, 120, 130, 140, 150, 160], [90, 50, 60, 70, 80, 90, 100])
    assert status(ss).status == LagStatus.OK  # the window is the last 5 samples: 50 -> 100 moves


def test_single_sample_with_zero_lag_is_ok():
    assert status(samples([10], [10])).status == LagStatus.OK


def test_single_sample_with_lag_is_ok_not_enough_samples():
    v = status(samples([10], [5]))
    assert v.status == LagStatus.OK and "not enough samples to judge (1 of 5)" in v.reason


def test_single_sample_with_an_old_commit_is_stop():
    ss = samples([10], [5], commits=[T0 - WINDOW_MS - 1])
    assert status(ss, now_ms=T0).status == LagStatus.STOP


def test_err_without_samples():
    v = evaluate_partition([], now_ms=T0, window=WINDOW, window_ms=WINDOW_MS)
    assert v.status == LagStatus.ERR and "no lag samples" in v.reason


def test_err_when_the_newest_sample_is_stale():
    ss = samples([10, 20], [10, 20])
    v = status(ss, now_ms=ss[-1].at_ms + WINDOW_MS + 1)
    assert v.status == LagStatus.ERR and "sampler is not running" in v.reason


def test_err_when_the_log_end_is_behind_the_committed_offset():
    v = status(samples([100, 110, 5], [90, 100, 100]))
    assert v.status == LagStatus.ERR and "log end 5 is behind the committed offset 100" in v.reason


def test_window_uses_only_the_newest_samples_in_time_order():
    ss = samples([100, 110, 120, 130, 140, 150], [100, 101, 102, 103, 104, 105])
    # lag: 0, 9, 18, 27, 36, 45 - the zero is outside the 5-sample window, growth is strict: WARN
    assert status(list(reversed(ss))).status == LagStatus.WARN
    assert status(ss, window=6).status == LagStatus.OK


def test_retention_ahead_of_the_pipeline_counts_from_the_log_start():
    s = LagSample("main", "s", 0, T0, log_start=80, log_end=100, committed=50)
    assert s.position == 80 and s.lag_events == 20


def test_window_parameters_are_validated():
    with pytest.raises(ValueError):
        evaluate_partition([], now_ms=T0, window=0, window_ms=WINDOW_MS)


# -- roll-ups -------------------------------------------------------------------------


def test_worst_picks_the_most_severe_and_counts_the_rest():
    v = worst([("a", Verdict(LagStatus.OK, "fine")), ("b", Verdict(LagStatus.STOP, "stopped")),
               ("c", Verdict(LagStatus.STOP, "stopped too")), ("d", Verdict(LagStatus.WARN, "w"))], "partitions")
    assert v.status == LagStatus.STOP
    assert v.reason == "b: stopped (and 1 more partitions STOP)"
    assert worst([], "partitions").status == LagStatus.ERR


def test_severity_order():
    assert [s.severity for s in (LagStatus.OK, LagStatus.WARN, LagStatus.STALL, LagStatus.STOP, LagStatus.REWIND,
                                 LagStatus.ERR)] == [0, 1, 2, 3, 4, 5]


def test_evaluate_rolls_up_per_stream_and_pipeline():
    a0 = samples([10, 20, 30, 40, 50], [10, 20, 30, 40, 50], stream="a", partition=0)
    a1 = samples([100, 110, 120, 130, 140], [50] * 5, stream="a", partition=1, commits=[T0 - 60_000] * 5)
    for s in (a0, a1):
        for i, x in enumerate(s):
            s[i] = LagSample(x.pipeline, x.stream, x.partition, x.at_ms, x.log_start, x.log_end, x.committed,
                             x.last_commit_ms, 1_000 * x.lag_events)
    b0 = samples([5] * 5, [5] * 5, stream="b")
    now = a0[-1].at_ms + 100
    report = evaluate("main", {("a", 0): a0, ("a", 1): a1, ("b", 0): b0}, now_ms=now, window=WINDOW,
                      window_ms=WINDOW_MS, partitions=[("b", 1)])
    assert report.verdict.status == LagStatus.ERR  # b/1 has no samples at all
    assert report.streams["a"].verdict.status == LagStatus.STOP
    assert report.streams["a"].verdict.reason.startswith("partition 1: no commit for")
    assert report.streams["b"].verdict.status == LagStatus.ERR
    assert report.lag_events == 90 and report.streams["a"].lag_events == 90
    assert report.lag_seconds == 90.0  # the oldest unprocessed record across partitions
    message = report.to_message()
    assert message["type"] == "lag" and message["pipeline"] == "main" and message["at_ms"] == now
    assert message["streams"]["a"]["partitions"]["1"] == {
        "log_end": 140, "committed": 50, "lag_events": 90, "lag_seconds": 90.0, "status": "STOP",
        "reason": message["streams"]["a"]["partitions"]["1"]["reason"]}
    assert message["streams"]["b"]["partitions"]["1"]["log_end"] is None


def test_evaluate_all_ok_says_so():
    s0 = samples([10, 20], [10, 20], partition=0)
    s1 = samples([10, 20], [10, 20], partition=1)
    report = evaluate("main", {("s", 0): s0, ("s", 1): s1}, now_ms=s0[-1].at_ms, window=WINDOW, window_ms=WINDOW_MS)
    assert report.verdict == Verdict(LagStatus.OK, "all 2 partitions OK")
