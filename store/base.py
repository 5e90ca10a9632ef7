"""The serving store, as every backend (embedded SQLite, later PostgreSQL) offers it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from store.bloom import BloomCommit
from store.panes import Pane, PaneData


@dataclass(frozen=True)
class PanePartial:
    """One batch's contribution to one pane, as computed on the executors."""

    stream: str
    start_ms: int
    end_ms: int
    dims: Mapping[str, str]
    data: PaneData


@dataclass(frozen=True)
class BatchCommit:
    """Everything one micro-batch writes, committed atomically with its batch id."""

    pipeline: str
    batch_id: int
    partials: Sequence[PanePartial]
    events_read: int
    # Per stream: the newest event time seen in this batch (the watermark is derived from it).
    max_event_ms: Mapping[str, int] = field(default_factory=dict)
    # Per stream and partition: the log offset up to which this batch read (exclusive).
    end_offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # Bloom filter bits and first-seen counts (store/bloom.py), saved in the same transaction.
    bloom: BloomCommit | None = None


@dataclass(frozen=True)
class CommitResult:
    committed: bool  # False: the batch id was committed before, nothing changed
    panes_new: int = 0
    panes_updated: int = 0
    first_change_seq: int | None = None
    last_change_seq: int | None = None


@dataclass(frozen=True)
class Change:
    """One entry of the change feed: a pane reached a new revision."""

    seq: int
    stream: str
    start_ms: int
    dims: str
    revision: int
    batch_id: int
    count_added: int
    at_ms: int


@dataclass(frozen=True)
class StreamProgress:
    stream: str
    watermark_ms: int | None
    max_event_ms: int | None
    events_aggregated: int
    panes: int


@dataclass(frozen=True)
class PipelineProgress:
    pipeline: str
    last_batch_id: int | None
    last_commit_ms: int | None
    batches: int
    events_read: int
    end_offsets: Mapping[str, Mapping[int, int]]
    streams: Mapping[str, StreamProgress]


class PaneStore(ABC):
    @abstractmethod
    def commit_batch(self, commit: BatchCommit, *, lateness_ms: Mapping[str, int], now_ms: int) -> CommitResult:
        """Merge a batch's partials into the stored panes and record the batch id, in one
        transaction; a batch id already recorded for the pipeline changes nothing."""

    @abstractmethod
    def last_batch_id(self, pipeline: str) -> int | None: ...

    @abstractmethod
    def read_panes(
        self,
        stream: str,
        start_ms: int,
        end_ms: int,
        *,
        value_field: str | None = None,
        distinct_field: str | None = None,
        with_sketches: bool = False,
    ) -> list[Pane]:
        """Panes of a stream whose start lies in [start_ms, end_ms); sketches only when asked."""

    @abstractmethod
    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]: ...

    @abstractmethod
    def watermarks(self) -> dict[str, int]: ...

    @abstractmethod
    def progress(self, pipeline: str) -> PipelineProgress: ...

    @abstractmethod
    def close(self) -> None: ...
