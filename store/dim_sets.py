"""A stream's dimension combinations, numbered: pane, tier and change rows keep the number
(table dim_sets, store/tables.py) instead of the combination's JSON text, ~100 bytes that were
a third of a pane row and most of a change record. SQL over a DB-API cursor, the same for both
backends (`p` is the backend's placeholder).

Numbers are per stream, 1, 2, ... in the order combinations first come, given out inside the
commit's transaction (commits are serialized by the backends, so the highest number read is
still the highest when the new ones are written). Per stream because a switch (store/switch.py)
moves a stream's rows between namespaces wholesale: its dim_sets rows go with them, so the
numbers keep their meaning there. Nothing is kept across transactions (a switch may give a
stream another numbering); within a batch's commit (`kept`), a text is looked up once, though the
commit numbers its texts twice per table, to load the rows it merges into and to save them.
Readers join dim_sets to get the text back."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

CHUNK = 500  # texts per lookup: under SQLite's 999 bound variables of old builds
# PostgreSQL's B-tree entries hold at most ~2 700 bytes, and a combination's text can be longer
# (several labels, each up to 2 048 bytes): there the text has a hash index instead
# (store/postgres/schema.py), which holds a 4-byte hash of any length and serves the same
# `dims IN (...)` (a text-keyed B-tree was no faster, an md5() expression index 2-4x slower on a
# table small enough to scan: md5 of every row).


# PostgreSQL: the streams and texts as two array parameters sent in binary (%b), joined to the
# table, every stream of a batch in one statement (the demo's six streams took one each). As an IN
# list of parameters (SQLite's way) each lookup of a batch's ~1 000 texts was ~20 ms of a commit
# (one statement per count of texts, planned each time); as a text array in text format, psycopg
# escapes every quote of every JSON text in Python (~30 ms); in binary, 2-3 ms.
_BY_ARRAY = ("SELECT d.stream, d.dims, d.id FROM unnest(%b::text[], %b::text[]) AS w(stream, dims)"
             " JOIN dim_sets d ON d.stream = w.stream AND d.dims = w.dims")


# id(connection) -> stream -> text -> number, for the connections inside `kept` (by id: SQLite's
# connections take no weak references, and each entry goes when its `kept` ends).
_KEPT: dict[int, dict[str, dict[str, int]]] = {}


@contextmanager
def kept(connection) -> Iterator[None]:
    """Within: the numbers `ids` reads or gives out on `connection` (or a cursor of it) are kept and
    not looked up again. Around one transaction at most, with no savepoint rolled back inside it
    (a number given out there would be kept after the row that holds it is gone): a commit's."""
    _KEPT[id(connection)] = {}
    try:
        yield
    finally:
        del _KEPT[id(connection)]


def ids(cursor, p: str, texts: Mapping[str, Iterable[str]]) -> dict[str, dict[str, int]]:
    """Per stream, the numbers of these dimension texts, new ones given out (and written)."""
    kept_by_stream = _KEPT.get(id(getattr(cursor, "connection", cursor)))  # a cursor's, or the connection itself
    found: dict[str, dict[str, int]] = {}
    wanted: dict[str, list[str]] = {}
    for stream, of_stream in texts.items():
        known = {} if kept_by_stream is None else kept_by_stream.get(stream, {})
        unique = dict.fromkeys(of_stream)
        found[stream] = {text: known[text] for text in unique if text in known}
        wanted[stream] = [text for text in unique if text not in found[stream]]
    for stream, text, number in _stored(cursor, p, wanted):
        found[stream][text] = number
    for stream, of_stream in wanted.items():
        missing = [text for text in of_stream if text not in found[stream]]
        if missing:
            top = cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM dim_sets WHERE stream = {p}",
                                 (stream,)).fetchone()[0]
            new = {text: int(top) + 1 + i for i, text in enumerate(missing)}
            cursor.executemany(f"INSERT INTO dim_sets (stream, id, dims) VALUES ({p}, {p}, {p})",
                               [(stream, number, text) for text, number in new.items()])
            found[stream].update(new)
        if kept_by_stream is not None:
            kept_by_stream.setdefault(stream, {}).update(found[stream])
    return found


def _stored(cursor, p: str, texts: Mapping[str, list[str]]) -> list[tuple[str, str, int]]:
    """(stream, text, number) of those of these texts each stream has numbered, read from dim_sets."""
    if p == "%s":  # psycopg's placeholder: PostgreSQL
        streams = [stream for stream, of_stream in texts.items() for _ in of_stream]
        wanted = [text for of_stream in texts.values() for text in of_stream]
        return cursor.execute(_BY_ARRAY, (streams, wanted)).fetchall() if wanted else []
    return [(stream, text, number) for stream, of_stream in texts.items()
            for chunk in (of_stream[i:i + CHUNK] for i in range(0, len(of_stream), CHUNK))
            for text, number in cursor.execute(
                f"SELECT dims, id FROM dim_sets WHERE stream = {p} AND dims IN ({', '.join([p] * len(chunk))})",
                (stream, *chunk)).fetchall()]


def numbered(cursor, p: str, keys: Iterable[tuple]) -> dict[tuple, tuple]:
    """Row keys (stream first, the dimensions text last) -> the same keys with the text's number."""
    keys = list(keys)
    texts: dict[str, list[str]] = {}
    for key in keys:
        texts.setdefault(key[0], []).append(key[-1])
    by_stream = ids(cursor, p, texts)
    return {key: (*key[:-1], by_stream[key[0]][key[-1]]) for key in keys}


def joined(select: str, alias: str = "t") -> str:
    """`select` (rows with columns stream and dims_id) joined to their texts, as `d.dims`."""
    return f"({select}) {alias} JOIN dim_sets d ON d.stream = {alias}.stream AND d.id = {alias}.dims_id"


# The change feed after a sequence number, each record with its pane's dimensions text (a
# switch's record holds its text itself). Records written before a switch gave the stream
# another numbering may show another combination: a hub reloads the stream's views on the
# switch's record anyway.
CHANGES_SINCE = ("SELECT c.seq, c.stream, c.start_ms, COALESCE(d.dims, c.dims, '{}'), c.revision, c.batch_id,"
                 " c.count_added, c.at_ms, c.correction_id FROM changes c"
                 " LEFT JOIN dim_sets d ON d.stream = c.stream AND d.id = c.dims_id"
                 " WHERE c.seq > %s ORDER BY c.seq LIMIT %s")
