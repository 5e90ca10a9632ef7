"""Sampling lag on an interval: committed offsets (store), end offsets and ingest times
(log), one `LagSample` per partition, written to the lag store.

Lag in seconds is the age of the oldest record not yet processed: now - ingest time of the
record at the pipeline's position (exact, one index lookup in the embedded log). Where the
source cannot tell ingest times (Kafka), it is interpolated from (log end, time) samples.

Runs as a background thread in the API process: lag must be visible while the pipeline is
stopped, which is exactly when the pipeline process cannot report it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from store.lag import LagSample
from lag.sources import CommittedReader, LagSource, OffsetTimeTable

log = logging.getLogger("sketchboard.lag")


class LagSampler:
    def __init__(self, source: LagSource, committed: CommittedReader, sink, *, pipeline: str,
                 streams: Sequence[str], interval_s: float = 2.0, clock: Callable[[], float] = time.time,
                 others: Callable[[], Mapping[str, CommittedReader]] | None = None,
                 reads: Callable[[str], Collection[str] | None] | None = None,
                 active: Callable[[], bool] | None = None):
        if interval_s <= 0:
            raise ValueError(f"lag sample interval must be positive, got {interval_s} s")
        self.source = source
        self.committed = committed
        self.sink = sink  # anything with write(samples), e.g. store.lag.SqliteLagStore
        self.pipeline = pipeline
        self.streams = list(streams)
        self.interval_s = interval_s
        self.clock = clock
        # The log's other consumers (fan-out: named pipelines besides `pipeline`), sampled in the
        # same round against the same end offsets; asked each round, as pipelines come and go.
        self.others = others
        # The streams a consumer reads (None: all of `streams`): a reprocessing run reads its stream
        # and what it needs, and sampled on the others it would show their whole log as its lag.
        self.reads = reads
        # Whether this replica may write samples now (it holds the leader lease), asked right before
        # each write; None: always. A round that outlived the lease writes nothing.
        self.active = active
        self.last_error: str | None = None
        self.rounds = 0
        self._tables: dict[tuple[str, int], OffsetTimeTable] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> list[LagSample]:
        """One round: read (committed first, then the log: the log only grows, so its end read
        afterwards is never behind a committed offset) and build the samples, for the pipeline
        and for every other consumer."""
        readers = {self.pipeline: self.committed, **(self.others() if self.others is not None else {})}
        committed = {name: reader.committed() for name, reader in readers.items()}
        reading = {name: self._streams_read(name) for name in committed}
        now_ms = int(self.clock() * 1000)
        samples = []
        for stream in self.streams:
            for partition, offsets in sorted(self.source.end_offsets(stream).items()):
                table = self._tables.setdefault((stream, partition), OffsetTimeTable())
                table.add(offsets.end, now_ms)
                # The lag in time depends on the partition's committed offset only, not on whose it
                # is: consumers at one offset (many, with hundreds of runs and named pipelines) share
                # one computation, and its ingest-time lookup (a query on the embedded log).
                lag_ms_at: dict[int | None, int | None] = {}
                for name, c in committed.items():
                    if reading[name] is not None and stream not in reading[name]:
                        continue
                    at = c.offsets.get(stream, {}).get(partition)
                    if at not in lag_ms_at:
                        lag_ms_at[at] = _lag_ms(LagSample(name, stream, partition, now_ms, offsets.start, offsets.end,
                                                          at), self.source, table, now_ms)
                    samples.append(LagSample(name, stream, partition, now_ms, offsets.start, offsets.end, at,
                                             c.last_commit_ms, lag_ms_at[at]))
        return samples

    def _streams_read(self, pipeline: str) -> Collection[str] | None:
        return None if pipeline == self.pipeline or self.reads is None else self.reads(pipeline)

    def sample_and_store(self) -> list[LagSample]:
        samples = self.sample()
        if self.active is not None and not self.active():
            return samples
        self.sink.write(samples)
        self.rounds += 1
        return samples

    # -- the background thread ------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            if not self._stop.is_set():
                return
            self._thread.join()  # stopped while a round was still running: let it end first
        self._stop.clear()  # started again after stop(): this replica leads again
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():  # else start() waits for it: never two samplers
                self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_and_store()
                self.last_error = None
            except Exception as exc:  # keep sampling: a locked or missing file may come back
                if self.last_error != str(exc):
                    log.warning("lag sampling failed: %s", exc)
                self.last_error = str(exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


def _lag_ms(sample: LagSample, source: LagSource, table: OffsetTimeTable, now_ms: int) -> int | None:
    """The sample's lag in time: 0 caught up, else the age of the record at its position."""
    if sample.lag_events == 0:
        return 0
    written = source.ingest_time_ms(sample.stream, sample.partition, sample.position)
    return max(0, now_ms - written) if written is not None else table.lag_ms(sample.position, sample.log_end, now_ms)
