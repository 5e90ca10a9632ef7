"""The lag status: a pure, Burrow-style evaluation of a sliding window of samples.

No thresholds: a partition's status comes from how its offsets moved across the last
`window` samples, judged against `now_ms` (from an injected clock) and `window_ms` (the
window's length in time: samples x sample interval). Rules, in order (Burrow's order, with
ERR first for what cannot be judged):

1. ERR    no samples; the newest sample is older than the window (the sampler is not
          running); or a sample has the log end behind the committed offset (log replaced).
2. REWIND the committed offset went backwards between two samples of the window.
3. OK     any sample in the window has zero lag (the pipeline caught up at some point).
4. STOP   lag > 0 and the pipeline's newest commit is older than window_ms (or it never
          committed and the window is full, or has watched it for window_ms).
5. OK     fewer samples than the window: "not enough samples" (a single sample is OK
          unless rules 1-4 already decided; OK rather than ERR because it is a normal
          state for the first window after start, not a fault).
6. STALL  the committed offset did not move across the window while lag > 0 (the pipeline
          commits batches, just not this partition's offsets).
7. WARN   the lag grew strictly from each sample to the next across the whole window while
          the committed offset moved (Burrow's "always increasing": a healthy pipeline's
          sampled lag fluctuates, so first-to-last growth alone would flap).
8. OK     otherwise: moving, and not falling behind.

Roll-ups (stream, pipeline) take the worst status by severity
OK < WARN < STALL < STOP < REWIND < ERR.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lag.model import PartitionLag, PipelineLag, StreamLag, Verdict
from store.lag import LagSample, LagStatus


def evaluate_partition(samples: Sequence[LagSample], *, now_ms: int, window: int, window_ms: int) -> Verdict:
    if window < 1 or window_ms <= 0:
        raise ValueError(f"window must be >= 1 sample and window_ms > 0 (got {window}, {window_ms})")
    if not samples:
        return Verdict(LagStatus.ERR, "no lag samples: the sampler has not run or cannot read the log")
    w = sorted(samples, key=lambda s: s.order)[-window:]  # rounds in write order (store/lag.py)
    first, last = w[0], w[-1]
    age = now_ms - last.at_ms
    if age > window_ms:
        return Verdict(LagStatus.ERR, f"newest lag sample is {_secs(age)} old (window {_secs(window_ms)}):"
                                      " the sampler is not running or cannot read the log")
    for s in w:
        if s.committed is not None and s.log_end < s.committed:
            return Verdict(LagStatus.ERR, f"log end {s.log_end} is behind the committed offset {s.committed}:"
                                          " the log was replaced or reset")
    for a, b in zip(w, w[1:]):
        if a.committed is not None and (b.committed is None or b.committed < a.committed):
            went_to = "nothing" if b.committed is None else str(b.committed)
            return Verdict(LagStatus.REWIND, f"committed offset went back from {a.committed} to {went_to}")
    lag = last.lag_events
    zero = next((s for s in reversed(w) if s.lag_events == 0), None)
    if zero is not None:
        if zero is last:
            return Verdict(LagStatus.OK, "caught up: lag 0")
        return Verdict(LagStatus.OK, f"lag {lag} events, caught up {_secs(now_ms - zero.at_ms)} ago")
    if last.last_commit_ms is None:
        if len(w) >= window or now_ms - first.at_ms >= window_ms:
            return Verdict(LagStatus.STOP, f"no batch committed yet while lag is {lag} events"
                                           f" (watched for {_secs(now_ms - first.at_ms)})")
        return Verdict(LagStatus.OK, f"not enough samples to judge ({len(w)} of {window}); lag {lag} events,"
                                     " no batch committed yet")
    if now_ms - last.last_commit_ms > window_ms:
        return Verdict(LagStatus.STOP, f"no commit for {_secs(now_ms - last.last_commit_ms)}"
                                       f" (window {_secs(window_ms)}) while lag is {lag} events")
    if len(w) < window:
        return Verdict(LagStatus.OK, f"not enough samples to judge ({len(w)} of {window}); lag {lag} events")
    if first.committed == last.committed:
        return Verdict(LagStatus.STALL, f"committed offset stuck at {last.committed} for"
                                        f" {_secs(last.at_ms - first.at_ms)} while lag is {lag} events"
                                        " (the pipeline commits, this partition does not move)")
    if all(b.lag_events > a.lag_events for a, b in zip(w, w[1:])):
        return Verdict(LagStatus.WARN, f"lag grew in each of the last {len(w)} samples"
                                       f" ({first.lag_events} -> {lag} events) while commits moved: falling behind")
    return Verdict(LagStatus.OK, f"lag {lag} events, committed offset moving")


def worst(verdicts: Iterable[tuple[str, Verdict]], what: str) -> Verdict:
    """The worst of named verdicts, its reason prefixed by its name and the count of others
    with the same status. No verdicts at all is ERR."""
    items = list(verdicts)
    if not items:
        return Verdict(LagStatus.ERR, f"no {what} to evaluate")
    top = max(items, key=lambda kv: kv[1].status.severity)[1].status
    named = [(name, v) for name, v in items if v.status == top]
    if top == LagStatus.OK and len(items) > 1:
        return Verdict(LagStatus.OK, f"all {len(items)} {what} OK")
    name, v = named[0]
    more = f" (and {len(named) - 1} more {what} {top.value})" if len(named) > 1 else ""
    return Verdict(top, f"{name}: {v.reason}{more}")


def evaluate(pipeline: str, samples: Mapping[tuple[str, int], Sequence[LagSample]], *, now_ms: int,
             window: int, window_ms: int, partitions: Iterable[tuple[str, int]] = ()) -> PipelineLag:
    """Every partition's status from its samples, rolled up per stream and for the pipeline.
    `partitions` names partitions that must appear even without samples (they are ERR)."""
    keys = set(samples) | set(partitions)
    by_stream: dict[str, dict[int, PartitionLag]] = {}
    for stream, partition in sorted(keys):
        window_samples = sorted(samples.get((stream, partition), ()), key=lambda s: s.order)
        verdict = evaluate_partition(window_samples, now_ms=now_ms, window=window, window_ms=window_ms)
        latest = window_samples[-1] if window_samples else None
        by_stream.setdefault(stream, {})[partition] = PartitionLag(stream, partition, verdict, latest)
    streams = {
        name: StreamLag(name, worst(((f"partition {p}", pl.verdict) for p, pl in parts.items()), "partitions"), parts)
        for name, parts in by_stream.items()
    }
    verdict = worst(
        ((f"{name}/{p}", pl.verdict) for name, s in streams.items() for p, pl in s.partitions.items()),
        "partitions",
    )
    return PipelineLag(pipeline, now_ms, verdict, streams)


def _secs(ms: int | float) -> str:
    return f"{ms / 1000:.1f} s"
