"""Human durations ("500ms", "10s", "5m", "1h", "1d", "1w") as integer milliseconds; Spark's trigger
intervals ("100 milliseconds") too."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# ASCII digits only: \d would also take other scripts' digits, which the contract does not promise.
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$", re.ASCII)

# No duration Sketchboard uses (a retention, window, step, silence, `for`) needs more than a
# century. The bound keeps every `now ± duration` and `start + window` far inside 64-bit
# integers (SQLite's, Spark's) and rejects what would otherwise overflow to a float infinity.
MAX_DURATION_MS = 36_500 * 86_400_000
MAX_DURATION_TEXT = "36500d (100 years)"


def _shown(text: object) -> str:
    """The offending value for a message, cut short: a 400-digit number is not worth echoing."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def parse_duration_ms(text: str | int | float) -> int:
    """Parse a duration; a bare number (an int or a float, not text: text needs a unit) means
    seconds (as in Prometheus flags). ValueError, naming the value, unless it is a finite,
    non-negative duration of at most MAX_DURATION_MS."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"not a duration: {text!r} (must be finite)")
        if text < 0:
            raise ValueError(f"duration must not be negative: {_shown(text)}")
        ms: float | int = text * 1000
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise ValueError(
                f"not a duration: {_shown(text)} (expected a number and a unit: ms, s, m, h, d or w, e.g. '10s')"
            )
        number, unit = match.groups()
        # float() of a few hundred digits is inf, and int(inf) raises OverflowError: bound it first.
        ms = float(number) * _UNITS_MS[unit]
    if not ms <= MAX_DURATION_MS:
        raise ValueError(f"duration {_shown(text)} exceeds the maximum of {MAX_DURATION_TEXT}")
    return int(round(ms))


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling, e.g. 600000 -> '10m'."""
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# What a duration accepts, for JSON Schema (the OpenAPI document of the alert rule bodies):
# without it the schema would say "integer" (the parsed type) while the API takes "5m".
DURATION_JSON_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*(ms|s|m|h|d|w)\s*$",
         "description": "a number and a unit (ms, s, m, h, d, w), at most 36500d"},
        {"type": "number", "minimum": 0, "maximum": MAX_DURATION_MS // 1000, "description": "seconds"},
    ],
}
# Serialised as text ("10s"), so a dumped catalog parses back to the same values.
DurationMs = Annotated[int, BeforeValidator(parse_duration_ms), PlainSerializer(format_duration_ms, return_type=str),
                       WithJsonSchema(DURATION_JSON_SCHEMA)]


# Spark's processing-time trigger intervals ("100 milliseconds", "1 second"): the pipeline's
# `trigger_interval`, which its own serving loop times as Spark would (aggregates/driver_serving.py),
# accepted and refused as Spark 4's Trigger.ProcessingTime does (checked against it: no "500ms" or
# "2s", no "mins", a fraction on seconds only).
_SPARK_UNIT_MS = {"week": 604_800_000, "day": 86_400_000, "hour": 3_600_000, "minute": 60_000, "second": 1000,
                  "millisecond": 1, "microsecond": 0.001}
_SPARK_NUMBER = re.compile(r"^\d+(\.\d+)?$", re.ASCII)


def trigger_ms(text: str) -> int:
    """A trigger interval as Spark's processing-time trigger takes it ('100 milliseconds', '1 second',
    '1 minute 30 seconds', 'interval 10 seconds') in ms. ValueError naming the value otherwise."""
    words = str(text).strip().lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        raise ValueError(f"not a trigger interval: {text!r} (expected e.g. '100 milliseconds' or '1 second')")
    total = 0.0
    for number, unit in zip(words[::2], words[1::2], strict=True):
        unit = unit[:-1] if unit.endswith("s") and unit[:-1] in _SPARK_UNIT_MS else unit  # plural
        if not _SPARK_NUMBER.match(number):
            raise ValueError(f"not a trigger interval: {text!r} ({number!r} is not a number)")
        if unit not in _SPARK_UNIT_MS:
            raise ValueError(f"not a trigger interval: {text!r} (unknown unit {unit!r}: week, day, hour, minute,"
                             " second, millisecond or microsecond, as Spark spells them)")
        if "." in number and unit != "second":
            raise ValueError(f"not a trigger interval: {text!r} (Spark takes a fraction of seconds only)")
        total += float(number) * _SPARK_UNIT_MS[unit]
    if not total <= MAX_DURATION_MS:
        raise ValueError(f"trigger interval {_shown(text)} exceeds the maximum of {MAX_DURATION_TEXT}")
    return int(total)
