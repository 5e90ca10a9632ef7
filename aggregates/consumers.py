"""What a pipeline does after each committed batch besides its own store: copies of its end
offsets for those who watch consumers (Pipeline.commit_listeners). Neither is the source of
truth (that is the store's transaction); a failure is logged and counted by the pipeline."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("sketchboard.pipeline")

# (batch id, end offsets per stream and partition, commit time in ms): Pipeline.commit_listeners.
CommitListener = Callable[[int, Mapping[str, Mapping[int, int]], int], None]


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
            log.warning("after batch %d: %s failed: %s", batch_id, getattr(listener, "what", type(listener).__name__),
                        exc)
    return failed


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
