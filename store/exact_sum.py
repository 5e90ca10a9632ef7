"""The sum of a window's or a tier row's parts: exactly rounded, whatever their order.

math.fsum is exactly rounded, so a sum does not depend on the order parts came in; but it raises
where the exact sum is past a double (OverflowError: "intermediate overflow") or the parts hold
both infinities (ValueError), and a commit that raised failed at every replay. Ingest bounds
values (ingest/events.py MAX_ABS_VALUE) so that no sum of new events overflows; parts from
before that bound (in a store, or in the log) get the plain sum instead: infinite or NaN, which
the stats text stores as the largest double or null (store/row_codec.py) and a query answers as
null (query/compute.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def exact_sum(parts: Sequence[float]) -> float:
    try:
        return math.fsum(parts)
    except (OverflowError, ValueError):
        return float(sum(parts))


class ExactSumAggregate(list):
    """SQLite's exact_sum(x): exact_sum of a group's non-null values, NULL when none (as SUM).
    SQL SUM adds in the order rows come and rounds at each step, so a bucket's sum could differ
    from the pane roll-up's (1e16 + 1 - 1e16: 0.0 where fsum says 1.0); registered on every
    connection (store/connection.py). A list whose step is list.append: SQLite calls it once a
    row, and a C method there costs about half a Python one (a day of 30 s buckets by one
    dimension steps ~100 000 times)."""

    step = list.append

    def finalize(self) -> float | None:
        if None in self:  # a row without the field (json_extract's NULL); seldom, so tested in C first
            return exact_sum_of(self)
        return exact_sum(self) if self else None


def exact_sum_of(parts: Sequence[float | None] | None) -> float | None:
    """exact_sum of a group's values as a store gives them per row (PostgreSQL's array_agg):
    nulls skipped, None when none is left (as SQL SUM)."""
    values = [part for part in parts or () if part is not None]
    return exact_sum(values) if values else None


__all__ = ["ExactSumAggregate", "exact_sum", "exact_sum_of"]
