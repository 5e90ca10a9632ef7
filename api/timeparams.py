"""Time parameters of queries: absolute or relative instants, durations, a default step."""

from __future__ import annotations

import re

from catalog import parse_duration_ms
from ingest.events import parse_event_time_ms

_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(.+))?$")
# Steps a dashboard would pick, smallest first; the default is the first giving <= TARGET_POINTS.
_NICE_STEPS_MS = [parse_duration_ms(s) for s in
                  ("1s", "5s", "10s", "15s", "30s", "1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h", "3h", "6h", "12h", "1d")]
TARGET_POINTS = 300


def parse_instant_ms(text: str, now_ms: int) -> int:
    """'now', 'now-15m', RFC 3339, epoch ms or epoch s."""
    text = text.strip()
    match = _RELATIVE.match(text)
    if match:
        sign, amount = match.groups()
        if not sign:
            return now_ms
        delta = parse_duration_ms(amount)
        return now_ms - delta if sign == "-" else now_ms + delta
    try:
        number = float(text)
    except ValueError:
        return parse_event_time_ms(text)
    return parse_event_time_ms(int(number) if number.is_integer() else number)


def parse_range_ms(start: str, end: str, now_ms: int) -> tuple[int, int]:
    """The [from, to) of a request in epoch ms; ValueError unless `to` is after `from`."""
    start_ms, end_ms = parse_instant_ms(start, now_ms), parse_instant_ms(end, now_ms)
    if end_ms <= start_ms:
        raise ValueError(f"'to' ({end}) must be after 'from' ({start})")
    return start_ms, end_ms


def default_step_ms(span_ms: int, pane_ms: int) -> int:
    for step in _NICE_STEPS_MS:
        if step % pane_ms == 0 and span_ms / step <= TARGET_POINTS:
            return step
    return max(pane_ms, -(-span_ms // TARGET_POINTS // pane_ms) * pane_ms)
