"""Device clocks in the pipeline: estimate each device's clock offset and correct event times
before they are assigned to panes (streams with a `sent_time_field`; see aggregates/clock_offsets.py).

Per batch, before the partial aggregation:

1. On the executors, the batch's clock samples: per (stream, device, minute of receive time) the
   smallest `ingest_time - sent_time` (one small groupBy; only records that carry a sent time).
2. On the driver, those merged into the estimates as the previous batch left them (the store's
   `device_clocks` rows, kept in memory between batches), and per device a verdict: the
   correction to add to its event times (`clock_offsets.clock_verdict`).
3. On the executors, every record of a device with a correction gets `event_time += correction`
   (a broadcast join on (stream, device); for a small batch held on the driver, a map literal in
   the projection, aggregates/driver_batch.py); `raw_event_time` keeps the device's own stamp and
   `clock_correction` what was added. The dead-letter rules, panes and watermarks then see the
   corrected time.

The estimates a batch leaves are part of its store commit (same transaction as its panes), so a
replayed batch starts from exactly the state its first run started from: exactly once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from aggregates.clock_offsets import (
    DEFAULT_BUCKET_MS,
    ClockEstimate,
    clock_verdict,
    forget_stale,
)
from aggregates.driver_batch import among
from aggregates.driver_rules import clock_samples, corrected
from aggregates.partials import per_catalog
from catalog import Catalog, StreamDef
from catalog.clocks import CLOCK_DEVICE_FIELD, CLOCK_DIMENSIONS, clocks_stream_name, off_by
from sketches import DEFAULT_K, DEFAULT_LG_K, HllSketch, KllSketch
from store import BatchCommit, DeviceClock, PaneData, PanePartial, PaneStore, ValueStats
from store.panes import pane_start

CORRECTION_SCHEMA = "stream string, device string, correction bigint"


@dataclass(frozen=True)
class ClockPlan:
    """What one batch does with device clocks: the corrections to apply, the rows to store."""

    corrections: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (stream, device) -> ms, non-zero
    changed: Mapping[str, Mapping[str, DeviceClock]] = field(default_factory=dict)  # for BatchCommit.device_clocks
    after: Mapping[tuple[str, str], DeviceClock] = field(default_factory=dict)  # every estimate kept after it
    # (stream, device) -> the newest minute of receive time it was heard from in this batch.
    heard: Mapping[tuple[str, str], int] = field(default_factory=dict)


def plan_batch(state: Mapping[tuple[str, str], DeviceClock], samples: Iterable[tuple[str, str, int, int]],
               streams: Mapping[str, StreamDef], *, batch_now_ms: int, whole: bool = True) -> ClockPlan:
    """Pure: the estimates before the batch and its samples (stream, device, bucket start,
    smallest received - sent) -> the batch's plan. Devices not heard from within their stream's
    retention are forgotten.

    `whole`: judge every kept estimate again, as the first batch of a process must (the streams'
    settings may have changed since the estimates were stored). Otherwise (`state` being what
    this function left with these `streams`) only what can change is: the devices heard from,
    those gone stale and those of streams no longer declaring a sent time. An estimate nothing
    was added to gives the same verdict, and judging all of them cost ~40-50 ms a batch for the
    demo's 5 000 devices, where a batch hears from ~100."""
    heard: dict[tuple[str, str], int] = {}
    merged: dict[tuple[str, str], ClockEstimate] = {}
    for stream, device, bucket, offset in samples:
        key = (stream, device)
        heard[key] = max(bucket, heard.get(key, bucket))
        before = merged.get(key) or (ClockEstimate(state[key].buckets) if key in state else ClockEstimate())
        merged[key] = before.merge(ClockEstimate(((bucket, offset),)), window_ms=streams[stream].clock_window)
    if whole:
        judged = {key: ClockEstimate(clock.buckets) for key, clock in state.items() if key not in merged}
        after: dict[tuple[str, str], DeviceClock] = {}
    else:
        judged = {key: ClockEstimate(clock.buckets) for key, clock in state.items()
                  if key not in merged and (key[0] not in streams
                                            or clock.newest_ms < batch_now_ms - streams[key[0]].retention)}
        after = {key: clock for key, clock in state.items() if key not in merged and key not in judged}
    judged.update(merged)
    changed: dict[str, dict[str, DeviceClock]] = {}
    for (stream, device), estimate in judged.items():
        s = streams.get(stream)
        if s is None:  # a stream no longer declaring a sent time: its estimates are dropped
            changed.setdefault(stream, {})[device] = DeviceClock(())
            continue
        estimate = forget_stale(estimate, horizon_ms=batch_now_ms - s.retention)
        old = state.get((stream, device))
        if not estimate.buckets:
            if old is not None:
                changed.setdefault(stream, {})[device] = DeviceClock(())
            continue
        _, correction = clock_verdict(estimate, tolerance_ms=s.clock_tolerance, max_spread_ms=s.max_future_skew)
        clock = DeviceClock(estimate.buckets, estimate.offset_ms() or 0, correction, estimate.buckets[-1][0])
        after[(stream, device)] = clock
        if clock != old:
            changed.setdefault(stream, {})[device] = clock
    # clock_verdict's correction is not 0 exactly when its verdict is CORRECTED
    corrections = {key: clock.correction_ms for key, clock in after.items() if clock.correction_ms}
    return ClockPlan(corrections, changed, after, heard)


def clock_partials(plan: ClockPlan, streams: Mapping[str, StreamDef], *, kll_k: int = DEFAULT_K,
                   lg_k: int = DEFAULT_LG_K) -> tuple[list[PanePartial], dict[str, int]]:
    """Pure: the batch's rows of the `<stream>_clocks` streams (catalog/clocks.py) rolled up
    into pane partials, and each one's newest row time. A row per device heard from, at the
    minute of receive time of its newest sample, with its estimate after the batch; a device
    whose estimate was dropped (stale) gives none."""
    groups: dict[tuple[str, int, int, tuple[str, str]], tuple[list[int], list[int], HllSketch]] = {}
    newest: dict[str, int] = {}
    for (stream, device), minute in sorted(plan.heard.items()):
        clock, s = plan.after.get((stream, device)), streams.get(stream)
        if clock is None or s is None:
            continue
        derived = clocks_stream_name(stream)
        pane = max(s.pane, 60_000)
        dims = (off_by(clock.offset_ms, s.clock_tolerance), "yes" if clock.correction_ms else "no")
        offsets, sizes, hll = groups.setdefault((derived, pane_start(minute, pane), pane, dims),
                                                ([], [], HllSketch(lg_k)))
        offsets.append(clock.offset_ms)
        sizes.append(abs(clock.offset_ms))
        hll.update(device)
        newest[derived] = max(minute, newest.get(derived, minute))
    out = []
    for (derived, start, pane, dims), (offsets, sizes, hll) in groups.items():
        values = {name: _stats(vals, kll_k) for name, vals in (("offset_ms", offsets), ("abs_offset_ms", sizes))}
        out.append(PanePartial(derived, start, start + pane, dict(zip(CLOCK_DIMENSIONS, dims, strict=True)),
                               PaneData(len(offsets), values, {CLOCK_DEVICE_FIELD: hll.to_bytes()})))
    return out, newest


def _stats(values: list[int], kll_k: int) -> ValueStats:
    kll = KllSketch(kll_k)
    for v in values:
        kll.update(v)
    return ValueStats(len(values), float(sum(values)), float(min(values)), float(max(values)), kll.to_bytes())


def with_clocks(commit: BatchCommit, plan: ClockPlan, streams: Mapping[str, StreamDef], *,
                kll_k: int = DEFAULT_K, lg_k: int = DEFAULT_LG_K) -> BatchCommit:
    """The batch's commit with the estimates it changed and its `<stream>_clocks` partials, in
    the same transaction as its panes: a replayed batch starts from the same estimates and
    writes the same rows (exactly once)."""
    partials, newest = clock_partials(plan, streams, kll_k=kll_k, lg_k=lg_k)
    max_event = commit.max_event_with(newest)
    return replace(commit, device_clocks=plan.changed, partials=[*commit.partials, *partials], max_event_ms=max_event)


class DeviceClocks:
    """The pipeline's device clock step; disabled (no cost) when no stream declares a sent time."""

    def __init__(self, spark: SparkSession, catalog: Catalog, store: PaneStore):
        self.spark = spark
        self.store = store
        self.catalog = catalog
        self.streams = {name: s for name, s in catalog.streams.items() if s.sent_time_field}
        self._state: dict[tuple[str, str], DeviceClock] | None = None  # as the last committed batch left it
        self._judged = False  # whether _state is plan_batch's own (else read from the store: judged whole)

    @property
    def enabled(self) -> bool:
        return bool(self.streams)

    def state(self) -> dict[tuple[str, str], DeviceClock]:
        if self._state is None:  # first batch of this process: what the store committed last
            self._state = {(stream, device): clock for stream in self.streams
                           for device, clock in self.store.device_clocks(stream).items()}
            self._judged = False
        return self._state

    def samples(self, batch: DataFrame, *, on_driver: bool = False,
                streams: Collection[str] | None = None) -> list[tuple[str, str, int, int]]:
        """The batch's clock samples, per (stream, device, bucket of receive time): the smallest
        received - sent. Records that will be dead-lettered as unparseable or invalid give none.
        `on_driver`: the batch is an Arrow table on the driver (aggregates/driver_batch.py), grouped
        in Arrow instead of by a Spark job.
        `streams`: those with records in the batch (None: unknown); the others give none."""
        sampling = among(self.streams, streams)
        if not sampling:
            return []
        if on_driver:  # the batch's rows as Arrow (aggregates/driver_rules.py: the same rule)
            return clock_samples(batch, sampling)
        condition, bucket, offset = per_catalog(self.catalog, f"clock samples of {sampling}",
                                                lambda: _sample_columns(sampling))
        sampled = batch.where(condition)
        rows = sampled.groupBy("stream", "device", bucket).agg(F.min(offset).alias("offset")).collect()
        return [(r["stream"], r["device"], int(r["bucket"]), int(r["offset"])) for r in rows]

    def plan(self, batch: DataFrame, *, batch_now_ms: int, on_driver: bool = False,
             streams: Collection[str] | None = None) -> ClockPlan:
        state = self.state()
        return plan_batch(state, self.samples(batch, on_driver=on_driver, streams=streams), self.streams,
                          batch_now_ms=batch_now_ms, whole=not self._judged)

    def committed(self, plan: ClockPlan) -> None:
        """The batch's commit went through: its estimates are the state the next batch starts from."""
        self._state, self._judged = dict(plan.after), True

    def forget(self) -> None:
        """A commit that may or may not have gone through: read the state from the store again."""
        self._state = None

    def apply(self, batch: DataFrame, plan: ClockPlan, *, on_driver: bool = False,
              streams: Collection[str] | None = None) -> DataFrame:
        """The batch with corrected event times (see the module doc). `on_driver`: an Arrow table on
        the driver (aggregates/driver_batch.py), corrected in Arrow by the same rule. `streams`:
        those with records in the batch (None: unknown); no row of the others is corrected."""
        present = set(among({s for s, _ in plan.corrections}, streams))
        corrections = {key: ms for key, ms in plan.corrections.items() if key[0] in present}
        if on_driver:  # an Arrow table: the same columns made in Arrow (aggregates/driver_rules.py)
            return corrected(batch, corrections)
        if not corrections:
            return with_clock_columns(batch)
        table = self.spark.createDataFrame(
            [(stream, device, ms) for (stream, device), ms in corrections.items()], CORRECTION_SCHEMA)
        joined = batch.join(F.broadcast(table), on=["stream", "device"], how="left")
        # The expressions reading the correction are built once (calls into the JVM: a small batch's time).
        columns = per_catalog(self.catalog, "device clock columns", lambda: _corrected_columns(F.col("correction")))
        return joined.select(*[c for c in batch.columns if c != "event_time"], *columns)


def _sample_columns(streams: list[str]) -> tuple[Column, Column, Column]:
    """Which records give a clock sample, their bucket of receive time and offset (received - sent)."""
    ingest = F.col("ingest_time")
    condition = (F.col("stream").isin(streams) & F.col("sent_time").isNotNull() & F.col("device").isNotNull()
                 & ingest.isNotNull() & F.col("error").isNull())
    return condition, (ingest - F.pmod(ingest, F.lit(DEFAULT_BUCKET_MS))).alias("bucket"), ingest - F.col("sent_time")


def _corrected_columns(correction: Column) -> list[Column]:
    """event_time corrected by `correction` (a row's, null for none), raw_event_time, clock_correction."""
    return [F.when(correction.isNotNull() & F.col("event_time").isNotNull(), F.col("event_time") + correction)
            .otherwise(F.col("event_time")).alias("event_time"),
            F.col("event_time").alias("raw_event_time"),
            F.when(F.col("event_time").isNotNull(), correction).alias("clock_correction")]


def with_clock_columns(batch: DataFrame) -> DataFrame:
    """The columns the partial aggregation reads, for a batch no device clock touched."""
    return batch.withColumns({"raw_event_time": F.col("event_time"),
                              "clock_correction": F.lit(None).cast("bigint")})
