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


__all__ = ["exact_sum"]
