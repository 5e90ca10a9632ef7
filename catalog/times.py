"""Time as users write it: event times (epoch ms, epoch s, RFC 3339) and the instants and
durations of query parameters ('now-1h', a step of '1m'). The bottom layer: ingest validates
event times with it, and queries, lag and corrections read their ranges with it.

Every parser here is bounded: an instant lies in 1970-01-01..9999-12-31 (as event times do),
a duration is at most MAX_DURATION_MS, and anything else is a ValueError (BadParam for a
query parameter, naming it); so no arithmetic downstream can overflow a 64-bit integer or
meet a float infinity.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from catalog.durations import parse_duration_ms

# Numbers at or above this are epoch milliseconds, below it epoch seconds:
# 1e11 s is the year 5138, 1e11 ms is 1973, so the two ranges cannot be confused for real data.
EPOCH_MS_THRESHOLD = 100_000_000_000
MAX_EVENT_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _shown(value: Any) -> str:
    """A value for a message, cut short: a 4000-digit number or a 60 KB string is not worth echoing."""
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def parse_event_time_ms(value: Any) -> int:
    """Epoch ms, epoch s (int or float) or an RFC 3339 string with a zone -> epoch ms."""
    if isinstance(value, bool):
        raise ValueError("event time must be a number or an RFC 3339 string, not a boolean")
    if isinstance(value, int):
        # Not through float: math.isfinite() of an int past 1.8e308 raises OverflowError.
        ms = value if abs(value) >= EPOCH_MS_THRESHOLD else value * 1000
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("event time must be finite")
        ms = int(value) if abs(value) >= EPOCH_MS_THRESHOLD else int(round(value * 1000))
    elif isinstance(value, str):
        ms = _rfc3339_ms(value)
    else:
        raise ValueError("event time must be epoch ms, epoch seconds or an RFC 3339 string")
    if not 0 <= ms <= MAX_EVENT_TIME_MS:
        raise ValueError(f"event time {_shown(value)} is outside 1970..9999")
    return ms


# A date with no time, with or without a zone: RFC 3339 has no such timestamp, and midnight in which
# zone is a guess. Told apart from a missing zone, whose fix ('add Z') would not do here.
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[Zz]|[+-]\d{2}:?\d{2})?$")
# The seconds of a leap second (23:59:60 UTC): datetime has no second 60.
_LEAP_SECOND = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:)60(?:\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _rfc3339_ms(value: str) -> int:
    """An RFC 3339 timestamp with a zone -> epoch ms. RFC 3339 allows 't' and 'z' in lowercase
    (section 5.6, note); a leap second (23:59:60 UTC) is read as the last millisecond of its
    minute, 23:59:59.999: datetime and epoch time have no second 60, and the event still sorts
    before the next minute's (docs/ingest-and-api.md)."""
    text = value.strip().upper()  # its only letters are T and Z (and the names of no zones)
    if _DATE_ONLY.match(text):
        raise ValueError(f"event time {_shown(value)} is a date without a time; add one, e.g. {text[:10]}T00:00:00Z")
    leap = _LEAP_SECOND.match(text)
    if leap:
        text = f"{leap.group(1)}59.999{leap.group(2)}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"event time {_shown(value)} is not an RFC 3339 timestamp (e.g. 2026-11-21T10:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError(f"event time {_shown(value)} has no time zone; add 'Z' or an offset like +01:00")
    ms = int(round(parsed.timestamp() * 1000))
    if leap and ms % 86_400_000 != 86_399_999:  # 23:59:59.999 UTC, whatever the offset it was written in
        raise ValueError(f"event time {_shown(value)} has second 60, a leap second, which is only 23:59:60 UTC")
    return ms


class BadParam(ValueError):
    """A parameter's value is outside its contract. Pure: the parsers raise it, the API turns
    it into a 400 naming the parameter (api.errors.param_error)."""

    def __init__(self, param: str, reason: str):
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason


_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(.+))?$")
# Steps a dashboard would pick, smallest first; the default is the first giving <= TARGET_POINTS.
_NICE_STEPS_MS = [parse_duration_ms(s) for s in
                  ("1s", "5s", "10s", "15s", "30s", "1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h", "3h", "6h", "12h", "1d")]
TARGET_POINTS = 300
MIN_TIME_MS, MAX_TIME_MS = 0, MAX_EVENT_TIME_MS
TIME_RANGE_TEXT = "1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z"
INSTANT_FORMS = "'now', 'now-15m', an RFC 3339 time with a zone, epoch ms or epoch s"


def parse_instant_ms(text: str, now_ms: int, param: str = "time") -> int:
    """'now', 'now-15m', RFC 3339, epoch ms or epoch s -> epoch ms in the supported range;
    BadParam(param, reason) otherwise."""
    stripped = text.strip()
    match = _RELATIVE.match(stripped)
    if match:
        sign, amount = match.groups()
        if not sign:
            return now_ms
        try:
            delta = parse_duration_ms(amount)
        except ValueError as exc:
            raise BadParam(param, str(exc)) from None
        ms = now_ms - delta if sign == "-" else now_ms + delta
    else:
        number: float | None = None
        # An epoch is ASCII digits: Python's float() also reads '１２３' and '1_000' as numbers.
        if stripped.isascii() and "_" not in stripped:
            try:
                number = float(stripped)
            except ValueError:
                pass
        if number is not None and not math.isfinite(number):
            raise BadParam(param, f"{_shown(text)} is not a finite number")
        try:
            ms = parse_event_time_ms(stripped if number is None else int(number) if number.is_integer() else number)
        except ValueError as exc:
            raise BadParam(param, f"{_shown(text)} is not a time in {TIME_RANGE_TEXT} ({INSTANT_FORMS}): {exc}") from None
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise BadParam(param, f"{_shown(text)} is outside {TIME_RANGE_TEXT}")
    return ms


def parse_range_ms(start: str, end: str, now_ms: int,
                   params: tuple[str, str] = ("from", "to")) -> tuple[int, int]:
    """The [from, to) of a request in epoch ms; BadParam unless both parse and `to` is after `from`."""
    start_ms, end_ms = parse_instant_ms(start, now_ms, params[0]), parse_instant_ms(end, now_ms, params[1])
    if end_ms <= start_ms:
        raise BadParam(params[1], f"'{params[1]}' ({end}) must be after '{params[0]}' ({start})")
    return start_ms, end_ms


def parse_duration_param(text: str, param: str) -> int:
    """A duration parameter (step, window): bounded by parse_duration_ms; BadParam naming it."""
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise BadParam(param, str(exc)) from None


def default_step_ms(span_ms: int, pane_ms: int, granule_ms: int | None = None) -> int:
    """The first nice step giving <= TARGET_POINTS points over span_ms that is a multiple of
    granule_ms (the finest granule still kept over the range: query.model.kept_default_step;
    default the pane)."""
    unit = granule_ms or pane_ms
    for step in _NICE_STEPS_MS:
        if step % unit == 0 and span_ms / step <= TARGET_POINTS:
            return step
    return max(unit, -(-span_ms // TARGET_POINTS // unit) * unit)


def is_relative(text: str) -> bool:
    """'now' or 'now-15m': the instant moves with the clock."""
    return bool(_RELATIVE.match(text.strip()))
