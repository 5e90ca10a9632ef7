"""KLL quantile sketches over doubles (DataSketches KLL), mergeable across panes and processes."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import datasketches as ds

DEFAULT_K = 200  # normalized rank error ~1.33 % (99 % confidence, single quantile)


@dataclass(frozen=True)
class QuantileEstimate:
    quantile: float  # the asked rank in [0, 1]
    value: float
    rank_error: float  # +/- normalized rank error at 99 % confidence
    lower: float  # the values at rank quantile -/+ rank_error: the true quantile lies between
    upper: float


class KllSketch:
    def __init__(self, k: int = DEFAULT_K, _sketch: ds.kll_doubles_sketch | None = None):
        self._sketch = _sketch if _sketch is not None else ds.kll_doubles_sketch(k)

    @classmethod
    def from_bytes(cls, data: bytes) -> KllSketch:
        return cls(_sketch=ds.kll_doubles_sketch.deserialize(bytes(data)))

    @classmethod
    def merge_all(cls, parts: Iterable[bytes | KllSketch], k: int = DEFAULT_K) -> KllSketch:
        """One sketch of all parts (none of them changed). The first part of the same k is the
        start (deserialized, or copied: ~2 us where merging it into an empty sketch cost ~100 us
        for a large one, and the merged answer is the same: exact below k items, else within
        the same rank error, as KLL's compactions are random either way)."""
        out = None
        for part in parts:
            sketch = part._sketch if isinstance(part, KllSketch) else ds.kll_doubles_sketch.deserialize(bytes(part))
            if out is None and sketch.k == k:
                out = copy.copy(sketch) if isinstance(part, KllSketch) else sketch
                continue
            if out is None:
                out = ds.kll_doubles_sketch(k)
            out.merge(sketch)
        return cls(_sketch=out if out is not None else ds.kll_doubles_sketch(k))

    @property
    def k(self) -> int:
        return self._sketch.k

    @property
    def n(self) -> int:
        return self._sketch.n

    def is_empty(self) -> bool:
        return self._sketch.is_empty()

    def update(self, value: float) -> None:
        self._sketch.update(float(value))

    def update_all(self, values) -> None:
        """Update with every value of a float64 numpy array, in order: one call into DataSketches."""
        self._sketch.update(values)

    def copy(self) -> KllSketch:
        return KllSketch(_sketch=copy.copy(self._sketch))

    def merge_in(self, other: KllSketch) -> None:
        """Merge `other` into this sketch (other unchanged): merge_all([self, other]) without the
        copy of self, for a running merge that nothing else holds (a sliding window's back stack)."""
        self._sketch.merge(other._sketch)

    def quantile(self, q: float) -> QuantileEstimate | None:
        """The value at rank q, with the value range its rank error allows; None when empty."""
        found = self.quantile_bounds(q)
        if found is None:
            return None
        value, lower, upper, eps = found
        return QuantileEstimate(quantile=q, value=value, rank_error=eps, lower=lower, upper=upper)

    def quantile_bounds(self, q: float) -> tuple[float, float, float, float] | None:
        """quantile() as a plain tuple (value, lower, upper, rank error), for callers that make
        one per window of a day (no QuantileEstimate built)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        s = self._sketch
        if s.is_empty():
            return None
        eps = s.normalized_rank_error(False)
        # One call for the three ranks: the sketch's sorted view is built once, not three times.
        low_rank, high_rank = q - eps, q + eps
        value, lower, upper = s.get_quantiles([q, max(0.0, low_rank), min(1.0, high_rank)])
        # Ranks 0 and 1 answer the smallest and largest value the sketch kept, which a compaction may
        # have dropped; it knows the true ones: p0 and p100 are them, and a range reaching either
        # end holds it (stat=p100 answered under the max, with a range that left it out).
        if q == 0.0:
            value = s.get_min_value()
        elif q == 1.0:
            value = s.get_max_value()
        if low_rank <= 0.0:
            lower = s.get_min_value()
        if high_rank >= 1.0:
            upper = s.get_max_value()
        # 0.0 and -0.0 compare equal, so which of them the sorted view holds first depends on the
        # order the sketch was merged in (a cached chunk's against the whole range's): + 0.0 makes
        # either 0.0, and every other value stays as it is.
        return value + 0.0, lower + 0.0, upper + 0.0, eps

    def rank(self, value: float) -> float:
        return self._sketch.get_rank(float(value))

    def to_bytes(self) -> bytes:
        return bytes(self._sketch.serialize())
