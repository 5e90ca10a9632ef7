"""The serving loop's timing (aggregates/driver_serving.py): trigger intervals as Spark's
processing-time trigger spells them, the next trigger at the next multiple of the interval (as
Spark's ProcessingTimeExecutor times it), and an idle beat every 10 s without a batch."""

from __future__ import annotations

import pytest

from aggregates.driver_serving import IDLE_EVERY_S, idle_due, next_trigger_ms
from catalog.durations import trigger_ms


# Each checked against Spark 4's Trigger.ProcessingTime (session 52): the same ms, or refused by both.
@pytest.mark.parametrize("text, ms", [("100 milliseconds", 100), ("1 second", 1000), ("2 seconds", 2000),
                                      ("1 minute 30 seconds", 90_000), ("interval 10 seconds", 10_000),
                                      ("1.5 seconds", 1500), ("1 Hour", 3_600_000), ("1 week", 604_800_000),
                                      ("1 day", 86_400_000), ("0 seconds", 0)])
def test_trigger_intervals_are_read_as_spark_reads_them(text, ms):
    assert trigger_ms(text) == ms


@pytest.mark.parametrize("text", ["", "fast", "10", "10 parsecs", "1 second and a bit", "-1 second", "500ms", "2s",
                                  "10 m", "1.5 minutes", "2 secs", "3 mins", "10 hrs"])
def test_a_trigger_interval_that_is_none_says_so(text):
    with pytest.raises(ValueError, match="not a trigger interval"):
        trigger_ms(text)


def test_a_trigger_interval_past_a_century_is_refused_and_a_settings_file_says_which():
    from sketchboard.settings import Settings

    with pytest.raises(ValueError, match="(?s)trigger_interval.*not a trigger interval: 'fast'"):
        Settings(trigger_interval="fast", alerts_config=None)
    with pytest.raises(ValueError, match="exceeds the maximum"):
        trigger_ms("9" * 400 + " seconds")


@pytest.mark.parametrize("triggered, interval, following", [(1_000, 100, 1_100), (1_042, 100, 1_100),
                                                            (1_099, 100, 1_100), (5_000, 1_000, 6_000),
                                                            (7, 0, 7)])
def test_the_next_trigger_is_the_next_multiple_of_the_interval(triggered, interval, following):
    assert next_trigger_ms(triggered, interval) == following


def test_an_idle_beat_is_due_every_ten_seconds_without_a_batch():
    assert IDLE_EVERY_S == 10.0
    assert not idle_due(100.0, 109.9) and idle_due(100.0, 110.0) and idle_due(100.0, 110.0, 10.0)
    assert idle_due(100.0, 100.5, 0.5) and not idle_due(100.0, 100.4, 0.5)
