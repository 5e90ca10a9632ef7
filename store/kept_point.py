"""A final point as the point cache keeps it (store/point_cache.py): a plain tuple of numbers
and strings, out of the cyclic garbage collector's reach, handed out as a KeptPoint.

The collector's full pass walks every object it tracks. A named tuple (Point, ErrorBound) is
tracked for its whole life (CPython stops tracking only exact tuples of untracked values), so a
cache of 200 000 points as Points, with their error bounds and entries, was ~800 000 tracked
objects and each full pass over them 230-310 ms: a query that came during one waited that long
(issue 27's bench, its remaining p99 spikes). Kept as exact tuples of ints, floats, strings and
None, a cache's points are untracked within the collector's first few passes over them (a tuple
once the tuples in it are); a query's points
are made from them as it asks (~0.5-1 us a point), and die with its answer. Pure: no I/O.
"""

from __future__ import annotations

from store.rollup import ErrorBound, Point

# (t_ms, value, count, final, revision, error): error as a plain tuple in ErrorBound's order, or None
Form = tuple

_new = tuple.__new__


class KeptPoint(Point):
    """A kept point as a query gets it: a Point with its text, the bytes GET /api/v1/query writes of
    it (store/point_text.py), written once when the point was kept. Not a field: it compares and
    unpacks as the Point it is (pickled, it keeps its text); a copy made of it (_replace) has none."""

    text: str | None = None


def form(p: Point) -> Form:
    """The point as a cache keeps it."""
    e = p[5]
    return (p[0], p[1], p[2], p[3], p[4], None if e is None else (*e,))


def served(kept: Form, text: str | None) -> KeptPoint:
    """The kept point as a query gets it, with its text."""
    t, value, count, final, revision, e = kept
    p = _new(KeptPoint, (t, value, count, final, revision, None if e is None else _new(ErrorBound, e)))
    p.text = text
    return p
