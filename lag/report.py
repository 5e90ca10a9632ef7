"""The current lag picture: stored samples -> `lag.status.evaluate`, with the clock injected."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lag.model import PipelineLag
from lag.status import evaluate


@dataclass
class LagMonitor:
    """Reads the lag store and evaluates the status window. Shared by GET /api/v1/lag,
    /metrics and the websocket `lag` feed, so all three say the same thing."""

    store: object  # store.lag.SqliteLagStore (or anything with recent/series/newest_at_ms)
    pipeline: str
    partitions: Callable[[], Iterable[tuple[str, int]]]  # the partitions that must be reported
    window: int = 10
    interval_s: float = 2.0
    clock: Callable[[], float] = time.time
    sampler: object | None = None  # the LagSampler, when this process runs one (for its last error)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the lag status window must be at least 1 sample, got {self.window}")
        if self.interval_s <= 0:
            raise ValueError(f"the lag sample interval must be positive, got {self.interval_s} s")

    @property
    def window_ms(self) -> int:
        """The window's length in time, for STOP and stale samples: window x interval."""
        return round(self.window * self.interval_s * 1000)

    def report(self, stream: str | None = None) -> PipelineLag:
        now_ms = int(self.clock() * 1000)
        wanted = [k for k in self.partitions() if stream is None or k[0] == stream]
        samples = self.store.recent(self.pipeline, self.window, wanted)
        return evaluate(self.pipeline, samples, now_ms=now_ms, window=self.window, window_ms=self.window_ms,
                        partitions=wanted)

    @property
    def sampler_error(self) -> str | None:
        return getattr(self.sampler, "last_error", None)
