"""Log compaction of a changelog table's partition: which records a pass may drop. Pure, no I/O.

As Kafka's log cleaner does: of each key only its newest record is kept (older ones are
superseded: a consumer replaying the partition from its start ends with the same rows), and a
newest record that is a tombstone is dropped too once it is older than the tombstone retention
(so a consumer that was behind by less than that still sees the delete). Keyless records are
kept. Offsets never change: the kept records keep theirs, and gaps are left where records went.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Change:
    offset: int
    key: str | None
    tombstone: bool
    ingest_time_ms: int


def offsets_to_drop(changes: Iterable[Change], *, now_ms: int, tombstone_retention_ms: int,
                    read_through: int | None = None) -> set[int]:
    """The offsets a compaction pass may drop from a partition holding `changes` (any order).
    `read_through`: the offset the pipeline reading the partition has committed up to (None: it
    has read none of it). A tombstone at or past it stays whatever its age: a pipeline that
    stored the key's row and has not read the delete yet would keep the deleted row for good."""
    newest: dict[str, Change] = {}
    drop: set[int] = set()
    for change in changes:
        if change.key is None:
            continue
        held = newest.get(change.key)
        if held is None or change.offset > held.offset:
            if held is not None:
                drop.add(held.offset)
            newest[change.key] = change
        else:
            drop.add(change.offset)
    horizon = now_ms - tombstone_retention_ms
    drop.update(c.offset for c in newest.values() if c.tombstone and c.ingest_time_ms < horizon
                and (read_through is None or c.offset < read_through))
    return drop


def next_drop_ms(changes: Iterable[Change], *, tombstone_retention_ms: int,
                 read_through: int | None = None) -> int | None:
    """For `changes` a pass finds nothing to drop in (what a pass kept: each keyed record is its
    key's newest): the first time a pass over the same changes and `read_through` drops one, which is
    when the first tombstone the readers have read (offsets_to_drop) outlives its retention. None:
    never, until a record is appended or `read_through` moves (a tombstone at or past it waits)."""
    due = [c.ingest_time_ms + tombstone_retention_ms + 1 for c in changes
           if c.key is not None and c.tombstone and (read_through is None or c.offset < read_through)]
    return min(due, default=None)


@dataclass(slots=True)
class KeptKeys:
    """What a complete pass left in a partition below `end_offset`: each key's one record (its
    newest, by offset) and which of them are tombstones. Keyless records are never dropped, so
    they need no place here. With it a pass decides from the records appended since alone."""

    end_offset: int
    newest: dict[str, int]
    tombstones: dict[str, Change]

    @classmethod
    def of(cls, kept: Iterable[Change], end_offset: int) -> KeptKeys:
        """From the changes a pass kept (offsets_to_drop's survivors: at most one per key)."""
        newest: dict[str, int] = {}
        tombstones: dict[str, Change] = {}
        for change in kept:
            if change.key is not None:
                newest[change.key] = change.offset
                if change.tombstone:
                    tombstones[change.key] = change
        return cls(end_offset, newest, tombstones)

    def drop_with(self, appended: Iterable[Change], end_offset: int, *, now_ms: int, tombstone_retention_ms: int,
                  read_through: int | None = None) -> set[int]:
        """offsets_to_drop over the kept records and `appended` (the records from `end_offset` on),
        without the kept ones: their newest offsets decide. Updates this to what the pass keeps,
        as of `end_offset` (the caller drops the offsets, or forgets this)."""
        drop: set[int] = set()
        for change in appended:
            if change.key is None:
                continue
            held = self.newest.get(change.key)
            if held is not None and held > change.offset:
                drop.add(change.offset)
                continue
            if held is not None:
                drop.add(held)
            self.newest[change.key] = change.offset
            if change.tombstone:
                self.tombstones[change.key] = change
            else:
                self.tombstones.pop(change.key, None)
        horizon = now_ms - tombstone_retention_ms
        for key, change in list(self.tombstones.items()):
            if change.ingest_time_ms < horizon and (read_through is None or change.offset < read_through):
                drop.add(change.offset)
                del self.tombstones[key], self.newest[key]
        self.end_offset = end_offset
        return drop

    def next_drop_ms(self, *, tombstone_retention_ms: int, read_through: int | None = None) -> int | None:
        """next_drop_ms over what this keeps."""
        return next_drop_ms(self.tombstones.values(), tombstone_retention_ms=tombstone_retention_ms,
                            read_through=read_through)
