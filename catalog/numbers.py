"""Whole numbers in the catalog (partitions, capacities, seeds, `times`...), refusing a boolean:
pydantic takes `true` for 1, so `partitions: true` loaded as one partition."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator


def no_booleans(value: object) -> object:
    """`value` itself; ValueError when it (or an item of a list of them) is a boolean."""
    if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value)):
        raise ValueError(f"expected a whole number, not a boolean ({str(value).lower()})")
    return value


Integer = Annotated[int, BeforeValidator(no_booleans)]
