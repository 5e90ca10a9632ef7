"""aggregates/side_step.py: a batch step run in a thread beside the others gives its result, or
its error, where the batch takes it, and a batch that fails first still waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from aggregates.side_step import side_step


def test_the_result_comes_from_another_thread():
    main = threading.get_ident()
    step = side_step(lambda a, *, b: (a + b, threading.get_ident()), 1, b=2)
    total, ident = step.result()
    assert total == 3 and ident != main


def test_its_error_is_raised_where_the_result_is_taken_and_wait_does_not_raise():
    def broken():
        raise ValueError("the keys of this batch")

    step = side_step(broken)
    step.wait()
    with pytest.raises(ValueError, match="the keys of this batch"):
        step.result()


def test_wait_returns_only_once_the_step_is_done():
    done = []

    def slow():
        time.sleep(0.2)
        done.append(True)

    step = side_step(slow)
    step.wait()
    assert done == [True]


def test_steps_run_one_at_a_time_in_order():
    seen = []
    steps = [side_step(lambda k=k: (time.sleep(0.01 * (3 - k)), seen.append(k))) for k in range(3)]
    for s in steps:
        s.result()
    assert seen == [0, 1, 2]
