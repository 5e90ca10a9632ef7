"""Human durations ("500ms", "10s", "5m", "1h", "1d", "1w") as integer milliseconds."""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration_ms(text: str | int | float) -> int:
    """Parse a duration; a bare number means seconds (as in Prometheus flags)."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text != text or text in (float("inf"), float("-inf")):
            raise ValueError(f"not a duration: {text!r} (must be finite)")
        if text < 0:
            raise ValueError(f"duration must not be negative: {text!r}")
        return int(round(text * 1000))
    match = _PATTERN.match(str(text))
    if not match:
        raise ValueError(
            f"not a duration: {text!r} (expected a number and a unit: ms, s, m, h, d or w, e.g. '10s')"
        )
    number, unit = match.groups()
    return int(round(float(number) * _UNITS_MS[unit]))


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling, e.g. 600000 -> '10m'."""
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
