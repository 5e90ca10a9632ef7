"""Change data capture sources (`source:` of a `kind: table` stream): a table of the user's own
PostgreSQL database feeds the table stream instead of producers (ingest/cdc/, docs/tables.md,
"Change data capture").

The DSN names no secret: a password (or any other part) comes from the environment with
`${NAME}`, replaced when the follower connects (`resolve_dsn`), so the configuration file can be
committed and shown (`GET /api/v1/cdc` shows the DSN as written, never resolved). A DSN that
spells a password out is refused with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from catalog.durations import DurationMs
from catalog.numbers import Integer

if TYPE_CHECKING:
    from catalog.model import StreamDef

# A PostgreSQL identifier Sketchboard creates or names (slot and publication names are lower
# case: PostgreSQL folds them, and a slot name allows only [a-z0-9_]).
_SLOT_NAME = r"^[a-z_][a-z0-9_]{0,62}$"
# schema.table or table, unquoted identifiers (quoted ones are not supported: the name is used as written).
_TABLE_NAME = r"^([A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A secret written into the config: password=... in a key/value DSN (a reference may be quoted:
# password='${PW}'), user:password@ in a URL, or password=... in a URL's query string.
_PASSWORD_SPELLED = re.compile(
    r"(?:^|\s)password\s*=(?!\s*'?\$\{)|://[^/@\s:]+:(?!\$\{)[^@\s]*@|[?&]password=(?!\$\{)", re.IGNORECASE)
# libpq reads a DSN that starts so as a URL, any other as key=value pairs.
_URL_PREFIXES = ("postgresql://", "postgres://")
# The whitespace that separates libpq's key=value pairs (C's isspace).
_SPACE = frozenset(" \t\n\v\f\r")


class CdcSourceDef(BaseModel):
    """Where a table's rows come from: `table` of the database at `postgres_dsn`, keyed by `key`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    postgres_dsn: Annotated[str, Field(min_length=1)]
    table: Annotated[str, Field(pattern=_TABLE_NAME)]
    key: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")]
    # Default names: sketchboard_<stream> (set by the catalog: `slot_name`/`publication_name`).
    publication: Annotated[str, Field(pattern=_SLOT_NAME)] | None = None
    slot: Annotated[str, Field(pattern=_SLOT_NAME)] | None = None
    poll_interval: DurationMs = 1_000  # how often the slot is asked for changes when idle
    max_changes_per_poll: Integer = Field(default=10_000, ge=1, le=1_000_000)
    # The snapshot is read with a server-side cursor and appended this many rows at a time, so a
    # table of any size is never held in memory whole (ingest/cdc/follower.py).
    snapshot_chunk_rows: Integer = Field(default=10_000, ge=1, le=1_000_000)
    # While the table is quiet, a heartbeat (pg_logical_emit_message) this often lets the slot be
    # confirmed past the database's other WAL, so the slot does not make it keep that WAL.
    heartbeat_interval: DurationMs = 10_000

    @model_validator(mode="after")
    def _no_secret(self) -> CdcSourceDef:
        if _spells_password(self.postgres_dsn):
            raise ValueError("postgres_dsn spells out a password: write it as ${NAME} and set the environment"
                             " variable NAME (or use a .pgpass file), so the configuration holds no secret")
        return self


def _spells_password(dsn: str) -> bool:
    # libpq percent-decodes a URL's query keywords too: ?pass%77ord= is a password.
    return bool(_PASSWORD_SPELLED.search(dsn) or (_is_url(dsn) and _PASSWORD_SPELLED.search(unquote(dsn))))


def slot_name(stream: StreamDef) -> str:
    assert stream.source is not None
    return stream.source.slot or f"sketchboard_{stream.name.lower()}"


def publication_name(stream: StreamDef) -> str:
    assert stream.source is not None
    return stream.source.publication or f"sketchboard_{stream.name.lower()}"


def check_source(stream: StreamDef) -> None:
    """A source feeds a table only (ValueError naming the problem)."""
    if stream.source is None:
        return
    if stream.kind != "table":
        raise ValueError("source (change data capture) feeds a table: declare kind: table")
    if not re.match(_SLOT_NAME, slot_name(stream)):
        raise ValueError(f"the default slot name {slot_name(stream)!r} is not a valid replication slot name"
                         " (lower case letters, digits, _): set source.slot")


def check_catalog_sources(catalog) -> None:
    """No two tables share a replication slot or a publication: a slot's changes are confirmed
    by the one follower reading it, so a second table's follower would take (and confirm) the
    first one's changes, and a publication names the one table it was created for. A default name
    (`sketchboard_<stream lowercased>`) counts as written: `Users` and `users` collide. Raises
    CatalogReferenceError at the later declaration, naming the earlier one."""
    from catalog.model import CatalogReferenceError

    for what, field, name_of in (("replication slot", "slot", slot_name),
                                 ("publication", "publication", publication_name)):
        taken: dict[str, str] = {}  # name -> the stream whose source has it
        for name, stream in catalog.streams.items():
            if stream.source is None:
                continue
            used = name_of(stream)
            if used in taken:
                written = getattr(stream.source, field) is not None
                other = catalog.streams[taken[used]]
                how = "its default name" if getattr(other.source, field) is None else f"its {field}"
                raise CatalogReferenceError(
                    ("streams", name, "source", field) if written else ("streams", name, "source"),
                    f"the {what} {used!r}{'' if written else ' (the default name)'} is already that of table"
                    f" {taken[used]!r} ({how}): each table's source needs a {what} of its own (set source.{field})")
            taken[used] = name


def resolve_dsn(dsn: str, env: Mapping[str, str] | None = None) -> str:
    """The DSN with each ${NAME} replaced by the environment's value; ValueError naming a
    variable that is not set. A value is written as libpq reads it back whatever it holds
    (spaces, quotes, `host=`...): within a key=value pair's value, quoted and escaped; in a URL,
    percent-encoded. So a value can neither fail to parse nor set another parameter. A reference
    outside any value (`${DATABASE_URL}` as the whole DSN) is DSN text by intent: written as it is."""
    env = os.environ if env is None else env
    missing = [name for name in _ENV_REF.findall(dsn) if name not in env]
    if missing:
        raise ValueError(f"postgres_dsn refers to the environment variable {missing[0]}, which is not set")
    if _is_url(dsn):
        return _substitute(dsn, env, lambda value: quote(value, safe=""))
    return "".join(_resolved_part(part, kind, env) for part, kind in _key_value_parts(dsn))


def _is_url(dsn: str) -> bool:
    return dsn.startswith(_URL_PREFIXES)


def _substitute(text: str, env: Mapping[str, str], written: Callable[[str], str]) -> str:
    return _ENV_REF.sub(lambda m: written(env[m.group(1)]), text)


def _escaped(value: str) -> str:
    """`value` as the inside of a quoted libpq value: \\ and \\' escaped."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _resolved_part(part: str, kind: str, env: Mapping[str, str]) -> str:
    if kind in ("quoted", "unterminated"):  # '...': the references' values escaped inside the quotes
        return _substitute(part, env, _escaped)  # (unterminated: libpq still says so)
    if kind == "unquoted" and _ENV_REF.search(part):  # quoted now, so no value may end it early
        return "'" + _unquoted_as_quoted(part, env) + "'"
    return _substitute(part, env, str) if kind == "other" else part


def _unquoted_as_quoted(value: str, env: Mapping[str, str]) -> str:
    """The inside of a quoted value equal to the unquoted `value` with its references resolved.
    A backslash escapes the next character in both forms; a quote needs one only when quoted."""
    out, i = [], 0
    while i < len(value):
        ref = _ENV_REF.match(value, i)
        if ref:
            out.append(_escaped(env[ref.group(1)]))
            i = ref.end()
        elif value[i] == "\\":  # kept escaping its character (a trailing one escapes nothing: libpq drops it)
            out.append(value[i:i + 2] if i + 1 < len(value) else "")
            i += 2
        else:
            out.append("\\'" if value[i] == "'" else value[i])
            i += 1
    return "".join(out)


def _key_value_parts(dsn: str) -> list[tuple[str, str]]:
    """`dsn` cut as libpq's key=value parser reads it: each part's text and kind, "quoted",
    "unterminated" or "unquoted" for a value, "other" for the rest (keys, '=', spaces, anything
    unparsable, which libpq reports when connecting). The parts, joined, are `dsn`."""
    parts: list[tuple[str, str]] = []
    i, n = 0, len(dsn)
    while i < n:
        start = i
        while i < n and dsn[i] in _SPACE:
            i += 1
        while i < n and dsn[i] != "=" and dsn[i] not in _SPACE:  # the key
            i += 1
        while i < n and dsn[i] in _SPACE:
            i += 1
        if i >= n or dsn[i] != "=":  # no '=': not a pair (libpq refuses it), written as it is
            parts.append((dsn[start:], "other"))
            return parts
        i += 1
        while i < n and dsn[i] in _SPACE:
            i += 1
        parts.append((dsn[start:i], "other"))
        end, kind = _value_end(dsn, i)
        parts.append((dsn[i:end], kind))
        i = end
    return parts


def _value_end(dsn: str, i: int) -> tuple[int, str]:
    """Where the value starting at `i` ends, and its kind: after its closing quote ("quoted"; none:
    "unterminated"), or at the next space ("unquoted"); a backslash escapes the next character."""
    n = len(dsn)
    if i < n and dsn[i] == "'":
        i += 1
        while i < n and dsn[i] != "'":
            i += 2 if dsn[i] == "\\" else 1
        return (i + 1, "quoted") if i < n else (n, "unterminated")
    while i < n and dsn[i] not in _SPACE:
        i += 2 if dsn[i] == "\\" else 1
    return min(i, n), "unquoted"


def postgres_fed_tables(catalog) -> list[StreamDef]:
    """The table streams a database may feed wholesale (`with_postgres_sources`): those declared
    as tables, without a source of their own, not generated (a view's change stream)."""
    return [s for s in catalog.streams.values() if s.kind == "table" and s.source is None and not s.derived_from]


def with_postgres_sources(catalog, dsn: str, schema: str):
    """`catalog` with each of its `postgres_fed_tables` fed by change data capture from the table
    `<schema>.<stream>` of the database at `dsn`, keyed by the stream's key_field (the demo's
    tables from PostgreSQL: demo/pg_tables.py). ValueError: the DSN or a name is refused."""
    streams = dict(catalog.streams)
    for stream in postgres_fed_tables(catalog):
        try:
            source = CdcSourceDef(postgres_dsn=dsn, table=f"{schema}.{stream.name}", key=stream.key_field)
        except ValidationError as exc:  # its reasons, without pydantic's framing
            raise ValueError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
        streams[stream.name] = fed = stream.model_copy(update={"source": source})
        check_source(fed)
    fed_catalog = catalog.model_copy(update={"streams": streams})
    check_catalog_sources(fed_catalog)
    return fed_catalog
