"""A point as JSON text, the very bytes GET /api/v1/query writes of it (query.compute.answer_text;
api.query_routes.PointOut documents the shape), written here rather than by the generic encoder:
a day at 1-minute steps by 8 groups is 11 520 points, and building a dict per point for the
encoder cost about as much as computing them.

Formatting a point is mostly its floats' shortest repr (~8 ms for a day of 1-minute percentiles
with their error bounds, whichever encoder), so the text of a final point is written once, when
the point cache (store/point_cache.py) keeps it: kept beside the point there, handed to every
query of its window with it (store/kept_point.py KeptPoint), and kept in the store beside the
point (store/final_points.py), so that a new API process's first query reads it instead of
writing it. Raise final_points.POINTS_VERSION when point_text's output
changes: texts kept before would be served as they were written. Pure: no I/O.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from store.kept_point import KeptPoint
from store.rollup import Point


def json_text(obj: Any) -> str:
    """obj as JSON text, as a JSONResponse renders it (ensure_ascii off, no spaces, no NaN)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _number(x: Any, *, finite: bool = False) -> str:
    """A number as json.dumps writes it; finite=True: inf and NaN as null (what the API shows)."""
    if x is None:
        return "null"
    if type(x) is float:
        if math.isfinite(x):
            return float.__repr__(x)
        if finite:
            return "null"
    elif type(x) is int:  # not bool, which json writes as true/false
        return int.__repr__(x)
    return json_text(x)


@functools.lru_cache(maxsize=64)
def _kind_text(kind: str) -> str:
    """An error bound's kind as JSON: a handful of names ('kll', 'hll'...), each written once. A
    json.dumps call builds an encoder each time: ~1.7 us of a percentile point's ~5 us of text
    (best of 5, timeit), and a day at 1-minute steps is 1 440 points."""
    return json_text(kind)


def format_point(p: Point) -> str:
    """The point's text, written now."""
    e = p.error
    if e is None:
        error = "null"
    else:
        error = (f'{{"kind":{_kind_text(e.kind)},"lower":{_number(e.lower, finite=True)},'
                 f'"upper":{_number(e.upper, finite=True)},"relative_error":{_number(e.relative_error)},'
                 f'"rank_error":{_number(e.rank_error)},"expected_undercount":{_number(e.expected_undercount)}}}')
    return (f'{{"t":{p.t_ms:d},"value":{_number(p.value, finite=True)},"count":{p.count:d},'
            f'"final":{"true" if p.final else "false"},"revision":{p.revision:d},"error":{error}}}')


def point_text(p: Point) -> str:
    """The point's text: a kept point's as written when it was kept (store/kept_point.py), else written now."""
    if type(p) is KeptPoint:
        text = p.text
        if text is not None:
            return text
    return format_point(p)
