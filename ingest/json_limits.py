"""Bounds on the JSON values an event may carry. Pure.

Declared fields are checked by the stream's validator (ingest/events.py), but an event's
undeclared fields are kept as they are, to be read by a later definition when the log is
reprocessed: without bounds one event could carry a 5 MB string, objects nested thousands
deep or a 4000-digit integer into the log and every reader of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class JsonLimits:
    max_depth: int = 16  # an event is depth 1; {"a": {"b": 1}} is depth 2
    max_string_chars: int = 64 * 1024  # keys and values
    max_int_digits: int = 40  # 2^128 has 39; epoch microseconds have 16

    @cached_property
    def max_int(self) -> int:
        return 10 ** self.max_int_digits


def violation(value: Any, limits: JsonLimits) -> str | None:
    """Which limit `value` crosses, naming where (`attrs.x[3]`), or None."""
    found = _walk(value, limits, 1)
    if found is None:
        return None
    path, problem = found
    return f"{''.join(path).lstrip('.') or 'value'}: {problem}"


def _walk(value: Any, limits: JsonLimits, depth: int) -> tuple[list[str], str] | None:
    """(the path to the problem, reversed, in pieces; the problem) or None. The path is built only
    on the way back from a problem: every event passes through here, so the common case does no
    string work at all."""
    kind = type(value)
    if kind is str:
        if len(value) > limits.max_string_chars:
            return [], f"string of {len(value)} characters exceeds max_string_chars ({limits.max_string_chars})"
    elif kind is int:
        # Compared by magnitude: str() of a huge int is the slow part.
        if not -limits.max_int < value < limits.max_int:
            return [], f"integer of more than {limits.max_int_digits} digits exceeds max_int_digits"
    elif kind is float:
        if value != value or value in (math.inf, -math.inf):
            return [], f"number {value!r} is not finite (JSON numbers past 1.8e308 are refused)"
    elif kind is dict:
        if depth > limits.max_depth:
            return [], f"nested deeper than max_depth ({limits.max_depth})"
        max_chars, max_int = limits.max_string_chars, limits.max_int
        for key, item in value.items():
            if len(key) > max_chars:
                return [], f"a key of {len(key)} characters exceeds max_string_chars ({max_chars})"
            # The common cases inline, without a call: every event's every field passes here.
            t = type(item)
            if t is str:
                if len(item) <= max_chars:
                    continue
            elif t is int:
                if -max_int < item < max_int:
                    continue
            elif t is float:
                if item - item == 0.0:  # finite: inf - inf and nan - nan are nan
                    continue
            elif t is bool or item is None:
                continue
            found = _walk(item, limits, depth + 1)
            if found:
                return [f".{key}", *found[0]], found[1]
    elif kind is list:
        if depth > limits.max_depth:
            return [], f"nested deeper than max_depth ({limits.max_depth})"
        for index, item in enumerate(value):
            found = _walk(item, limits, depth + 1)
            if found:
                return [f"[{index}]", *found[0]], found[1]
    return None

