"""GET /api/v1/clocks: the device clock offsets the pipeline estimated (streams with a
`sent_time_field`): their distribution per stream, how many devices are off by more than a
threshold, the worst ones, and what their events get added (aggregates/device_clocks.py)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.errors import errors, param_error
from catalog import format_duration_ms
from catalog.times import BadParam, parse_duration_param
from store import DeviceClock

QUANTILES = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)


class DeviceOut(BaseModel):
    device: str
    offset_ms: int = Field(description="the estimate: add it to the device's clock to get ours (receive - sent, smallest"
                                       " recently)")
    correction_ms: int = Field(description="what the device's event times get added (0: left alone)")
    samples: int = Field(description="minutes of receive time with a sample in the estimate's window")
    newest_ms: int = Field(description="the newest sample's minute of receive time, epoch ms")


class StreamClocksOut(BaseModel):
    stream: str
    devices: int = Field(description="devices with an estimate")
    corrected: int = Field(description="devices whose event times are shifted by their offset")
    above: int = Field(description="devices whose |offset| is above the threshold")
    offset_quantiles_ms: dict[str, int] = Field(description="p0, p10, p50, p90, p99, p100 of the offsets (exact)")
    worst: list[DeviceOut] = Field(description="the devices with the largest |offset|, largest first")


class ClocksOut(BaseModel):
    threshold: str
    streams: list[StreamClocksOut]


def summarize(stream: str, clocks: Mapping[str, DeviceClock], *, threshold_ms: int, limit: int) -> StreamClocksOut:
    """Pure: one stream's device clocks -> the answer (exact quantiles: the estimates are few)."""
    offsets = sorted(c.offset_ms for c in clocks.values())
    quantiles = {f"p{round(q * 100)}": offsets[min(len(offsets) - 1, int(q * len(offsets)))]
                 for q in QUANTILES} if offsets else {}
    worst = heapq.nsmallest(limit, clocks.items(), key=lambda kv: (-abs(kv[1].offset_ms), kv[0]))
    return StreamClocksOut(
        stream=stream, devices=len(clocks), corrected=sum(1 for c in clocks.values() if c.correction_ms),
        above=sum(1 for o in offsets if abs(o) > threshold_ms), offset_quantiles_ms=quantiles,
        worst=[DeviceOut(device=d, offset_ms=c.offset_ms, correction_ms=c.correction_ms, samples=len(c.buckets),
                         newest_ms=c.newest_ms) for d, c in worst if abs(c.offset_ms) > threshold_ms],
    )


PROMETHEUS_THRESHOLDS_MS = (60_000, 3_600_000)  # "devices off by more than a minute / an hour"


def prometheus_gauges(ctx: ApiContext, registry) -> None:
    """The same per scrape of /metrics: devices per stream (all, and above 1m and 1h) and the
    quantiles of their offsets, for streams that declare a sent_time_field."""
    from prometheus_client import Gauge

    names = [n for n, s in ctx.catalog.streams.items() if s.sent_time_field]
    if not names:
        return
    devices = Gauge("sketchboard_device_clocks", "Devices with a clock estimate; above: those off by more than that",
                    ["stream", "above"], registry=registry)
    offsets = Gauge("sketchboard_device_clock_offset_seconds", "Device clock offsets (receive - sent), quantiles over"
                    " the devices", ["stream", "quantile"], registry=registry)
    for name in names:
        clocks = ctx.store.device_clocks(name)
        summary = summarize(name, clocks, threshold_ms=0, limit=0)  # once per stream and scrape
        devices.labels(name, "0").set(summary.devices)
        for threshold in PROMETHEUS_THRESHOLDS_MS:
            devices.labels(name, format_duration_ms(threshold)).set(
                sum(1 for c in clocks.values() if abs(c.offset_ms) > threshold))
        for q, value in summary.offset_quantiles_ms.items():
            offsets.labels(name, f"{int(q[1:]) / 100:g}").set(value / 1000)


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["status"])

    @r.get(
        "/clocks",
        response_model=ClocksOut,
        responses=errors(400, 404, e400="bad parameters, or the stream declares no sent_time_field",
                         e404="unknown stream"),
        summary="Device clock offsets per stream (streams with a sent_time_field)",
    )
    async def get_clocks(
        stream: str | None = Query(None, description="only this stream"),
        above: str = Query("1m", description="the threshold for `above` and `worst`, e.g. '30s', '1h'"),
        limit: int = Query(20, ge=0, le=1000, description="how many of the worst devices to list"),
    ) -> ClocksOut:
        try:
            threshold = parse_duration_param(above, "above")
        except BadParam as exc:
            raise param_error(exc) from None
        with_clocks = [n for n, s in ctx.catalog.streams.items() if s.sent_time_field]
        if stream is not None:
            if stream not in ctx.catalog.streams:
                raise HTTPException(404, f"unknown stream {stream!r}; defined: {', '.join(sorted(ctx.catalog.streams))}")
            if stream not in with_clocks:
                raise HTTPException(400, f"stream {stream!r} declares no sent_time_field"
                                         f" (streams with one: {', '.join(with_clocks) or 'none'})")
        names = [stream] if stream is not None else with_clocks

        def answer() -> ClocksOut:
            return ClocksOut(threshold=format_duration_ms(threshold), streams=[
                summarize(n, ctx.store.device_clocks(n), threshold_ms=threshold, limit=limit) for n in names])

        return await run_in_threadpool(answer)

    return r
