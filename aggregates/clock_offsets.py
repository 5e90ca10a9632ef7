"""Device clock offsets from the three timestamps, as plain Python (no I/O; time passed in).

A device stamps an event when it happens (event time, by its clock) and again when it sends
it (sent time, by its clock); we stamp it when we receive it (ingest time, by ours). The two
device stamps share the device's clock error, so `received - sent` is that error plus the
network delay, and `event time + (received - sent)` puts the event on our clock even when it
was buffered offline for hours ("Whose clock are you using, anyway?", DDIA ch. 11).

Network delay is never negative and is sometimes large (a retry, a slow link), so the
estimate is the smallest `received - sent` seen recently, as NTP's clock filter keeps the
sample with the least delay: an outlier can only raise a sample, never the minimum; a clock
set forward (smaller offsets) shows at once; a clock set back shows once the older, smaller
samples leave the window.

The state is small and mergeable, so executors can build it per batch and the store can
merge it across batches: per `bucket_ms` of receive time, the smallest offset seen in it,
for the buckets within `window_ms` of the newest one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_BUCKET_MS = 60_000
DEFAULT_WINDOW_MS = 15 * 60_000


@dataclass(frozen=True)
class ClockEstimate:
    """One device's recent smallest offsets: ((bucket start, min received - sent), ...), oldest first."""

    buckets: tuple[tuple[int, int], ...] = ()

    def offset_ms(self) -> int | None:
        """The device clock's error as seen now (add it to the device's times), None when unknown."""
        return min((o for _, o in self.buckets), default=None)

    def observe(self, received_ms: int, sent_ms: int, *, bucket_ms: int = DEFAULT_BUCKET_MS,
                window_ms: int = DEFAULT_WINDOW_MS) -> ClockEstimate:
        return self.merge(ClockEstimate((((received_ms // bucket_ms) * bucket_ms, received_ms - sent_ms),)),
                          window_ms=window_ms)

    def merge(self, other: ClockEstimate, *, window_ms: int = DEFAULT_WINDOW_MS) -> ClockEstimate:
        """Both estimates' samples: per bucket the smaller offset, buckets older than the window
        (counted back from the newest bucket of either) dropped. Commutative and associative."""
        best: dict[int, int] = {}
        for start, offset in (*self.buckets, *other.buckets):
            best[start] = offset if start not in best else min(best[start], offset)
        if not best:
            return ClockEstimate()
        horizon = max(best) - window_ms
        return ClockEstimate(tuple(sorted((s, o) for s, o in best.items() if s > horizon)))


def estimate(samples: Iterable[tuple[int, int]], *, bucket_ms: int = DEFAULT_BUCKET_MS,
             window_ms: int = DEFAULT_WINDOW_MS) -> ClockEstimate:
    """The estimate after (received, sent) samples, in any order."""
    out = ClockEstimate()
    for received, sent in samples:
        out = out.observe(received, sent, bucket_ms=bucket_ms, window_ms=window_ms)
    return out


def corrected_event_time(event_ms: int, offset_ms: int | None, *, tolerance_ms: int) -> int:
    """The event time on our clock: shifted by the device's offset when that is known and larger
    than `tolerance_ms` either way (a healthy device's offset is mostly network delay; leaving
    it alone keeps its events' times as sent), else as the device stamped it."""
    if offset_ms is None or abs(offset_ms) <= tolerance_ms:
        return event_ms
    return event_ms + offset_ms


# Why a device's event times were or were not shifted (the rule of `clock_correction_ms`).
CORRECTED = "corrected"                # offset known, consistent and beyond the tolerance: shifted by it
WITHIN_TOLERANCE = "within_tolerance"  # offset known but small: mostly network delay, left alone
INCONSISTENT = "inconsistent"          # the newest minute's samples lie above the smallest: set back
UNKNOWN = "unknown"                    # no sample in the window: nothing to go by


def newest_above_least_ms(estimate: ClockEstimate) -> int:
    """How far the newest bucket's smallest offset lies above the smallest of all: a clock set
    back (or a newest minute whose every sample was slow) shows as that; a steady clock has next
    to none, and so has a clock set forward, whose newest minute holds the smallest offset."""
    if not estimate.buckets:
        return 0
    return estimate.buckets[-1][1] - min(o for _, o in estimate.buckets)


def clock_verdict(estimate: ClockEstimate, *, tolerance_ms: int, max_spread_ms: int) -> tuple[str, int]:
    """(why, what to add to the device's event times): its offset when that is known, consistent
    (the newest bucket's smallest offset within `max_spread_ms` of the smallest of all) and beyond
    `tolerance_ms` either way; else 0. An inconsistent estimate is not used: its smallest sample
    is from before the clock was set back. A clock set forward is followed at once: its newest
    minute holds the smallest offset."""
    offset = estimate.offset_ms()
    if offset is None:
        return UNKNOWN, 0
    if abs(offset) <= tolerance_ms:
        return WITHIN_TOLERANCE, 0
    if newest_above_least_ms(estimate) > max_spread_ms:
        return INCONSISTENT, 0
    return CORRECTED, offset


def forget_stale(estimate: ClockEstimate, *, horizon_ms: int) -> ClockEstimate:
    """The estimate, or an empty one when its newest sample is older than `horizon_ms` (a device
    not heard from within the stream's retention): state stays bounded by the devices alive."""
    if not estimate.buckets or estimate.buckets[-1][0] < horizon_ms:
        return ClockEstimate()
    return estimate
