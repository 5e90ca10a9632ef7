"""Device clock estimates as the store keeps them: one row per (stream, device), rewritten in the
batch transaction that changed it (aggregates/device_clocks.py decides what). Pure: the rows a
commit writes and the estimate a row reads back to, for every backend."""

from __future__ import annotations

import json

from store.base import BatchCommit, DeviceClock


def device_clock_rows(commit: BatchCommit) -> tuple[list[tuple[str, str]], list[tuple]]:
    """((stream, device) to delete, (stream, device, buckets, offset, correction, newest) to upsert)."""
    forget, keep = [], []
    for stream, clocks in commit.device_clocks.items():
        for device, clock in clocks.items():
            if not clock.buckets:
                forget.append((stream, device))
            else:
                keep.append((stream, device, json.dumps([list(b) for b in clock.buckets], separators=(",", ":")),
                             clock.offset_ms, clock.correction_ms, clock.newest_ms))
    return forget, keep


def device_clock(buckets: str, offset_ms: int, correction_ms: int, newest_ms: int) -> DeviceClock:
    return DeviceClock(tuple((int(s), int(o)) for s, o in json.loads(buckets)), offset_ms, correction_ms, newest_ms)
