"""The serving store: panes of mergeable sketches, the change feed, batch ids, progress."""

from store.base import (
    DEAD_LETTER_REASONS,
    BatchCommit,
    Change,
    CommitResult,
    Correction,
    DeadLetter,
    DeviceClock,
    PanePartial,
    PaneStore,
    PipelineProgress,
    StoredDeadLetter,
    StreamProgress,
)
from store.panes import Pane, PaneData, PaneKey, ValueStats, dims_key, pane_start
from store.sqlite import SqlitePaneStore

__all__ = [
    "DEAD_LETTER_REASONS", "Correction", "DeadLetter", "DeviceClock", "StoredDeadLetter",
    "BatchCommit", "Change", "CommitResult", "Pane", "PaneData", "PaneKey", "PanePartial", "PaneStore",
    "PipelineProgress", "SqlitePaneStore", "StreamProgress", "ValueStats", "dims_key", "pane_start",
]
