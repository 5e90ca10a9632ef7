"""A batch's stream column encoded once, for every step that asks which rows are of which stream.

The steps on the driver ask it a dozen times a batch: the dead-letter rules' three per-stream
constants (retention, skew, pane) and the streams with event ids, the key rows' stream of each
feature, the enrichment's stream of each lookup. Each asked Arrow to hash or compare every row's
stream name again (~96 ms of string work for 2 M events, ~4 % of the pipeline's CPU). Here the
column is dictionary-encoded once and each question is answered from the codes by numpy.

The last few columns encoded are kept with their codes (the batch's rows, and the Bloom step's key
rows in its own thread), each entry holding its column itself, so that the addresses its buffers
are known by stay its own while it is kept (a later batch's column cannot be given them). The
pipeline forgets them at the end of each batch (`forget_stream_codes`): they are not held past it.
Only the driver's steps keep columns: the group-by, which Spark's executors run too (where nothing
would forget them), takes `value_codes` each time. Pure otherwise: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.log.records import one_chunk

KEPT = 4
# ((identity, column, codes, names), ...), the newest first; replaced whole, so that a thread reads
# one tuple or the other
_kept: tuple = ()


def _identity(array: pa.Array) -> tuple:
    return (str(array.type), len(array), array.offset, tuple(b.address if b is not None else 0 for b in array.buffers()))


def stream_codes(streams: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """Each row's stream as an index into the batch's distinct streams (a null stream as None)."""
    global _kept
    # A column of several chunks is put together anew at each call (new buffers each time): it is
    # answered, not kept, where it would push the batch's own column out.
    keep = not isinstance(streams, pa.ChunkedArray) or streams.num_chunks <= 1
    array = one_chunk(streams)
    identity = _identity(array)
    kept = _kept
    for entry in kept:
        if entry[0] == identity:
            return entry[2], entry[3]
    codes, distinct = value_codes(array)
    names = distinct.to_pylist()
    codes.flags.writeable = False  # shared with every later caller: none may change it
    if keep:
        _kept = ((identity, array, codes, names), *kept[:KEPT - 1])
    return codes, names


def value_codes(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """A code per row, equal exactly when the values are (nulls one code of their own), and the
    distinct values the codes index. A column of one value (a batch's stream, as most batches read
    one; its dead reason, null but for dead letters) is told by one comparison a row, where the
    encoding hashed each (700 000 stream names: ~3 against ~14 ms)."""
    if one_value(column):
        return np.zeros(len(column), np.int32), one_chunk(column).slice(0, min(1, len(column)))
    encoded = one_chunk(pc.dictionary_encode(column, null_encoding="encode"))
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary


def one_value(column: pa.Array | pa.ChunkedArray) -> bool:
    """Whether every row holds the same value (all null counts as one), by a check that gives up
    at once on a column whose first and last rows differ."""
    n, nulls = len(column), column.null_count
    if n == 0 or nulls == n:
        return True
    if nulls or column[0] != column[n - 1]:
        return False
    return pc.all(pc.equal(column, column[0])).as_py()


def forget_stream_codes() -> None:
    global _kept
    _kept = ()


def stream_rows(streams: pa.Array | pa.ChunkedArray, names: Iterable[str]) -> np.ndarray:
    """Whether each row's stream is one of `names` (numpy booleans, a null stream never)."""
    codes, distinct = stream_codes(streams)
    wanted = set(names)
    return np.array([name is not None and name in wanted for name in distinct], bool)[codes]


def per_stream_values(streams: pa.Array | pa.ChunkedArray, values: Mapping[str, int]) -> pa.Array:
    """Each row's stream's constant (int64), null for a stream not in `values`: Spark's CASE."""
    codes, distinct = stream_codes(streams)
    known = np.array([name is not None and name in values for name in distinct], bool)
    constants = np.array([values[name] if ok else 0 for name, ok in zip(distinct, known)], np.int64)
    present = known[codes]
    return pa.array(constants[codes], pa.int64(), mask=None if present.all() else ~present)
