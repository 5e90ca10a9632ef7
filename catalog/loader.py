"""Load a catalog from YAML, with errors that name the line and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from catalog.model import Catalog, CatalogReferenceError


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names file, line and problem."""


def _to_python(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        try:
            yaml.SafeLoader("").flatten_mapping(node)  # resolves "<<: *anchor" merge keys
        except yaml.YAMLError as exc:
            raise ConfigError(f"line {node.start_mark.line + 1}: {getattr(exc, 'problem', exc)}") from None
        out: dict = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node))
            if key in out:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            out[key] = _to_python(value_node, (*path, key), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*path, i), lines) for i, item in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _line_for(loc: tuple, lines: dict[tuple, int]) -> int | None:
    # pydantic's loc may carry model-internal parts; the longest known prefix is the best line.
    path = tuple(loc)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())


def parse_catalog(text: str, source: str = "<config>") -> Catalog:
    lines: dict[tuple, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: {where}: invalid YAML: {problem}") from None
    if root is None:
        raise ConfigError(f"{source}: the file is empty; it must declare 'streams'")
    try:
        data = _to_python(root, (), lines)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: line 1: the top level must be a mapping with 'streams' and 'metrics'")
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-")))
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, CatalogReferenceError):
                loc = cause.path
                line = _line_for(loc, lines)
                problems.append(f"{source}: line {line}: {cause}")
                continue
            line = _line_for(loc, lines)
            where = ".".join(str(p) for p in loc) or "top level"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{source}: line {line}: {where}: {message}")
        raise ConfigError("\n".join(problems)) from None


def load_catalog(path: str | Path) -> Catalog:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read stream configuration {path}: {exc.strerror}") from None
    return parse_catalog(text, source=str(path))
