"""Latency spikes: one endpoint slowed by a factor for a window of event time (an incident
for an alert to fire on and resolve), and the --spike option's syntax."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from catalog import parse_duration_ms
from demo.shapes import PATHS


@dataclass(frozen=True)
class LatencySpike:
    """Latencies of one endpoint multiplied by `factor` for a while (an incident to alert on).

    start_s is measured from the generator's start: the value of its injected clock when the
    DemoTraffic was constructed (`DemoTraffic.started_s`), so `--spike /api/cart:40:20s:30s`
    means "20 s after the producer starts, for 30 s" without the caller knowing the epoch.
    The window is in *event time*: an event is spiked when its event time lies in
    [start, start + duration), whenever it is sent (a delayed straggler from inside the window
    is still slow), so the metric the alert reads sees exactly the window. Bytes and status
    are unchanged; overlapping spikes on one endpoint multiply.
    """

    endpoint: str
    factor: float
    start_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if self.endpoint not in PATHS:
            raise ValueError(f"unknown demo endpoint {self.endpoint!r}; the endpoints are: {', '.join(PATHS)}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"spike factor must be a finite number > 0, got {self.factor!r}")
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"spike start must be a finite number of seconds >= 0, got {self.start_s!r}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"spike duration must be a finite number of seconds > 0, got {self.duration_s!r}")

    def window_ms(self, started_s: float) -> tuple[int, int]:
        """[start, end) in epoch ms for a generator that started at epoch second started_s."""
        start_ms = round((started_s + self.start_s) * 1000)
        return start_ms, start_ms + round(self.duration_s * 1000)


SPIKE_SYNTAX = "ENDPOINT:FACTOR:START:DURATION"


def parse_spike(text: str) -> LatencySpike:
    """`/api/cart:40:20s:30s` -> LatencySpike("/api/cart", 40.0, 20.0, 30.0) (argparse type).

    Split from the right: the durations and the factor never hold a colon, a path might.
    """
    parts = text.rsplit(":", 3)
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"{text!r} is not {SPIKE_SYNTAX}, e.g. /api/cart:40:20s:30s")
    endpoint, factor, start, duration = parts
    try:
        number = float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: factor {factor!r} is not a number") from None
    try:
        return LatencySpike(endpoint, number, parse_duration_ms(start) / 1000, parse_duration_ms(duration) / 1000)
    except ValueError as exc:  # parse_duration_ms() and the checks above say what is wrong
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
