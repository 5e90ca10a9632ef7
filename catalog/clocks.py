"""The device clock estimates of a stream as a stream of their own (issue 17: "per-device offset
as a metric: distribution of offsets, devices with offsets above a threshold").

A stream declaring `sent_time_field` generates the derived stream `<stream>_clocks`: per batch,
one row per device heard from (a clock sample in the batch), at the minute of receive time of
its newest sample, carrying the device's estimate after the batch (aggregates/device_clocks.py).
So its panes answer, per window, over the devices heard from in it:

- `<stream>_clock_offset`: |offset| in ms (pNN, avg, max...), grouped or filtered by `off_by`;
- `<stream>_clock_devices`: the distinct devices heard from (filter `off_by` for those above a
  threshold, `shifted` for those whose event times were corrected).

`off_by` buckets |offset| by the thresholds people reason in (the same as /metrics'
`sketchboard_device_clocks{above}`): `tolerance` (within the stream's `clock_tolerance`: taken
for network delay), `1m` (up to a minute), `1h` (up to an hour), `more`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.durations import format_duration_ms
from catalog.features import add_derived, check_generated_names, generated_stream

if TYPE_CHECKING:
    from catalog.model import Catalog

CLOCK_DIMENSIONS = ("off_by", "shifted")
CLOCK_VALUES = ("abs_offset_ms", "offset_ms")
CLOCK_DEVICE_FIELD = "device"
CLOCK_TIME_FIELD = "received_minute"
OFF_BY_BUCKETS = ((60_000, "1m"), (3_600_000, "1h"))


def clocks_stream_name(stream: str) -> str:
    return f"{stream}_clocks"


def off_by(offset_ms: int, tolerance_ms: int) -> str:
    """Pure: the `off_by` bucket of an offset (either way)."""
    size = abs(offset_ms)
    if size <= tolerance_ms:
        return "tolerance"
    for limit, name in OFF_BY_BUCKETS:
        if size <= limit:
            return name
    return "more"


def expand_clocks(catalog: Catalog) -> None:
    """Add `<stream>_clocks` and its metrics for every stream with a sent time (idempotent: a
    catalog dumped and parsed again already has them)."""
    from catalog.model import MetricDef

    for name, stream in list(catalog.streams.items()):
        if stream.sent_time_field is None or stream.derived_from:
            continue
        derived = clocks_stream_name(name)
        check_generated_names(("streams", name, "sent_time_field"), "stream", name,
                              (derived, f"{name}_clock_offset", f"{name}_clock_devices"))
        spec = generated_stream(
            ("streams", name, "sent_time_field"), f"(device clocks of {name}: its retention, panes of 1m or more)",
            name=derived,
            description=f"Device clock offsets of {name}: per device heard from, its estimate (receive - sent),"
                        " at the minute it was received",
            time_field=CLOCK_TIME_FIELD,
            dimensions=CLOCK_DIMENSIONS,
            values=CLOCK_VALUES,
            distinct=(CLOCK_DEVICE_FIELD,),
            pane=format_duration_ms(max(stream.pane, 60_000)),  # rows are per minute of receive time
            # Receive times only move forward; a replayed backlog's old minutes come as corrections.
            allowed_lateness=format_duration_ms(60_000),
            retention=format_duration_ms(stream.retention),
            partitions=1,
            derived_from=name,
        )
        metrics = (
            MetricDef(name=f"{name}_clock_offset", stream=derived, value="abs_offset_ms", unit="ms",
                      description=f"|clock offset| of the {name} devices heard from (group or filter by off_by)"),
            MetricDef(name=f"{name}_clock_devices", stream=derived, distinct=CLOCK_DEVICE_FIELD,
                      description=f"{name} devices heard from (filter off_by=more: those off by over an hour)"),
        )
        add_derived(catalog, spec, metrics, path=("streams", name, "sent_time_field"),
                    generated_for=f"{name}'s device clocks")
