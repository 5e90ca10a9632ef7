"""The gate a stop waits at (aggregates/batch_gate.py): a stop lets the running batch finish,
and no batch starts its work after it. Pure threading, no Spark: the batch function here stands
for the pipeline's foreachBatch."""

from __future__ import annotations

import threading

import pytest

from aggregates.batch_gate import BatchGate, Stopping


def test_a_stop_waits_for_the_running_batch_and_refuses_the_next():
    gate, started, release, done = BatchGate(), threading.Event(), threading.Event(), []

    def process(batch, batch_id):
        started.set()
        release.wait(10)
        done.append(batch_id)
        return "committed"

    run = gate.wrap(process)
    worker = threading.Thread(target=run, args=(None, 7))
    worker.start()
    assert started.wait(10) and gate.running
    gate.close()
    assert gate.wait_idle(0.05) is False  # batch 7 is still running: the stop waits
    release.set()
    assert gate.wait_idle(10) is True and done == [7]
    worker.join(10)
    with pytest.raises(Stopping, match="batch 8 not processed"):
        run(None, 8)
    assert done == [7]  # batch 8 did no work: Spark replays it at the next start


def test_an_idle_gate_stops_at_once_and_a_failing_batch_leaves_it_idle():
    gate = BatchGate()
    assert gate.wait_idle(0) is True

    def fail(batch, batch_id):
        raise ValueError("store unavailable")

    with pytest.raises(ValueError):
        gate.wrap(fail)(None, 1)
    assert not gate.running and gate.wait_idle(0)


def test_batches_run_as_usual_until_the_gate_closes():
    gate = BatchGate()
    run = gate.wrap(lambda batch, batch_id: batch_id * 2)
    assert [run(None, i) for i in range(3)] == [0, 2, 4]
