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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from catalog.durations import DurationMs

if TYPE_CHECKING:
    from catalog.model import StreamDef

# A PostgreSQL identifier Sketchboard creates or names (slot and publication names are lower
# case: PostgreSQL folds them, and a slot name allows only [a-z0-9_]).
_SLOT_NAME = r"^[a-z_][a-z0-9_]{0,62}$"
# schema.table or table, unquoted identifiers (quoted ones are not supported: the name is used as written).
_TABLE_NAME = r"^([A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# password=... in a key/value DSN, or user:password@ in a URL: a secret written into the config.
_PASSWORD_SPELLED = re.compile(r"(?:^|\s)password\s*=\s*(?!\$\{)|://[^/@\s:]+:(?!\$\{)[^@\s]*@", re.IGNORECASE)


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
    max_changes_per_poll: int = Field(default=10_000, ge=1, le=1_000_000)
    # The snapshot is read with a server-side cursor and appended this many rows at a time, so a
    # table of any size is never held in memory whole (ingest/cdc/follower.py).
    snapshot_chunk_rows: int = Field(default=10_000, ge=1, le=1_000_000)
    # While the table is quiet, a heartbeat (pg_logical_emit_message) this often lets the slot be
    # confirmed past the database's other WAL, so the slot does not make it keep that WAL.
    heartbeat_interval: DurationMs = 10_000

    @model_validator(mode="after")
    def _no_secret(self) -> CdcSourceDef:
        if _PASSWORD_SPELLED.search(self.postgres_dsn):
            raise ValueError("postgres_dsn spells out a password: write it as ${NAME} and set the environment"
                             " variable NAME (or use a .pgpass file), so the configuration holds no secret")
        return self


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


def resolve_dsn(dsn: str, env: Mapping[str, str] | None = None) -> str:
    """The DSN with each ${NAME} replaced by the environment's value; ValueError naming a
    variable that is not set."""
    env = os.environ if env is None else env
    missing = [name for name in _ENV_REF.findall(dsn) if name not in env]
    if missing:
        raise ValueError(f"postgres_dsn refers to the environment variable {missing[0]}, which is not set")
    return _ENV_REF.sub(lambda m: env[m.group(1)], dsn)


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
    return catalog.model_copy(update={"streams": streams})
