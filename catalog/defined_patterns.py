"""Patterns defined through the API beside those of the configuration (issue 24). Pure: no I/O.

A pattern posted to `/api/v1/patterns` is checked exactly as one in the streams file (the same
PatternDef and check_patterns, so the same mistakes give the same reasons), against the
configured catalog with every other pattern in it (names must not collide, derived streams
and metrics included). The catalog a process runs with is the configured one with the stored
patterns added after its own: `catalog_with_patterns`.

Each pattern has a **definition id**: a hash of its declaration, with, for a stored pattern,
the store's version of it. The pipeline keeps with a pattern's state the id it was built with,
and starts the pattern from nothing when the id differs (a replaced pattern, or one deleted and
created again): state built by another definition would mean something else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from catalog.model import Catalog, CatalogReferenceError
from catalog.patterns import PatternDef


class PatternInvalid(ValueError):
    """A declaration that cannot be used; the message names the field (as a config path inside
    the pattern: `steps.1.where.ip.same_as`) and the reason, as the config file's checks word it.
    `field`: the first problem's path (the API's error body names it as `param`)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Skipped:
    """A stored pattern the configured catalog no longer accepts (a stream or field it read was
    removed from the file): left out, with the reason, rather than failing the whole service."""

    name: str
    reason: str


def declaration(pattern: PatternDef) -> dict:
    """A pattern's declaration as JSON, as written (defaults left out)."""
    return pattern.model_dump(mode="json", exclude_defaults=True)


def definition_id(pattern: PatternDef, stored_version: int | None = None) -> str:
    """What identifies a pattern's definition: sha256 of its declaration (16 hex digits), with the
    stored version for a pattern defined through the API (`…@7`)."""
    text = json.dumps(declaration(pattern), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return digest if stored_version is None else f"{digest}@{stored_version}"


def pattern_definition_id(catalog: Catalog, pattern: PatternDef) -> str:
    """The definition id of one of the catalog's patterns (with its stored version when defined
    through the API)."""
    return definition_id(pattern, catalog.defined_patterns.get(pattern.name))


def _with(configured: Catalog, patterns: Sequence[PatternDef], versions: Mapping[str, int] | None = None) -> Catalog:
    """`configured` with `patterns` after its own, checked. The streams and metrics are copied:
    expanding the derived streams writes into the new catalog's, never into `configured`'s."""
    data = {name: getattr(configured, name) for name in Catalog.model_fields}
    data["streams"], data["metrics"] = dict(configured.streams), dict(configured.metrics)
    data["patterns"] = (*configured.patterns, *patterns)
    data["defined_patterns"] = {p.name: (versions or {}).get(p.name, 0) for p in patterns}
    return Catalog.model_validate(data)


def _invalid(error: ValidationError, index: int) -> PatternInvalid:
    """The problems of pattern number `index` of a catalog, each as `path: reason` inside it."""
    problems, fields = [], []
    for e in error.errors():
        cause = (e.get("ctx") or {}).get("error")
        loc = tuple(cause.path) if isinstance(cause, CatalogReferenceError) else tuple(
            p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if loc[:2] == ("patterns", index):
            loc = loc[2:]
        message = str(cause).split(": ", 1)[-1] if isinstance(cause, CatalogReferenceError) else \
            e["msg"].removeprefix("Value error, ")
        fields.append('.'.join(map(str, loc)) or "pattern")
        problems.append(f"{fields[-1]}: {message}")
    return PatternInvalid("; ".join(problems) or str(error), fields[0] if fields else None)


def check_pattern(configured: Catalog, others: Sequence[PatternDef], data: object) -> PatternDef:
    """The declaration `data` as a PatternDef, checked against the configured catalog with
    `others` (the other stored patterns) in it; PatternInvalid with every reason."""
    if not isinstance(data, Mapping):
        raise PatternInvalid("pattern: the body must be a JSON object (a pattern's declaration)", "pattern")
    try:
        pattern = PatternDef.model_validate(dict(data))
    except ValidationError as exc:
        raise _invalid(exc, -1) from None
    try:
        _with(configured, [*others, pattern])
    except ValidationError as exc:
        raise _invalid(exc, len(configured.patterns) + len(others)) from None
    return pattern


def catalog_with_patterns(configured: Catalog, stored: Sequence[Mapping],
                          versions: Mapping[str, int] | None = None) -> tuple[Catalog, list[Skipped]]:
    """The configured catalog with the stored declarations added (in the order given), each with
    its stored version (`versions`, by name: `Catalog.defined_patterns`); one the catalog does not
    accept (any more) is left out and named with its reason."""
    kept: list[PatternDef] = []
    skipped: list[Skipped] = []
    for data in stored:
        name = str(data.get("name", "?")) if isinstance(data, Mapping) else "?"
        try:
            kept.append(check_pattern(configured, kept, data))
        except PatternInvalid as exc:
            skipped.append(Skipped(name, str(exc)))
    return (_with(configured, kept, versions) if kept else configured), skipped


def deleted_patterns(catalog: Catalog, applied: Mapping[str, object]) -> list[str]:
    """The patterns whose state a definition through the API built (`applied`: the pipeline's
    patterns with their PatternSizes, or anything with `definition_id`) that `catalog` no longer
    has: deleted, so their state goes. A provisioned pattern taken out of the file keeps its
    state, as it always did: only what the API defined is dropped for it."""
    current = {p.name for p in catalog.patterns}
    return sorted(name for name, sizes in applied.items()
                  if name not in current and "@" in (getattr(sizes, "definition_id", None) or ""))
