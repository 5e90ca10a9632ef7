"""What a pipeline does after each committed batch besides its own store: copies of its end
offsets for those who watch consumers (Pipeline.commit_listeners). Neither is the source of
truth (that is the store's transaction); a failure is logged and counted by the pipeline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("sketchboard.pipeline")

# (batch id, end offsets per stream and partition, commit time in ms): Pipeline.commit_listeners.
CommitListener = Callable[[int, Mapping[str, Mapping[int, int]], int], None]

RETRY_EVERY_S = 10.0  # a failed copy is made again this often while no batch makes a newer one


def notify(listeners: Sequence[CommitListener], batch_id: int, end_offsets: Mapping[str, Mapping[int, int]],
           at_ms: int) -> int:
    """Call each listener; one that fails is logged and skipped (the batch is committed and
    stands). Returns how many failed."""
    failed = 0
    for listener in listeners:
        try:
            listener(batch_id, end_offsets, at_ms)
        except Exception as exc:  # noqa: BLE001 - a copy of the offsets failed, not the batch
            failed += 1
            log.warning("after batch %d: %s failed: %s (tried again while no batch follows)", batch_id,
                        _what(listener), exc)
    return failed


class CommitCopies:
    """The pipeline's listeners (`listeners`, the list Pipeline.commit_listeners is), told of each
    committed batch, and the copies that failed made again until one is made.

    A failed copy used to wait for the next batch, and a pipeline with nothing to read runs none:
    a caught-up pipeline showed lagging to the tools watching its consumer group (or in the
    registry) for as long as its streams were quiet. The pipeline's idle loops call `retry_due`;
    each listener's latest failed batch is tried again every `retry_every_s`, and a newer
    batch's copy replaces it. One lock orders the batch's copies and the retries, so an older
    batch's offsets never land after a newer one's."""

    def __init__(self, listeners: list[CommitListener], *, clock: Callable[[], float] = time.monotonic,
                 retry_every_s: float = RETRY_EVERY_S):
        self.listeners = listeners
        self.clock, self.retry_every_s = clock, retry_every_s
        self._failed: dict[int, tuple[CommitListener, tuple[int, Mapping[str, Mapping[int, int]], int]]] = {}
        self._tried_s = 0.0
        self._lock = threading.Lock()

    def notify(self, batch_id: int, end_offsets: Mapping[str, Mapping[int, int]], at_ms: int) -> int:
        """Tell every listener (`notify`); returns how many failed."""
        with self._lock:
            failed = 0
            for listener in self.listeners:
                if notify([listener], batch_id, end_offsets, at_ms):
                    self._failed[id(listener)] = (listener, (batch_id, end_offsets, at_ms))
                    failed += 1
                else:
                    self._failed.pop(id(listener), None)
            self._tried_s = self.clock()
            return failed

    def retry_due(self) -> int:
        """Make the failed copies again if `retry_every_s` has passed since the last try; returns
        how many still fail. Each listener counts its failures (the registry's group counters)."""
        with self._lock:
            if not self._failed or self.clock() - self._tried_s < self.retry_every_s:
                return len(self._failed)
            for key, (listener, args) in list(self._failed.items()):
                try:
                    listener(*args)
                except Exception as exc:  # noqa: BLE001 - logged when its batch failed it; counted by it
                    log.debug("after batch %d: %s failed again: %s", args[0], _what(listener), exc)
                else:
                    del self._failed[key]
                    log.info("after batch %d: %s made on a later try", args[0], _what(listener))
            self._tried_s = self.clock()
            return len(self._failed)


def _what(listener: CommitListener) -> str:
    return getattr(listener, "what", type(listener).__name__)


class RegistryCopy:
    """The consumer registry in the store's root (store/consumers.py), where the API reads the
    offsets of every pipeline other than the serving one for lag."""

    what = "copying offsets to the consumer registry"

    def __init__(self, registry, pipeline: str):
        self.registry, self.pipeline = registry, pipeline

    def __call__(self, batch_id: int, end_offsets: Mapping[str, Mapping[int, int]], at_ms: int) -> None:
        self.registry.record_commit(self.pipeline, batch_id, at_ms, end_offsets)


class GroupCopy:
    """A Kafka consumer group (ingest/log/kafka_groups.py), for outside tools; each outcome is
    recorded in the registry (failures counted, the last error kept), which the API shows."""

    def __init__(self, committer, registry, pipeline: str):
        self.committer, self.registry, self.pipeline = committer, registry, pipeline
        self.what = committer.what
        self.failures = 0

    def __call__(self, batch_id: int, end_offsets: Mapping[str, Mapping[int, int]], at_ms: int) -> None:
        try:
            self.committer.commit(end_offsets)
        except Exception as exc:
            self.failures += 1
            self.registry.record_group_commit(self.pipeline, f"{type(exc).__name__}: {exc}")
            raise
        self.registry.record_group_commit(self.pipeline, None)
