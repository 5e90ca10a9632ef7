"""Where a named pipeline's output lives (fan-out: several pipelines reading one log).

Two pipelines merging into one set of panes would count every event twice, so each pipeline
writes into a namespace of its own:

- the serving pipeline (setting `pipeline_name`, default `main`: the one the API serves) keeps
  the store's root namespace, today's layout: `<data_dir>/store.db`, or the tables the
  PostgreSQL DSN reaches (its search_path, usually `public`); existing stores keep working;
- any other named pipeline gets `<data_dir>/pipelines/<name>/store.db`, or the PostgreSQL
  schema `<root schema>__<name>` (e.g. `public__audit`) in the same database: the same tables,
  reached by setting the connection's search_path. Named after the root's schema, so two
  deployments sharing a database under different schemas keep their pipelines apart too; a name
  longer than PostgreSQL's 63 bytes is shortened with a hash (postgres_schema).

A namespace holds a whole store (panes, tiers, watermarks, dead letters, batch ids and
offsets), so a namespace is also what a versioned output of a reprocessing run (issue 16)
will be. Pure: names in, paths and identifiers out."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

# Pipeline names end up in paths, schema names and Kafka group ids: keep them plain.
PIPELINE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
ROOT = ""  # the serving pipeline's namespace
# Reprocessing runs' outputs (docs/reprocessing.md): a run's pipeline and namespace, and the output
# a switch replaced, kept to switch back to. Not names a user may give a pipeline of their own.
RUN_PREFIX = "reprocess-"
PREVIOUS_PREFIX = "previous-"


def check_pipeline_name(name: str) -> str:
    if not re.fullmatch(PIPELINE_NAME_PATTERN, name):
        raise ValueError(f"pipeline name {name!r}: use 1 to 48 letters, digits, '_' or '-', starting with a letter"
                         " or digit")
    return name


def check_user_pipeline_name(name: str) -> str:
    """A name a user gives a pipeline (`pipeline --name`, the setting pipeline_name): not one of
    the reprocessing runs' names, whose namespaces hold their outputs."""
    check_pipeline_name(name)
    for prefix in (RUN_PREFIX, PREVIOUS_PREFIX):
        if name.startswith(prefix):
            raise ValueError(f"pipeline name {name!r}: names starting with {prefix!r} are kept for reprocessing"
                             " runs and their outputs (`sketchboard reprocess`)")
    return name


def namespace_of(pipeline: str, serving_pipeline: str) -> str:
    """ROOT for the serving pipeline, else the pipeline's own name."""
    return ROOT if pipeline == serving_pipeline else check_pipeline_name(pipeline)


def sqlite_store_path(data_dir: Path, namespace: str) -> Path:
    return data_dir / "store.db" if namespace == ROOT else data_dir / "pipelines" / namespace / "store.db"


_MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1: it silently cuts a longer name, so two could meet
_HASH_CHARS = 16
# Before the hash of a shortened name: a character no pipeline name has, so a shortened name is
# never `<root>__<name>` of a name that fits (nor of any root: a root's namespace names follow "__").
_HASHED = "~"


def postgres_schema(namespace: str, root_schema: str) -> str:
    """The schema of a named pipeline's namespace beside the root's schema (the DSN's):
    `<root schema>__<name>`; when that is longer than PostgreSQL's 63 bytes (a long root schema,
    a reprocessing run of a long stream name), its first bytes, `~` and a hash of the whole, so
    every valid name has a valid schema of its own, the same on every call."""
    if namespace == ROOT:
        return root_schema
    schema = f"{root_schema}__{namespace}"
    if len(schema.encode()) <= _MAX_IDENTIFIER:
        return schema  # the names of before: existing stores keep theirs
    digest = hashlib.sha256(schema.encode()).hexdigest()[:_HASH_CHARS]
    keep = _MAX_IDENTIFIER - len(_HASHED) - _HASH_CHARS
    readable = schema.encode()[:keep].decode(errors="ignore")  # never half a multi-byte character
    return f"{readable}{_HASHED}{digest}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def describe(namespace: str) -> str:
    return "the store's root" if namespace == ROOT else f"the store's namespace {namespace!r}"
