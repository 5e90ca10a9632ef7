"""A point as JSON text, the very bytes GET /api/v1/query writes of it (query.compute.answer_text;
api.query_routes.PointOut documents the shape), written here rather than by the generic encoder:
a day at 1-minute steps by 8 groups is 11 520 points, and building a dict per point for the
encoder cost about as much as computing them.

Formatting a point is mostly its floats' shortest repr (~8 ms for a day of 1-minute percentiles
with their error bounds, whichever encoder), so the text of a final point is written once: kept by
the point object, which the point cache (store/point_cache.py) hands to every query of its window,
and kept in the store beside the point (store/final_points.py), so that a new API process's first
query reads it instead of writing it. Raise final_points.POINTS_VERSION when point_text's output
changes: texts kept before would be served as they were written. Pure: no I/O.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Iterable
from itertools import repeat
from typing import Any

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


# The texts of the points a point cache holds (store/point_cache.py holds each point it keeps, by
# window or in a kept series, and lets go each it drops), by the point object: a kept point is
# final and never changes, and its cache hands the same object to every query of its window.
# Keyed by id(): the entry holds its point, so that id cannot be another point's while the entry
# is here; it counts its holders (a point may be kept by window and in a series), and goes with
# the last. Only those: a point computed for one answer (an empty window's, a group's exact stat)
# is never asked again. A text is written at its point's first answer (None until then), or given
# with it (the store kept it). Entries: [point, text or None, holders].
_TEXTS: dict[int, list] = {}
_lock = threading.Lock()  # the holders' count, under the API's query threads


def point_text(p: Point) -> str:
    """The point's text, written once for a point a point cache holds."""
    found = _TEXTS.get(id(p))
    if found is None:
        return format_point(p)
    if found[1] is not None:
        return found[1]
    found[1] = text = format_point(p)  # an entry let go meanwhile is out of _TEXTS: nothing brought back
    return text


def hold(p: Point, text: str | None = None) -> None:
    """A point cache keeps p (once more); text: its point_text where known (kept in the store)."""
    hold_many((p,), (text,))


def hold_many(points: Iterable[Point], texts: Iterable[str | None] | None = None) -> None:
    """hold() of each point (with its text, where given) under one hold of the lock: a chunk is
    60 points, a day of them 1 440."""
    with _lock:
        for p, text in zip(points, texts if texts is not None else repeat(None)):
            found = _TEXTS.get(id(p))
            if found is None:
                _TEXTS[id(p)] = [p, text, 1]
            else:
                found[2] += 1
                if found[1] is None:
                    found[1] = text


def let_go(p: Point) -> None:
    """A point cache no longer keeps p (once)."""
    with _lock:
        found = _TEXTS.get(id(p))
        if found is not None:
            found[2] -= 1
            if not found[2]:
                del _TEXTS[id(p)]
