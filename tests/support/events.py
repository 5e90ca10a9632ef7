"""Validating many events at once, as tests build them (the ingest route validates one at a
time and reports each rejection itself)."""

from __future__ import annotations

from typing import Any

from ingest.events import Event, EventValidator, Rejection


def validate_many(validator: EventValidator, raws: list[Any]) -> tuple[list[Event], list[Rejection]]:
    """(accepted events, rejections with their index and reason)."""
    accepted: list[Event] = []
    rejected: list[Rejection] = []
    for index, raw in enumerate(raws):
        try:
            accepted.append(validator.validate(raw))
        except ValueError as exc:
            rejected.append(Rejection(index, str(exc)))
    return accepted, rejected
