"""The store commit of a pipeline's batch, as every pipeline (panes, session windows) makes it:
retried with back-off while the storage fails (aggregates/commit_retry.py), each failure and
the recovery reported in the log and in the health store the API reads (`/api/v1/pipeline`'s
store errors, /metrics). One helper, so no pipeline fails its query on a full disk while
another waits for the space."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from aggregates.batch_gate import BatchGate
from aggregates.commit_retry import Backoff, commit_with_retry
from store import BatchCommit, CommitResult, PaneStore
from store.definitions import DefinitionStore

# How often a commit held by a synchronized switch looks whether the hold is gone (one indexed
# read of a one-row table): the pipeline commits at most this long after the switch is done.
HOLD_POLL_S = 0.2


class StoreCommitter:
    def __init__(self, store: PaneStore, pipeline: str, gate: BatchGate, *, log: logging.Logger,
                 clock: Callable[[], float] = time.time, backoff: Backoff = Backoff(), reported_as: str | None = None):
        self.store, self.pipeline, self.gate, self.log, self.clock, self.backoff = (
            store, pipeline, gate, log, clock, backoff)
        # The pipeline name the errors are reported under (the API shows its serving pipeline's).
        self.reported_as = reported_as or pipeline
        # Where store errors are reported (store.health.HealthStore; the wiring sets it): None, only logged.
        self.health = None

    def commit(self, commit: BatchCommit, *, lateness_ms: Mapping[str, int], retention_ms: Mapping[str, int],
               idle_timeout_ms: Mapping[str, int] | None = None,
               membership_bucket_ms: Mapping[str, int] | None = None) -> CommitResult:
        """Commit until the store takes it (or the pipeline stops: the error is raised, the batch is
        not recorded and Spark replays it at the next start). `now` is read at each try: the
        store's clock at the commit, for when the store took it (committed_at_ms, change and
        correction times); the watermark's idle partitions are judged at the batch's own
        `batch_now_ms`, as its sessions and joins judged them (store/commit_plan.py partition_clock_ms)."""
        return commit_with_retry(
            lambda: self.store.commit_batch(commit, lateness_ms=lateness_ms, now_ms=int(self.clock() * 1000),
                                            retention_ms=retention_ms, idle_timeout_ms=idle_timeout_ms,
                                            membership_bucket_ms=membership_bucket_ms),
            wait=self.gate.sleep, report=lambda error, attempt: self._report(commit.batch_id, error, attempt),
            backoff=self.backoff, wait_held=self._wait_held)

    def write_checkpoint(self, batch_id: int, write: Callable[[], None]) -> None:
        """A checkpoint file of a batch of the driver's own (aggregates/bounded_batches.py), written
        until it goes through: a full disk or an I/O error (CheckpointSpaceError) is retried with the
        store commit's back-off and reported as a store error is (health, /metrics), since the
        pipeline cannot go on without it; any other failure is raised, naming the file."""
        from aggregates.checkpoint_moves import CheckpointSpaceError

        commit_with_retry(write, wait=self.gate.sleep, backoff=self.backoff, transient=(CheckpointSpaceError,),
                          report=lambda error, attempt: self._report(batch_id, error, attempt,
                                                                     what="the checkpoint write"))

    def _wait_held(self, seconds: float) -> bool:
        """The back-off of a commit held by a synchronized switch (store/switch.py SwitchHeld), cut
        short as soon as the switch releases the hold (polled every HOLD_POLL_S): the switch delays
        the pipeline by its own time, not by a back-off of up to 30 s. True when the stop comes."""
        holds = DefinitionStore(self.store.side_db())
        try:
            left = seconds
            while left > 0:
                step = min(HOLD_POLL_S, left)
                if self.gate.sleep(step):
                    return True
                left -= step
                if self.pipeline not in holds.holds():
                    return False
            return False
        finally:
            holds.close()

    def _report(self, batch_id: int, error: BaseException | None, attempt: int, *,
                what: str = "the store commit") -> None:
        """Say that the store commit fails (and is retried), or that it went through again: in
        the log, and in the health store that the API reads, where that can still be written."""
        at_ms = int(self.clock() * 1000)
        if error is None:
            self.log.warning("%s: batch %d: %s went through after %d failed tries", self.pipeline, batch_id, what,
                             attempt)
        else:
            self.log.warning("%s: batch %d: %s failed (try %d), retrying: %s: %s", self.pipeline,
                             batch_id, what, attempt + 1, type(error).__name__, error)
        if self.health is None:
            return
        try:
            if error is None:
                self.health.store_recovered(self.reported_as, at_ms)
            else:
                prefix = "" if self.reported_as == self.pipeline else f"{self.pipeline}: "
                self.health.store_failing(self.reported_as, f"{prefix}{type(error).__name__}: {error}", at_ms)
        except Exception as exc:  # the same full disk, most likely: the log line above says it
            self.log.debug("could not record the store error: %s", exc)


class ReportsStoreErrors:
    """A pipeline (pane or session) whose `committer` reports store errors: `health` is where,
    set by the wiring or a test on the pipeline itself."""

    committer: StoreCommitter

    @property
    def health(self):
        """Where store errors are reported (store.health.HealthStore; the wiring sets it): None, only logged."""
        return self.committer.health

    @health.setter
    def health(self, health) -> None:
        self.committer.health = health
