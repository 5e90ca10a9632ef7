"""GET /api/v1/membership: was a key seen on a stream in a time range? "no" (certain) or
"probably_yes" with the false-positive probability, from the per-bucket Bloom filters OR-ed."""

from __future__ import annotations

import math

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.errors import bad_request, errors, param_error
from catalog.times import BadParam, parse_range_ms
from catalog import format_duration_ms
from sketches.bloom import BloomFilter

MAX_BUCKETS = 10_000


class MembershipAnswer(BaseModel):
    stream: str
    key: str
    start: int = Field(description="the first bucket's start, epoch ms (the range is widened to whole buckets)")
    end: int = Field(description="the end of the range, epoch ms (exclusive)")
    bucket: str = Field(description="the stream's membership bucket, e.g. '1h'")
    answer: str = Field(description="'no': certainly not seen in the range; 'probably_yes': seen, or a false positive")
    false_positive_probability: float = Field(
        description="the probability that a key never seen answers 'probably_yes' for this range (fill^k of the"
                    " OR-ed filters); 0 when no bucket has data")
    buckets: int = Field(description="buckets with a filter in the range (buckets without events have none)")
    fill_ratio: float | None = Field(None, description="fraction of bits set in the OR-ed filter (null: no buckets)")
    watermark_ms: int | None = Field(None, description="the stream's watermark: events behind it are in the filters")


def membership(ctx: ApiContext, stream_name: str, key: str, start: str, end: str) -> MembershipAnswer:
    catalog = ctx.served_catalog()  # the filters there were built as stored (docs/reprocessing.md)
    stream = catalog.streams.get(stream_name)
    if stream is None:
        raise HTTPException(404, f"unknown stream {stream_name!r}; defined: {', '.join(sorted(catalog.streams))}")
    decl = stream.membership
    if decl is None:
        with_it = [n for n, s in catalog.streams.items() if s.membership]
        raise HTTPException(400, f"stream {stream_name!r} declares no membership filters"
                                 f" (streams with them: {', '.join(with_it) or 'none'})")
    if not key:
        raise bad_request("key", "key must not be empty")
    now = ctx.now_ms()
    try:
        start_ms, end_ms = parse_range_ms(start, end, now)
    except BadParam as exc:
        raise param_error(exc) from None
    lo = start_ms - start_ms % decl.bucket
    if (end_ms - lo) // decl.bucket > MAX_BUCKETS:
        raise bad_request("from", f"the range spans more than {MAX_BUCKETS} buckets of {format_duration_ms(decl.bucket)}")
    filters = ctx.store.bloom_reader().membership_filters(stream.name, lo, end_ms)
    # OR the buckets per shape (a configuration change makes a new shape; shapes cannot merge).
    merged: dict[tuple[int, int, int], BloomFilter] = {}
    for _, bloom in filters:
        have = merged.get(bloom.shape)
        if have is None:
            merged[bloom.shape] = bloom
        else:
            have.merge_in(bloom)
    yes = any(key in bloom for bloom in merged.values())
    fill = None
    if merged:
        fill = sum(b.bits_set for b in merged.values()) / sum(b.m for b in merged.values())
    return MembershipAnswer(
        stream=stream.name, key=key, start=lo, end=end_ms, bucket=format_duration_ms(decl.bucket),
        answer="probably_yes" if yes else "no", false_positive_probability=any_false_positive(merged.values()),
        buckets=len(filters), fill_ratio=fill, watermark_ms=ctx.store.watermarks().get(stream.name),
    )


def any_false_positive(filters) -> float:
    """P(some shape answers yes for a key never seen) = 1 - prod(1 - fpp), kept precise for tiny fpp.
    No filter, or only empty ones, is exactly 0: -expm1(0) is -0.0, which JSON would show as -0.0,
    so + 0.0 turns it into +0.0 (and leaves every other value as it is)."""
    log_miss_all = sum(math.log1p(-bloom.false_positive_probability()) for bloom in filters)
    return -math.expm1(log_miss_all) + 0.0


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["query"])

    @r.get(
        "/membership",
        response_model=MembershipAnswer,
        responses=errors(400, 404, e400="bad parameters, or the stream keeps no membership filters",
                         e404="unknown stream"),
        summary="Was a key seen on a stream in a time range? (Bloom filters: 'no' is certain)",
    )
    async def get_membership(
        stream: str = Query(..., description="a stream declaring membership (see /api/v1/streams)"),
        key: str = Query(..., description="the key to look up (the stream's membership field)"),
        start: str = Query("now-24h", alias="from", description="'now-24h', RFC 3339, epoch ms or s"),
        end: str = Query("now", alias="to"),
    ) -> MembershipAnswer:
        return await run_in_threadpool(membership, ctx, stream, key, start, end)

    return r
