"""The events a partial match (a run) took: ranges of its key's pool of taken events.

A key's runs share one list of the events they took (`Taken`, each labelled with its step): a
run holds index ranges into it. Under a looping step (`one_or_more`) a burst of N failures keeps
a run per start, run i holding events i..N: as tuples of their own the runs held N^2/2 events
(~320 failures reached the 50 000 a key may hold) and each took a copy of its whole tuple per
event it took. As ranges they share the N events, each run is one range, and taking an event
grows that range by one. A run also keeps, per step, where its last event of that step is, so
`same_as` conditions read it without walking the run.

Pure: no I/O. The pool grows as events are taken; `union` and `remap` let the key's state be
written (and the pool compacted) with only the events its runs still hold.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

Range = tuple[int, int]  # [first, end) indexes into the key's pool


class RunEvents(Sequence):
    __slots__ = ("pool", "ranges", "length", "lasts", "step")

    def __init__(self, pool: list, ranges: tuple[Range, ...], length: int, lasts: tuple[int, ...],
                 step: int | None = None):
        self.pool = pool  # the key's taken events (shared with its other runs)
        self.ranges = ranges
        self.length = length
        self.lasts = lasts  # per step index: the pool index of the run's last event of that step, -1: none
        # The step of its last event (asked for every run an event is offered to): kept, not looked up.
        self.step = pool[ranges[-1][1] - 1].step if step is None else step

    @property
    def start(self) -> Any:
        """Its first event."""
        return self.pool[self.ranges[0][0]]

    @classmethod
    def first(cls, pool: list, index: int) -> RunEvents:
        """A run of one event: the pool's `index`."""
        step = pool[index].step
        return cls(pool, ((index, index + 1),), 1, (-1,) * step + (index,), step)

    def extended(self, index: int) -> RunEvents:
        """This run and then the pool's `index` (taken after every event of it)."""
        ranges = self.ranges
        first, end = ranges[-1]
        ranges = ranges[:-1] + ((first, end + 1),) if end == index else ranges + ((index, index + 1),)
        step = self.pool[index].step
        lasts = self.lasts
        if len(lasts) <= step:
            lasts += (-1,) * (step + 1 - len(lasts))
        return RunEvents(self.pool, ranges, self.length + 1, lasts[:step] + (index,) + lasts[step + 1:], step)

    def last_of(self, step: int) -> Any:
        """The run's last event of `step`, None if it took none."""
        at = self.lasts[step] if step < len(self.lasts) else -1
        return self.pool[at] if at >= 0 else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        if i == 0:
            return self.pool[self.ranges[0][0]]
        if i == -1:
            return self.pool[self.ranges[-1][1] - 1]
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(i)
        for first, end in self.ranges:
            if i < end - first:
                return self.pool[first + i]
            i -= end - first
        raise IndexError(i)

    def __iter__(self) -> Iterator:
        pool = self.pool
        for first, end in self.ranges:
            yield from pool[first:end]

    def __reversed__(self) -> Iterator:
        pool = self.pool
        for first, end in reversed(self.ranges):
            for i in range(end - 1, first - 1, -1):
                yield pool[i]

    def remapped(self, pool: list, moved: PoolMap) -> RunEvents:
        """The same events in the compacted `pool` (`moved`: where each old index went)."""
        return RunEvents(pool, tuple((moved(first), moved(first) + end - first) for first, end in self.ranges),
                         self.length, tuple(moved(at) if at >= 0 else -1 for at in self.lasts), self.step)


def union(ranges: list[Range]) -> list[Range]:
    """The pool indexes `ranges` cover, as sorted disjoint ranges."""
    out: list[list[int]] = []
    for first, end in sorted(ranges):
        if out and first <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([first, end])
    return [(first, end) for first, end in out]


class PoolMap:
    """Where each index the `covered` ranges hold goes once only they are kept, in order."""

    __slots__ = ("_firsts", "_offsets")

    def __init__(self, covered: list[Range]):
        self._firsts = [first for first, _ in covered]
        self._offsets = []
        at = 0
        for first, end in covered:
            self._offsets.append(at - first)
            at += end - first

    def __call__(self, index: int) -> int:
        return index + self._offsets[bisect.bisect_right(self._firsts, index) - 1]
