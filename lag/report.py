"""The current lag picture: stored samples -> `lag.status.evaluate`, with the clock injected.

Samples are judged on the clock of the replica that wrote them (the leader's sampler), never by
comparing another machine's wall clock with this one's: on the replica whose sampler writes them,
its own clock; elsewhere, the newest sample time seen plus the time elapsed on this replica's
monotonic clock since it was first seen. A replica whose wall clock is ahead of the leader's then
does not call fresh samples stale (ERR). The price: a replica just started (or whose monitor had
not read since) counts a stopped sampler's age from its own first look, so it says ERR up to a
window later than the leader would; and an age is understated by at most the time between two
reports here (a new sample is noticed when a report reads it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lag.model import PipelineLag, Verdict
from lag.status import evaluate
from store.lag import LagStatus


@dataclass
class LagMonitor:
    """Reads the lag store and evaluates the status window. Shared by GET /api/v1/lag,
    /metrics and the websocket `lag` feed, so all three say the same thing."""

    store: object  # store.lag.LagStore (or anything with recent/series/newest_at_ms/newest_round)
    pipeline: str
    partitions: Callable[[], Iterable[tuple[str, int]]]  # the partitions that must be reported
    window: int = 10
    interval_s: float = 2.0
    clock: Callable[[], float] = time.time
    sampler: object | None = None  # the LagSampler, when this process runs one (for its last error)
    # The log's other consumers (fan-out): store.consumers.ConsumerRegistry, or None.
    registry: object | None = None
    # The streams each other consumer reads (None: every stream): a reprocessing run is judged
    # on its stream and what it needs, not on streams it never reads (the sampler's `reads`).
    reads: Callable[[str], Collection[str] | None] | None = None
    monotonic: Callable[[], float] = time.monotonic
    # The serving pipeline's pane store (last_batch_id / last_commit_ms): its batches are committed
    # there, not copied into the registry, so its row in `consumers` reads them from it. None: from
    # its samples (the commit time only).
    pane_store: object | None = None
    # Per pipeline: (the newest sample time seen, this replica's monotonic time when it was first seen)
    _seen: dict[str, tuple[int, float]] = field(default_factory=dict, init=False, repr=False)
    _seen_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the lag status window must be at least 1 sample, got {self.window}")
        if self.interval_s <= 0:
            raise ValueError(f"the lag sample interval must be positive, got {self.interval_s} s")

    @property
    def window_ms(self) -> int:
        """The window's length in time, for STOP and stale samples: window x interval."""
        return round(self.window * self.interval_s * 1000)

    def report(self, stream: str | None = None, pipeline: str | None = None) -> PipelineLag:
        """The lag of this pipeline, or of another consumer of the log."""
        name = pipeline or self.pipeline
        wanted = self._partitions(stream)
        read = self._read_by(name, wanted)
        gone = self._reads_nothing_configured(name, wanted) if stream is None and not read else None
        return gone or self._report(name, read)

    def message(self, stream: str | None = None) -> dict:
        """The websocket `lag` message, also GET /api/v1/lag's body without its series and
        consumers: the report, the evaluation window and the sampler's last error."""
        body = self.report(stream).to_message()
        body["window"] = {"samples": self.window, "interval_seconds": self.interval_s, "seconds": self.window_ms / 1000}
        body["sampler_error"] = self.sampler_error
        return body

    def _partitions(self, stream: str | None) -> list[tuple[str, int]]:
        # The log's partitions: on Kafka a request to the brokers, so asked once per answer.
        return [k for k in self.partitions() if stream is None or k[0] == stream]

    def _read_by(self, pipeline: str, wanted: list[tuple[str, int]]) -> list[tuple[str, int]]:
        streams = None if pipeline == self.pipeline or self.reads is None else self.reads(pipeline)
        return wanted if streams is None else [k for k in wanted if k[0] in streams]

    def _reads_nothing_configured(self, pipeline: str, wanted: list[tuple[str, int]]) -> PipelineLag | None:
        """A reprocessing run none of whose streams is in the configuration any more (its stream
        removed): listed by GET /api/v1/lag and /metrics alike, ERR with the reason, as long as its
        registry entry is there (until its output is dropped); None for any other consumer."""
        streams = None if pipeline == self.pipeline or self.reads is None else self.reads(pipeline)
        if streams is None or {s for s, _ in wanted} & set(streams):
            return None
        reason = (f"reads {', '.join(sorted(streams))}, no longer in the configuration: nothing to sample"
                  f" (its output is kept until dropped: POST /api/v1/reprocess/{pipeline}/drop)")
        return PipelineLag(pipeline, int(self.clock() * 1000), Verdict(LagStatus.ERR, reason))

    def _report(self, pipeline: str, wanted: list[tuple[str, int]]) -> PipelineLag:
        samples = self.store.recent(pipeline, self.window, wanted)
        now_ms = self._sampler_now_ms(pipeline, samples)
        return evaluate(pipeline, samples, now_ms=now_ms, window=self.window, window_ms=self.window_ms,
                        partitions=wanted)

    def consumers(self, stream: str | None = None) -> list[dict]:
        """Every consumer of the log, this (serving) pipeline first: its registry record (where
        its output lives, where it started, its Kafka group copies) and its lag report."""
        records = {c.pipeline: c.to_json() for c in self.registry.consumers()} if self.registry is not None else {}
        names = [self.pipeline, *(name for name in records if name != self.pipeline)]
        wanted = self._partitions(stream)
        out = []
        for name in names:
            read = self._read_by(name, wanted)
            if stream is not None and wanted and not read:  # asked about a stream this consumer does not read
                continue
            record = records.get(name) or {"name": name, "namespace": None, "started_from": None,
                                           "registered_at_ms": None, "last_batch_id": None, "last_commit_ms": None,
                                           "group_commits_failed": 0, "group_commit_error": None}
            lag = (None if read else self._reads_nothing_configured(name, wanted)) or self._report(name, read)
            if name == self.pipeline and self.pane_store is not None:  # the serving pipeline's: the store's own
                record = {**record, "last_batch_id": self.pane_store.last_batch_id(name),
                          "last_commit_ms": self.pane_store.last_commit_ms(name)}
            elif record["last_commit_ms"] is None:  # else from its samples (the store's, when sampled)
                known = [p.latest.last_commit_ms for s in lag.streams.values() for p in s.partitions.values()
                         if p.latest and p.latest.last_commit_ms is not None]
                record = {**record, "last_commit_ms": max(known, default=None)}
            report = lag.to_message()
            for key in ("type", "pipeline", "at_ms"):
                del report[key]
            out.append({**record, "serving": name == self.pipeline, **report})
        return out

    def _samples_written_here(self) -> bool:
        """This process's sampler writes the samples (it leads, or runs without a lease)."""
        if self.sampler is None:
            return False
        active = getattr(self.sampler, "active", None)
        return active is None or bool(active())

    def _sampler_now_ms(self, pipeline: str, samples: Mapping[object, Sequence]) -> int:
        """Now on the sampler's clock (see the module's doc)."""
        local = int(self.clock() * 1000)
        # The newest round's time in write order (a new leader's clock may be behind the previous one's).
        newest_sample = max((s for partition in samples.values() for s in partition), key=lambda s: s.order, default=None)
        newest = None if newest_sample is None else newest_sample.at_ms
        mono = self.monotonic()
        with self._seen_lock:
            seen = self._seen.get(pipeline)
            # Any change is a new round (a new leader's clock may be behind the previous one's).
            if newest is not None and (seen is None or newest != seen[0]):
                seen = self._seen[pipeline] = (newest, mono)
        if self._samples_written_here() or seen is None:
            return local
        return seen[0] + int((mono - seen[1]) * 1000)

    @property
    def sampler_error(self) -> str | None:
        return getattr(self.sampler, "last_error", None)
