"""A small batch's rows on the driver, collected once for every step after enrichment.

On the driver path (aggregates/driver_batch.py) each step used to collect its own projection of
the batch from Spark's local rows: the patterns' and the joins' merged records, the Arrow
group-by's input, the Bloom and sessions' key records, the enrichment's miss flags, each one
Catalyst analysing and optimizing a plan plus its calls into the JVM (~50 ms apiece). Now the
batch is an Arrow table on the driver: its rows get their dead-letter reason, pane start,
grouping dims and dead record once (aggregates/driver_rules.py `keyed`, Spark's rule in Arrow),
and the steps read projections of that table, rows in the batch's order
(tests/spark/test_driver_batch.py checks each against Spark's own collect of the same batch)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from aggregates.batch_ids import BatchIds
from aggregates.driver_batch import no_records
from aggregates.driver_rules import keyed
from aggregates.partials import ARROW_INPUT_COLUMNS
from catalog import Catalog


class DriverRows:
    def __init__(self, batch: pa.Table, catalog: Catalog, batch_now_ms: int, ids: BatchIds | None = None):
        """`batch`: the batch's rows on the driver (Arrow), keyed at the first use. `ids`: its ids
        already encoded (by the enrichment, which reads them first), else encoded at the first use."""
        self.batch, self.catalog, self.batch_now_ms = batch, catalog, batch_now_ms
        if ids is not None:
            self.__dict__["ids"] = ids  # the cached_property's value

    @functools.cached_property
    def ids(self) -> BatchIds:
        """The rows' ids hashed once for the partials, the key rows and the enrichment
        (aggregates/batch_ids.py): `table` keeps the batch's rows in their order."""
        return BatchIds.of(self.table.column("ids"))

    @functools.cached_property
    def table(self) -> pa.Table:
        return keyed(self.batch, self.catalog, self.batch_now_ms)

    @functools.cached_property
    def good(self) -> pa.ChunkedArray:
        """Per row, whether the batch merges it (not dead-lettered)."""
        return pc.is_null(self.table.column("dead_reason"))

    def merged(self, streams: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """`columns` of the records of `streams` that the batch merges (not dead-lettered), as
        `partials.merged_records` collects them."""
        if not streams:
            return no_records(columns)
        of_streams = pc.is_in(self.table.column("stream"), value_set=pa.array(list(streams), pa.string()))
        # select before filter: the filter copies only the columns asked for, not every list column
        return self.table.select(list(columns)).filter(pc.and_(of_streams, self.good))

    def arrow_input(self) -> pa.Table:
        """What `arrow_on_driver(partials.arrow_input(batch))` gives: the Arrow group-by's rows."""
        names = [("g_dims" if c == "dims" else c) for c in ARROW_INPUT_COLUMNS]
        return self.table.select(names).rename_columns(list(ARROW_INPUT_COLUMNS))

    def true_counts(self, columns: Sequence[str]) -> dict[str, int]:
        """Per boolean column, how many merged records have it true (nulls count none)."""
        return {c: int(pc.sum(pc.and_(self.good, pc.fill_null(self.table.column(c), False)).cast(pa.int64())).as_py()
                       or 0) for c in columns}


__all__ = ["DriverRows"]
