"""Load a catalog from YAML, with errors that name the line and the problem."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from catalog.model import Catalog, CatalogReferenceError


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names file, line and problem."""


_VALUE_TAG = "tag:yaml.org,2002:value"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)\Z")


def _int_form(text: str) -> str:
    """How YAML 1.1 reads an integer written otherwise than in decimal digits."""
    digits = text.lstrip("+-")
    if ":" in digits:
        return "YAML 1.1 base 60"
    if "_" in digits:
        return "YAML 1.1 drops the underscores"
    if digits.startswith("0x"):
        return "YAML 1.1 hexadecimal"
    if digits.startswith("0b"):
        return "YAML 1.1 binary"
    return "YAML 1.1 octal"


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _Converter:
    """The Python value of a composed YAML document, as yaml.safe_load builds it. Each node is
    converted once: an alias is the node it refers to, so its value is shared, not built again
    per use (a few hundred bytes of nested aliases would otherwise expand to millions of values).
    Scalars are built by the SafeLoader's own constructor: an empty value is null, as `~` is."""

    def __init__(self) -> None:
        self._constructor = yaml.SafeLoader("")
        self._done: dict[int, Any] = {}  # id(node) -> its value; the nodes live as long as the root
        self._open: set[int] = set()  # the nodes being converted: one met again is inside itself

    def value(self, node: yaml.Node) -> Any:
        done = self._done.get(id(node), self)
        if done is not self:
            return done
        if id(node) in self._open:
            raise ConfigError(f"line {_line(node)}: an alias refers to a node that contains it"
                              " (a recursive anchor): its value would never end")
        if node.tag == _VALUE_TAG and isinstance(node, yaml.ScalarNode):
            return node.value  # a plain `=`, which YAML 1.1 resolves to a "value" tag: the text
        if node.tag not in self._constructor.yaml_constructors:
            raise ConfigError(f"line {_line(node)}: the tag {node.tag!r} is not supported"
                              " (quote the value if it is text)")
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                out: Any = self._mapping(node)
            elif isinstance(node, yaml.SequenceNode):
                out = [self.value(item) for item in node.value]
            else:
                out = self._scalar(node)
        finally:
            self._open.discard(id(node))
        self._done[id(node)] = out
        return out

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            value = self._constructor.construct_object(node)
        except Exception:  # a value its (explicit) tag cannot read: `!!int abc`, `!!timestamp x`
            raise ConfigError(f"line {_line(node)}: {node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}") from None
        if node.tag == _INT_TAG and node.style is None and not _DECIMAL.match(node.value):
            # YAML 1.1 reads 0123 as octal 83, 0x1F as 31, 1_000 as 1000 and 1:30 as 90: a zip code
            # or a where literal would change silently.
            raise ConfigError(f"line {_line(node)}: {node.value} is read as the number {value}"
                              f" ({_int_form(node.value)}): write {value}, or quote it ('{node.value}') if it is text")
        return value

    def _key(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            kind = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
            raise ConfigError(f"line {_line(node)}: a key must be a plain value such as a name, not a {kind}")
        return self.value(node)

    def _mapping(self, node: yaml.MappingNode) -> dict:
        """A mapping with its merge keys (`<<: *base`, `<<: [*a, *b]`) resolved as the YAML merge-key
        spec says: a key written in the mapping wins over a merged one, and an earlier merged mapping
        over a later one. Only the keys written in the mapping itself can be duplicates."""
        explicit: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self._key(key_node)
            if key in explicit:
                raise ConfigError(f"line {_line(key_node)}: duplicate key {key!r}")
            explicit[key] = self.value(value_node)
        out: dict = {}
        for merged in self._merged(node):
            for key, value in self.value(merged).items():
                out.setdefault(key, value)
        out.update(explicit)
        return out

    def _merged(self, node: yaml.MappingNode) -> list[yaml.MappingNode]:
        """The mappings `node` merges (`<<`), first to last."""
        merges = [(key_node, value_node) for key_node, value_node in node.value if key_node.tag == _MERGE_TAG]
        if len(merges) > 1:
            raise ConfigError(f"line {_line(merges[1][0])}: duplicate key '<<' (merge several mappings with"
                              " one key: <<: [*a, *b])")
        out = []
        for key_node, value_node in merges:
            items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for item in items:
                if not isinstance(item, yaml.MappingNode):
                    raise ConfigError(f"line {_line(item)}: a merge key (<<) takes a mapping or a list of"
                                      " mappings, e.g. <<: *base")
                out.append(item)
        return out

    def child(self, node: yaml.Node, part: object) -> yaml.Node | None:
        """The node at `part` (a key or an index) under `node`, None where there is none; a merged
        key is found in the mapping it came from."""
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.tag != _MERGE_TAG and self._done.get(id(key_node), self) == part:
                    return value_node
            for merged in self._merged(node):
                found = self.child(merged, part)
                if found is not None:
                    return found
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            return node.value[part]
        return None

    def line_for(self, root: yaml.Node, loc: tuple) -> int:
        """The line of the deepest node `loc` reaches (pydantic's loc may carry model-internal
        parts, or name a generated entry: the longest prefix found in the file is the best line)."""
        node = root
        for part in loc:
            child = self.child(node, part)
            if child is None:
                break
            node = child
        return _line(node)


class YamlDocument:
    """A YAML file's value, read strictly (see read_yaml), and the line of any part of it."""

    def __init__(self, value: Any, root: yaml.Node | None, converter: _Converter):
        self.value = value
        self._root = root
        self._converter = converter

    def line(self, loc: tuple = ()) -> int:
        """The line of the deepest part of the file `loc` (keys and indexes from the top) reaches."""
        return 1 if self._root is None else self._converter.line_for(self._root, loc)


def parse_yaml(text: str, source: str = "<config>") -> YamlDocument:
    """`text`'s YAML value as yaml.safe_load reads it, but strictly: a key written twice, a tag,
    an integer not written in decimal, a recursive anchor or a key that is a list is a
    ConfigError naming `source` and the line; merge keys are resolved as the YAML spec has them.
    Every YAML file of the service (streams, settings, alert rules, dashboards) is read so."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ConfigError(f"{source}: somewhere: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: {where}: invalid YAML: {problem}") from None
    converter = _Converter()
    if root is None:
        return YamlDocument(None, None, converter)
    try:
        data = converter.value(root)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: line {_line(root)}: the YAML is nested too deeply") from None
    return YamlDocument(data, root, converter)


def read_yaml(path: str | Path, what: str = "configuration") -> YamlDocument:
    """The YAML file at `path`, read as parse_yaml reads text; ConfigError naming the file for one
    that cannot be read or is not UTF-8 (with the line of the first byte that is not)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be"
                          " decoded (save the file as UTF-8)") from None
    return parse_yaml(text, str(path))


def parse_catalog(text: str, source: str = "<config>") -> Catalog:
    return _catalog_of(parse_yaml(text, source), source)


def load_catalog(path: str | Path) -> Catalog:
    return _catalog_of(read_yaml(path, "stream configuration"), str(Path(path)))


def _catalog_of(document: YamlDocument, source: str) -> Catalog:
    data = document.value
    if data is None:
        raise ConfigError(f"{source}: the file is empty; it must declare 'streams'")
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
                line = document.line(loc)
                problems.append(f"{source}: line {line}: {cause}")
                continue
            line = document.line(loc)
            where = ".".join(str(p) for p in loc) or "top level"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{source}: line {line}: {where}: {message}")
        raise ConfigError("\n".join(problems)) from None
