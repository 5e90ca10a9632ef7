"""Pane rows encoded column-wise: the stats text and sketches blob (store/row_codec.py's format)
of every row of a stream's partial columns (store/partial_columns.py) at once, in Arrow's
compute kernels. Pure: no I/O.

row_codec.stats_text and sketches_blob encode one PaneData at a time: ~5.4 and ~2.2 µs a row
(a float's shortest repr is most of it), ~8 % of a 1 M-event backfill batch whose ~450 000
panes are all new. Here the numbers are cast to text by Arrow (the same shortest digits) and
the pieces joined per row by Arrow, so Python touches each row once, to read the result.

The texts equal row_codec's byte for byte (tests/unit/test_row_columns.py, Hypothesis):
- Arrow writes the shortest digits as Python's repr does, but switches to an exponent at other
  magnitudes and drops a whole number's ".0". A number is taken from Arrow where it is 0 or
  1e-4 <= |x| < 1e16 (where repr writes no exponent) and Arrow wrote none, with ".0" added to a
  whole number; a row with any other number present (an exponent, an infinite sum) gets None,
  and the caller encodes that row with row_codec.stats_text.
- Columns whose numbers are not all Python ints (n) and floats (sum, min, max) are not
  encoded here at all (None): row_codec writes an int sum as "5", not "5.0"."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store import row_codec
from store.partial_columns import PartialColumns

_VERSION = pa.scalar(bytes([row_codec.SKETCHES_VERSION]), pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())


def encode_columns(cols: PartialColumns) -> tuple[list[str | None], list[bytes]] | None:
    """Per row of `cols`: its stats text (None where row_codec must write it) and its sketches
    blob, as row_codec writes them for the row's PaneData; None when the columns' number types
    are not the ones this encodes."""
    for _, n, sums, lo, hi, _ in cols.values:
        if (not set(map(type, n)) <= {int} or not set(map(type, sums)) <= {float}
                or not set(map(type, lo)) <= {float} or not set(map(type, hi)) <= {float}):
            return None
    size = len(cols)
    if not size:
        return [], []
    return _stats_texts(cols, size), _sketch_blobs(cols, size)


def _stats_texts(cols: PartialColumns, size: int) -> list[str | None]:
    pieces = []
    unsure = np.zeros(size, bool)
    for name, n, sums, lo, hi, _ in sorted(cols.values, key=lambda v: v[0]):  # stats_text sorts the fields
        counts = np.asarray(n, np.int64).reshape(size)
        present = counts > 0
        numbers = [pc.cast(pa.array(counts), pa.string())]
        for column in (sums, lo, hi):
            text, exact = _float_texts(np.asarray(column, np.float64).reshape(size))
            numbers.append(text)
            unsure |= present & ~exact
        inner = pc.binary_join_element_wise(*numbers, ",")
        piece = pc.binary_join_element_wise(f",{row_codec.stats_key(name)}:[", inner, "]", "")
        pieces.append(pc.if_else(pa.array(present), piece, ""))
    if pieces:  # every piece starts with its comma: the first one's is trimmed
        body = pc.utf8_ltrim(pc.binary_join_element_wise(*pieces, ""), characters=",")
        texts = pc.binary_join_element_wise("{", body, "}", "").to_pylist()
    else:
        texts = ["{}"] * size
    for i in np.flatnonzero(unsure).tolist():
        texts[i] = None
    return texts


def _float_texts(x: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Each number's text as repr writes it, and where that text is sure (see the docstring)."""
    text = pc.cast(pa.array(x), pa.string())
    magnitude = np.abs(x)
    exact = (x == 0) | ((magnitude >= 1e-4) & (magnitude < 1e16))
    exact &= ~pc.match_substring(text, "e").to_numpy(zero_copy_only=False)
    # Without an exponent Arrow writes a "." exactly where the number is not whole.
    whole = np.isfinite(x) & (x == np.trunc(x))
    if whole.any():
        text = pc.if_else(pa.array(whole), pc.binary_join_element_wise(text, ".0", ""), text)
    return text, exact


def _sketch_blobs(cols: PartialColumns, size: int) -> list[bytes]:
    """sketches_blob's order: the value fields' KLLs in the columns' order, then the distinct
    fields' HLLs; a sketch is in a row where its field is (n > 0; a blob not None) and not None."""
    pieces = [_VERSION]
    for name, n, _, _, _, kll in cols.values:
        present = np.asarray(n, np.int64).reshape(size) > 0
        pieces.append(_sketch_piece(row_codec.sketch_head(row_codec.KLL, name), kll, present))
    for name, blobs in cols.distincts:
        pieces.append(_sketch_piece(row_codec.sketch_head(row_codec.HLL, name), blobs, np.ones(size, bool)))
    # Absent pieces are empty, not null: pyarrow 26's null_handling="skip" drops whole rows.
    return pc.binary_join_element_wise(*pieces, _EMPTY).to_pylist()


def _sketch_piece(head: bytes, blobs: list, present: np.ndarray) -> pa.Array:
    """head, the sketch's length (4 bytes, big-endian) and its bytes; empty where it is absent."""
    sketches = pa.array(blobs, pa.binary())
    lengths = pc.binary_length(sketches).fill_null(0).to_numpy(zero_copy_only=False).astype(">u4")
    prefix = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), len(lengths), [None, pa.py_buffer(lengths.tobytes())])
    piece = pc.binary_join_element_wise(pa.scalar(head, pa.binary()), prefix.cast(pa.binary()), sketches, _EMPTY)
    return pc.if_else(pc.and_(pa.array(present), piece.is_valid()), piece, _EMPTY)


__all__ = ["encode_columns"]
