"""A batch's ids (its rows' `ids` lists: user ids and other distinct-count fields) hashed once.

Three steps of a driver batch read the same ids: the partials' HLLs (aggregates/arrow_partials.py),
the Bloom and sessions' key rows (aggregates/key_rows.py) and the enrichment's lookups
(aggregates/enrichment_driver.py). Each dictionary-encoded them on its own: a hash of every row's
string, ~30 ms apiece for 700 000 events. `BatchIds` is that encoding made once, for the rows in
the batch's order: the distinct ids and each flattened item's code, so a step takes codes by
position instead of hashing strings again. Pure Arrow and numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.log.records import one_chunk


@dataclass(frozen=True)
class BatchIds:
    """`dictionary`: the distinct items; `codes`: per item of the lists flattened in row order, its
    index into `dictionary` (-1: a null item); `begins`, `lengths`: per row, where its items begin
    among the flattened ones and how many it has (0 for a null list)."""
    dictionary: pa.Array
    codes: np.ndarray
    begins: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, lists: pa.Array | pa.ChunkedArray) -> BatchIds:
        lists = one_chunk(lists)
        lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        begins = np.cumsum(lengths) - lengths
        flat = pc.list_flatten(lists)
        if not len(flat):
            return cls(pa.array([], pa.string()), np.zeros(0, np.int64), begins, lengths)
        encoded = flat.dictionary_encode()
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(encoded.dictionary.cast(pa.string()), codes, begins, lengths)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def slot(self, index: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Per row (of `rows`, in that order; None: all) the code of its item at `index`, -1 where
        Spark's `get(ids, index)` is null: a null list, one too short, a null item."""
        begins, lengths = (self.begins, self.lengths) if rows is None else (self.begins[rows], self.lengths[rows])
        has = lengths > index
        out = np.full(len(lengths), -1, np.int64)
        out[has] = self.codes[begins[has] + index]
        return out

    def used(self, code: np.ndarray) -> tuple[pa.Array, np.ndarray]:
        """The distinct ids `code` holds (-1: none), in dictionary order, and each code's index
        among them (-1 stays): a step's own keys, not every id of the batch."""
        present = np.zeros(len(self.dictionary) + 1, bool)
        present[code] = True  # -1 marks the extra last cell
        renumber = np.cumsum(present[:-1]) - 1
        renumber = np.append(renumber, -1)  # -1 stays -1
        return self.dictionary.filter(pa.array(present[:-1])), renumber[code]


__all__ = ["BatchIds"]
