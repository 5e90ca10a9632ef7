"""Which failed pipeline queries `sketchboard pipeline` starts again by itself (sketchboard/restarts.py):
a batch failed on the host's load (Spark's Python worker did not connect back in its fixed 10 s),
a few times in a window; anything else, or the same too often, ends the loop."""

from __future__ import annotations

from sketchboard.definitions import switched
from sketchboard.restarts import RestartBudget, transient

# As Spark's StreamingQueryException reads when a Python worker did not connect back (seen here at
# load ~28), and a failure of the batch itself.
WORKER = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage"
          " failure: ... org.apache.spark.SparkException: Python worker failed to connect back.")
STORE = "[STREAM_FAILED] ... store.base.StoreUnavailable: database or disk is full"


def test_only_the_hosts_failures_are_transient():
    assert transient(WORKER) and transient(RuntimeError(WORKER))
    assert not transient(STORE) and not transient("ValueError: bad event")
    assert not switched(WORKER)  # a different reason to start again than a switch


def test_a_budget_allows_a_few_restarts_per_window_then_none_until_they_age_out():
    budget = RestartBudget(limit=3, window_s=600)
    assert [budget.allow(t) for t in (0, 10, 20)] == [True, True, True]
    assert not budget.allow(30)  # a failure that keeps coming back is not transient
    assert not budget.allow(599)
    assert budget.allow(600)  # the first one has aged out
    assert not budget.allow(601)
    assert budget.allow(611) and not budget.allow(612)
