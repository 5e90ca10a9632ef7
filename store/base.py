"""The serving store, as every backend (embedded SQLite, later PostgreSQL) offers it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from store.bloom import BloomCommit, BloomReader
from store.connection import Db
from store.event_ids import EventIdCommit
from store.joins import JoinCommit, JoinSizes, JoinState
from store.patterns import PatternCommit, PatternLoad, PatternSizes, StoredMatch
from store.sessions import Session, SessionCommit
from store.panes import Pane, PaneData
from store.partial_columns import PartialColumns
from store.rollup import BucketStats, SketchRow
from store.table_state import TableChange, TableRow
from store.view_state import ViewChangeRow, ViewCommit, ViewLink
from store.table_versions import EnrichmentCommit, TableVersion
from store.tiers import TierLayout
from store.watermarks import PartitionMark


@dataclass(frozen=True)
class PanePartial:
    """One batch's contribution to one pane, as computed on the executors."""

    stream: str
    start_ms: int
    end_ms: int
    dims: Mapping[str, str]
    data: PaneData


# Why an event was not merged (the dead-letter reasons).
# invalid: a record produced straight to Kafka that fails the API's validation
# missing_event_id: the stream declares event_id_field and the record has none (aggregates/event_ids.py)
DEAD_LETTER_REASONS = ("unparseable", "invalid", "beyond_retention", "future_skew", "missing_event_id")


@dataclass(frozen=True)
class DeadLetter:
    """One log record that was not merged, and why."""

    stream: str
    partition: int
    offset: int
    reason: str  # one of DEAD_LETTER_REASONS
    event_time_ms: int | None = None
    ingest_time_ms: int | None = None
    error: str | None = None  # why an unparseable or invalid record is not an event
    dims: Mapping[str, str] | None = None
    # What the device clock rule added to event_time_ms before judging it (None: nothing).
    clock_correction_ms: int | None = None


@dataclass(frozen=True)
class DeviceClock:
    """One device's clock estimate (aggregates/clock_offsets.py) as a batch leaves it."""

    buckets: tuple[tuple[int, int], ...]  # (receive-time bucket start, smallest received - sent); () = forget it
    offset_ms: int = 0
    correction_ms: int = 0
    newest_ms: int = 0


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
    # The records of this batch that were not merged (all of them), and per stream the counts:
    # records read, and records dead-lettered per reason. read = aggregated + dead-lettered.
    dead_letters: Sequence[DeadLetter] = ()
    read_by_stream: Mapping[str, int] = field(default_factory=dict)
    dead_by_stream: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # The pipeline clock at the start of the batch: panes ending before now - retention are dropped,
    # and partitions are judged idle at it (store/commit_plan.py partition_clock_ms).
    batch_now_ms: int | None = None
    # Bloom filter bits and first-seen counts (store/bloom.py), saved in the same transaction.
    bloom: BloomCommit | None = None
    # Per stream and partition: the newest event time merged in this batch. A stream listed here
    # (even with no partitions) gets per-partition watermarks (store/watermarks.py) from it, the
    # end offsets above and the log's end offsets seen at commit; one not listed keeps the
    # stream-wide rule (newest event - lateness).
    partition_max_event_ms: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    log_end_offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # Streams with an event_id_field: the ids counted, duplicates dropped (store/event_ids.py).
    # Then read = aggregated + dead-lettered + duplicates.
    event_ids: EventIdCommit | None = None
    # Per stream and device: the clock estimates this batch changed (aggregates/device_clocks.py).
    device_clocks: Mapping[str, Mapping[str, DeviceClock]] = field(default_factory=dict)
    # Per window join: its state changes (store/joins.py); its derived rows are among the partials.
    joins: Sequence[JoinCommit] = ()
    # Per stream read from no log (a window join's derived stream): the highest its watermark may
    # reach after this batch (None: where it was). A join's is its clock - within: until the clock
    # passes that, pairs can still come for the panes behind it, so they are not final yet
    # (aggregates/joins.py); while the clock is unknown (a side without a watermark), it stays.
    watermark_cap_ms: Mapping[str, int | None] = field(default_factory=dict)
    # Per table and key: the batch's newest change of the row (store/table_state.py).
    table_changes: Mapping[str, Mapping[str, TableChange]] = field(default_factory=dict)
    # Per table-table join view: its rows the batch's table changes changed (store/view_state.py).
    views: Sequence[ViewCommit] = ()
    # Per pattern: its keys' state, matches and late events (store/patterns.py).
    patterns: Sequence[PatternCommit] = ()
    # Per stream declaring sessions: its open sessions' changes (store/sessions.py); the closed
    # sessions are among the partials (of `<stream>_sessions`).
    sessions: Sequence[SessionCommit] = ()
    # Per stream: partials given as columns (store/partial_columns.py: the Arrow partials), in
    # addition to `partials` (not among them); the plan takes them first, in this order, then
    # `partials`. Their new panes and tier deltas are written from the columns as they are.
    partial_columns: Mapping[str, PartialColumns] = field(default_factory=dict)
    # Enrichment (stream-table join): table row versions, their pruning, misses (store/table_versions.py).
    enrichment: EnrichmentCommit | None = None
    # Per stream: the definition version the batch was computed with (catalog/versions.py); the
    # commit is refused when the namespace's stored one differs (a switch since: store/switch.py).
    definition_versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def partial_count(self) -> int:
        """The batch's pane partials: the objects and the rows of the columns."""
        return len(self.partials) + sum(len(cols) for cols in self.partial_columns.values())

    def max_event_with(self, newest: Mapping[str, int]) -> dict[str, int]:
        """max_event_ms with a step's derived streams' newest event times merged in (the later wins)."""
        out = dict(self.max_event_ms)
        for stream, t in newest.items():
            out[stream] = max(out.get(stream, t), t)
        return out


@dataclass(frozen=True)
class CommitResult:
    committed: bool  # False: the batch id was committed before, nothing changed
    panes_new: int = 0
    panes_updated: int = 0
    first_change_seq: int | None = None
    last_change_seq: int | None = None
    corrections: int = 0
    dead_letters: int = 0


@dataclass(frozen=True)
class Change:
    """One entry of the change feed: a pane changed (correction_id is set when the change
    was a correction of a final pane). `seq` increases in commit order, consecutive within
    one batch's changes (CommitResult first_change_seq..last_change_seq); between batches
    there may be a gap (PostgreSQL: a commit that rolled back used numbers no one gets), so
    readers tail `seq > n` and never expect n + 1."""

    seq: int
    stream: str
    start_ms: int
    dims: str
    revision: int
    batch_id: int
    count_added: int
    at_ms: int
    correction_id: int | None = None


@dataclass(frozen=True)
class Correction:
    """A change to a pane that was already final: old and new stats, and what caused it.

    Stats are {"count": n, "values": {field: {n, sum, min, max}}, "distinct": {field: estimate}}.
    """

    id: int
    stream: str
    pane_start_ms: int
    pane_end_ms: int
    dims: Mapping[str, str]
    revision_from: int
    revision_to: int
    batch_id: int
    events_added: int
    at_ms: int
    old: Mapping
    new: Mapping


@dataclass(frozen=True)
class StoredDeadLetter:
    id: int
    pipeline: str
    batch_id: int
    at_ms: int
    letter: DeadLetter


@dataclass(frozen=True)
class PartitionProgress:
    """A partition's watermark mark and its state at the last commit (store/watermarks.py)."""

    mark: PartitionMark
    state: str  # caught_up | idle | active


@dataclass(frozen=True)
class StreamProgress:
    stream: str
    watermark_ms: int | None
    max_event_ms: int | None
    events_aggregated: int
    panes: int | None  # None: not counted (PaneStore.progress's row_counts)
    events_read: int = 0
    events_dead_lettered: int = 0
    dead_lettered_by_reason: Mapping[str, int] = field(default_factory=dict)
    corrections: int | None = 0  # likewise
    partitions: Mapping[int, PartitionProgress] = field(default_factory=dict)
    held_by_partition: int | None = None  # the partition whose unread records hold the watermark back
    duplicates_dropped: int = 0  # events dropped as copies of an event id counted before (event_id_field)
    enrich_misses: dict[str, int] = field(default_factory=dict)  # per table: events enriched with "" (no row)


def counted(counts: Mapping[str, int] | None, stream: str) -> int | None:
    """A stream's count in `counts` (0 when it has none), None when nothing was counted."""
    return None if counts is None else counts.get(stream, 0)


def streams_progress(rows: Iterable[tuple], *, pane_counts: Mapping[str, int] | None,
                     correction_counts: Mapping[str, int] | None, by_reason: Mapping[str, Mapping[str, int]],
                     partitions: Mapping[str, Mapping[int, PartitionProgress]], duplicates: Mapping[str, int],
                     misses: Mapping[str, dict[str, int]]) -> dict[str, StreamProgress]:
    """Each stream's progress from its stream_progress row (stream, watermark, max event, events
    aggregated, read and dead-lettered, the partition holding it) and the counters read beside it
    in the same snapshot (both stores' PaneStore.progress)."""
    return {
        stream: StreamProgress(stream, wm, mx, agg, counted(pane_counts, stream), read, dead,
                               dict(by_reason.get(stream, {})), counted(correction_counts, stream),
                               dict(partitions.get(stream, {})), held_by, duplicates.get(stream, 0),
                               misses.get(stream, {}))
        for stream, wm, mx, agg, read, dead, held_by in rows
    }


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
    def commit_batch(self, commit: BatchCommit, *, lateness_ms: Mapping[str, int], now_ms: int,
                     retention_ms: Mapping[str, int] | None = None,
                     idle_timeout_ms: Mapping[str, int] | None = None,
                     membership_bucket_ms: Mapping[str, int] | None = None) -> CommitResult:
        """Merge a batch's partials into the stored panes and record the batch id, in one
        transaction with its corrections (merges into panes already final by the watermark
        stored before this batch), dead letters, counters, watermark and offsets; a batch id
        already recorded for the pipeline changes nothing. With retention_ms and the commit's
        batch_now_ms, panes wholly before now - retention are dropped, with the membership buckets
        (of membership_bucket_ms per stream) wholly before it and the first-seen counts no kept pane
        or tier row serves any more (store.commit_plan.bloom_horizons). The watermark is per
        partition where the commit carries partition marks (store/watermarks.advance_stream,
        with idle_timeout_ms per stream, default the catalog's DEFAULT_PARTITION_IDLE_TIMEOUT_MS),
        idle partitions judged at the commit's batch_now_ms where it has one (else now_ms:
        store.commit_plan.partition_clock_ms). now_ms, the store's clock at the commit, stamps
        when the store took the batch (changes, corrections, dead letters, committed_at_ms)."""

    @abstractmethod
    def last_batch_id(self, pipeline: str) -> int | None: ...

    @abstractmethod
    def last_commit_ms(self, pipeline: str) -> int | None:
        """When the pipeline's newest batch was committed (the store's `now_ms` of it); None before
        its first. What a restarted pipeline's batch clock starts from (aggregates/batch_clock.py)."""

    @abstractmethod
    def newest_commit_ms(self) -> int | None:
        """The newest committed batch's `committed_at_ms` over every pipeline, None before any: the
        clock no batch's retention ran after (store/retention_clock.py). A few index probes."""

    @abstractmethod
    def seen_event_ids(self, stream: str, ids: Sequence[str]) -> dict[str, int]:
        """Of `ids`, those a committed batch counted for `stream` and the store still remembers
        (store/event_ids.py), with the ingest time of the copy counted."""

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
    def tier_layout(self, stream: str) -> TierLayout | None:
        """The roll-up tiers the store keeps for a stream (store/tiers.py), None when only panes."""

    @abstractmethod
    def tier_fold_clock(self, stream: str) -> int | None:
        """The stream's fold clock (store/tier_folds.py): its folded tiers' rows hold the panes
        starting before their shard's point (shard_points); None: every row holds all its panes."""

    @abstractmethod
    def read_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                  value_field: str | None = None, distinct_field: str | None = None,
                  with_sketches: bool = False, pane_ms: int | None = None, with_stats: bool = True) -> list[Pane]:
        """Rows of one tier (granule x projection) starting in [start_ms, end_ms), as Panes whose dims
        are the projected dimensions; the pane granule with all dimensions reads the panes.
        with_stats=False leaves out the exact stats (value fields then carry only their KLL)."""

    def read_tier_sketch(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                         field: str, kind: str, pane_ms: int | None = None) -> list[SketchRow]:
        """read_tier's rows as SketchRows holding one sketch, the `kind` ("kll" of a value field,
        "hll" of a distinct field) of `field`, in start order: what a sketch stat reads. This
        default builds them from read_tier; the stores read them without building Panes."""
        value_field, distinct_field = (field, None) if kind == "kll" else (None, field)
        out = []
        for pane in self.read_tier(stream, granule_ms, proj, start_ms, end_ms, value_field=value_field,
                                   distinct_field=distinct_field, with_sketches=True, pane_ms=pane_ms, with_stats=False):
            data = pane.data
            if kind == "kll":
                stats = data.values.get(field)
                blob = stats.kll if stats is not None else None
            else:
                blob = data.distincts.get(field)
            out.append(SketchRow(pane.key.start_ms, pane.key.dims, data.count, pane.revision, blob, pane.last_batch))
        return out

    @abstractmethod
    def aggregate_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *, origin_ms: int,
                       bucket_ms: int, group_by: Sequence[str] = (), filters: Mapping[str, str] | None = None,
                       value_field: str | None = None, pane_ms: int | None = None) -> list[BucketStats]:
        """The exact stats of one tier's rows starting in [start_ms, end_ms) that match `filters`,
        summed by the store per (bucket of bucket_ms counted from origin_ms, group): count, highest
        revision, the value field's n/sum/min/max, the newest batch that changed one of its rows
        and how many rows; what store.rollup.rollup_buckets rolls up."""

    @abstractmethod
    def configure_tiers(self, layouts: Mapping[str, TierLayout | None], *, now_ms: int,
                        progress: Callable[[str], None] | None = None) -> list[str]:
        """Keep these tiers from now on: a stream whose stored layout differs gets its tier rows
        rebuilt from its panes (one transaction per stream), from its first pane on: the older rows
        of a tier both layouts keep stay (store.commit_plan.tiers_kept_by_rebuild); returns the
        streams rebuilt."""

    @abstractmethod
    def newest_pane_ends(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[dict[str, str], int]]:
        """Per combination of dimensions with events in panes starting in [start_ms, end_ms):
        (dims, end of its newest such pane). What absence alert rules read."""

    @abstractmethod
    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]: ...

    @abstractmethod
    def watermarks(self) -> dict[str, int]: ...

    @abstractmethod
    def corrections(self, *, stream: str | None = None, start_ms: int | None = None, end_ms: int | None = None,
                    after_id: int = 0, limit: int = 1000, newest_first: bool = False) -> list[Correction]:
        """Correction records, filtered by stream and by pane start in [start_ms, end_ms)."""

    @abstractmethod
    def count_corrections(self, stream: str, start_ms: int, end_ms: int, after_ms: int,
                          dims: Mapping[str, str]) -> int:
        """How many corrections were published after `after_ms` to panes of the stream starting in
        [start_ms, end_ms) whose dimensions have the values `dims` gives (a dimension a pane lacks
        reads as "", as store.panes.matches_filters reads it). Counted by the database: a busy
        window's corrections (tens of thousands, each with its old and new stats) are never read."""

    @abstractmethod
    def max_correction_id(self) -> int:
        """The id of the newest correction record, 0 when there is none."""

    @abstractmethod
    def dead_letters(self, *, stream: str | None = None, reason: str | None = None,
                     limit: int = 1000) -> list[StoredDeadLetter]:
        """Dead-lettered records, newest first."""

    @abstractmethod
    def dead_letter_counts(self, start_ms: int, end_ms: int) -> dict[str, int]:
        """Dead letters per stream committed in [start_ms, end_ms) (what alert rules watch)."""

    @abstractmethod
    def progress(self, pipeline: str, *, row_counts: bool = True) -> PipelineProgress:
        """The pipeline's counters, offsets and per-stream progress, as one commit left them.
        `row_counts`: also count each stream's panes and corrections, which reads every pane
        (~130 ms at a day of 3 M events on SQLite): GET /api/v1/pipeline shows them; what polls
        progress (the websocket's pipeline feed every second, lag rounds, /metrics scrapes) passes
        False and gets None for both."""

    @abstractmethod
    def table_row(self, stream: str, key: str) -> TableRow | None:
        """A changelog table's current row of `key` (store/table_state.py), None when it has none."""
        raise NotImplementedError

    def table_versions(self, stream: str) -> list[tuple[str, TableVersion]]:
        """A changelog table's kept row versions, (key, version) in key and version order
        (store/table_versions.py: what enrichment looks up)."""
        raise NotImplementedError

    def seed_table_versions(self, versions: Mapping[str, Sequence[tuple[str, TableVersion]]]) -> None:
        """Write row versions another store kept (the serving output's, for a reprocessing run that
        starts in a namespace of its own), in one transaction, as a batch's would be written: a
        version already stored (same key and log position) is kept as it is."""
        raise NotImplementedError

    def table_rows(self, stream: str, *, after: str | None = None, limit: int = 100) -> list[TableRow]:
        """A changelog table's rows in key order, the first `limit` after the key `after` (None:
        from the first row, the empty key included)."""
        raise NotImplementedError

    def table_rows_by_key(self, stream: str, keys: Sequence[str]) -> dict[str, dict]:
        """These keys' current rows of a changelog table (a key without one is absent)."""
        raise NotImplementedError

    def view_links(self, view: str, left_keys: Sequence[str], right_keys: Sequence[str]) -> list[ViewLink]:
        """A view's entries of these left keys and of the left keys naming these right keys."""
        raise NotImplementedError

    def view_definition(self, view: str) -> str | None:
        """The declaration a view's stored rows were built for; None: not built (store/view_state.py)."""
        raise NotImplementedError

    def drop_view(self, view: str) -> None:
        """Forget a view's rows: the next batch rebuilds them from the tables."""
        raise NotImplementedError

    def view_row(self, view: str, key: str) -> TableRow | None:
        """A view's current row of the left key `key`, None when it has none."""
        raise NotImplementedError

    def view_rows(self, view: str, *, after: str | None = None, limit: int = 100) -> list[TableRow]:
        """A view's rows in key order, the first `limit` after the key `after` (None: from the first
        row, the empty key included)."""
        raise NotImplementedError

    def view_changes(self, view: str, *, after: str = "", limit: int = 100) -> list[ViewChangeRow]:
        """A view's changelog (old and new row per change) in commit order, the first `limit` after
        the cursor `after` (store/view_state.py; ValueError for a malformed cursor)."""
        raise NotImplementedError

    def device_clocks(self, stream: str) -> dict[str, DeviceClock]:
        """The stream's device clock estimates as the last batch left them."""

    @abstractmethod
    def join_state(self, join: str, keys: Sequence[str], expire_through_ms: int | None) -> JoinState:
        """A window join's stored state that a batch with these keys touches (store/joins.py)."""

    @abstractmethod
    def join_sizes(self) -> dict[str, JoinSizes]:
        """Every window join's state size and counters."""

    @abstractmethod
    def session_state(self, stream: str, keys: Sequence[str] | pa.Array | pa.ChunkedArray,
                      due_through_ms: int | None) -> Sequence[Session]:
        """A stream's open sessions with a key among `keys` or a last event at or before `due_through_ms`
        (the pipeline's batches hand their keys over as Arrow strings: store/sessions.py `lookup`)."""

    @abstractmethod
    def session_sizes(self) -> dict[str, int]:
        """Open sessions per stream."""

    @abstractmethod
    def pattern_state(self, pattern: str, keys: Sequence[str], due_through_ms: int | None,
                      history_keys: Sequence[str] = ()) -> PatternLoad:
        """A pattern's watermark and the stored keys among `keys` or due by `due_through_ms`, and
        the kept history of `history_keys` (store/patterns.py)."""

    @abstractmethod
    def pattern_sizes(self) -> dict[str, PatternSizes]:
        """Every pattern's state size and counters."""

    @abstractmethod
    def pattern_matches(self, pattern: str, *, key: str | None = None, start_ms: int | None = None,
                        end_ms: int | None = None, after_id: int = 0, limit: int = 100) -> list[StoredMatch]:
        """A pattern's matches in decided order after `after_id`, by key and decided_at in [start, end)."""

    @abstractmethod
    def pattern_newest_match_id(self, pattern: str) -> int | None:
        """The id of the pattern's newest match, None when it has none."""

    @abstractmethod
    def pattern_late(self, pattern: str, limit: int = 100) -> list[tuple]:
        """A pattern's late events, newest first."""

    @abstractmethod
    def side_db(self) -> Db:
        """Where the side stores (store/lag.py, health.py, alerts.py) keep their tables: beside
        this store's, on the backend's own terms; each side store closes the Db it was given."""

    @abstractmethod
    def bloom_reader(self) -> BloomReader:
        """The Bloom filters and first-seen counts of this store (store/bloom.py), read on the
        backend's own terms: what the API's routes and the pipeline's Bloom features read."""

    def change_signal(self):
        """What an API process's websocket hub waits on to learn of new commits at once, with
        `wait(timeout) -> bool` (True: a batch committed since the previous wait), `listening`
        (False: it cannot tell now, poll instead) and `close()`; a new one per caller. None (the
        default, SQLite): the hub polls the change feed on its interval."""
        return None

    def checkpoint_apart(self) -> None:
        """Keep the storage's housekeeping of committed writes out of the batches' commits, where
        the backend does it in them (SQLite's write-ahead log checkpoints: store/wal_checkpoints.py);
        what a pipeline's store asks. PostgreSQL checkpoints in its own processes: nothing to do."""

    @abstractmethod
    def close(self) -> None: ...
