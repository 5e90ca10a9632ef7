"""Per-partition watermarks, as plain Python (no I/O; time is passed in).

A stream's watermark used to be its newest event time minus the allowed lateness. When one
partition's records reach further in event time than another's (skewed keys, fair admission
by record count, a Kafka partition that lags), that declared panes final while another
partition still held unread events for them: they were then corrected, and alert rules on
final windows decided on incomplete data exactly when the pipeline was behind.

So, as in Flink and Kafka Streams, each partition has its own watermark (the newest event
time merged from it minus the lateness) and the stream's is the minimum over the partitions
that can still deliver events for it:

- a partition with nothing unread (its read offset has reached the log's end offset) does not
  hold the watermark back: whatever arrives there later is new, and late only if it is late;
- a partition that has unread records but from which nothing was read for `idle_timeout_ms`
  is idle (a stuck Kafka partition, a reader that cannot fetch it): it is left out, so one
  silent partition cannot freeze finality forever;
- a partition with unread records and no event merged from it yet holds the watermark where
  it is (it cannot say how far it reaches);
- when no partition holds it, the watermark is the newest event time of the stream minus
  the lateness (what a caught-up stream had before);
- the result never moves backwards.

`now_ms` is the batch's own instant (store/commit_plan.py `partition_clock_ms`), held through a
small step back of the wall clock (aggregates/batch_clock.py). A larger step back is taken as
the right time, and the progress stamps made before it are then ahead of `now_ms`: they are
stamped `now_ms` again, so a stuck partition counts its idle timeout from the corrected clock
(it holds the watermark for at most that timeout) rather than for as long as the step.

An unread record that is older than (its own partition's newest merged event - lateness) is
late in its partition already: the watermark may pass it, as it may pass any late event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

CAUGHT_UP = "caught_up"  # nothing unread: does not hold the watermark
IDLE = "idle"            # unread records, nothing read for idle_timeout: left out
ACTIVE = "active"        # unread records being read: holds the watermark at its own


@dataclass(frozen=True)
class PartitionMark:
    """What the store keeps per partition of a stream for the watermark."""

    max_event_ms: int | None     # newest event time merged from this partition
    read_offset: int             # next offset to read (the end of the last committed batch)
    log_end_offset: int | None   # the log's end offset seen at that commit (None: unknown)
    last_progress_ms: int        # the batch's instant when its read offset last moved (or it was first seen)

    def watermark_ms(self, lateness_ms: int) -> int | None:
        return None if self.max_event_ms is None else self.max_event_ms - lateness_ms


def advance_partition(previous: PartitionMark | None, *, batch_max_event_ms: int | None, read_offset: int,
                      log_end_offset: int | None, now_ms: int) -> PartitionMark:
    """A partition's mark after a committed batch: newest event and read offset never go back."""
    if previous is None:
        return PartitionMark(batch_max_event_ms, read_offset, log_end_offset, now_ms)
    newest = previous.max_event_ms
    if batch_max_event_ms is not None:
        newest = batch_max_event_ms if newest is None else max(newest, batch_max_event_ms)
    moved = read_offset > previous.read_offset
    return PartitionMark(
        max_event_ms=newest,
        read_offset=max(read_offset, previous.read_offset),
        log_end_offset=log_end_offset if log_end_offset is not None else previous.log_end_offset,
        last_progress_ms=now_ms if moved else previous.last_progress_ms,
    )


def partition_state(mark: PartitionMark, *, now_ms: int, idle_timeout_ms: int) -> str:
    if mark.log_end_offset is not None and mark.read_offset >= mark.log_end_offset:
        return CAUGHT_UP
    if now_ms - mark.last_progress_ms >= idle_timeout_ms:
        return IDLE
    return ACTIVE


@dataclass(frozen=True)
class StreamWatermark:
    watermark_ms: int | None
    # The partition whose watermark is the stream's because it still has unread records (the
    # lowest such one), None when no partition holds the watermark back.
    held_by: int | None


def stream_watermark(previous_ms: int | None, marks: Mapping[int, PartitionMark], *, lateness_ms: int,
                     now_ms: int, idle_timeout_ms: int) -> StreamWatermark:
    """The stream's watermark from its partitions' marks (see the module's rule)."""
    holding: list[tuple[int | None, int]] = []
    newest: int | None = None
    for partition, mark in marks.items():
        if mark.max_event_ms is not None:
            newest = mark.max_event_ms if newest is None else max(newest, mark.max_event_ms)
        if partition_state(mark, now_ms=now_ms, idle_timeout_ms=idle_timeout_ms) == ACTIVE:
            holding.append((mark.watermark_ms(lateness_ms), partition))
    if holding:
        unknown = [p for w, p in holding if w is None]
        if unknown:  # unread records, nothing merged yet: cannot tell how far it reaches
            return StreamWatermark(previous_ms, min(unknown))
        candidate, held_by = min(holding)
    else:
        candidate, held_by = (None if newest is None else newest - lateness_ms), None
    if candidate is None:
        return StreamWatermark(previous_ms, held_by)
    if previous_ms is not None and previous_ms >= candidate:
        return StreamWatermark(previous_ms, held_by)
    return StreamWatermark(candidate, held_by)


def advance_stream(previous_ms: int | None, stored: Mapping[int, PartitionMark], *,
                   batch_max_event_ms: Mapping[int, int], read_offsets: Mapping[int, int],
                   log_end_offsets: Mapping[int, int], lateness_ms: int, now_ms: int,
                   idle_timeout_ms: int) -> tuple[dict[int, PartitionMark], StreamWatermark]:
    """What one committed batch does to a stream's partition marks and watermark (every store
    backend runs this in its commit transaction): the partitions the batch read or the log
    reports advance, the others keep their marks."""
    # Progress stamped ahead of now (a clock stepped back beyond the batch clock's hold): the idle
    # timer starts again at now, rather than a negative time since progress keeping it `active`.
    marks = {p: replace(m, last_progress_ms=now_ms) if m.last_progress_ms > now_ms else m for p, m in stored.items()}
    for partition in set(read_offsets) | set(batch_max_event_ms) | set(log_end_offsets):
        previous = marks.get(partition)
        read = read_offsets.get(partition, previous.read_offset if previous is not None else 0)
        marks[partition] = advance_partition(previous, batch_max_event_ms=batch_max_event_ms.get(partition),
                                             read_offset=read, log_end_offset=log_end_offsets.get(partition),
                                             now_ms=now_ms)
    return marks, stream_watermark(previous_ms, marks, lateness_ms=lateness_ms, now_ms=now_ms,
                                   idle_timeout_ms=idle_timeout_ms)
