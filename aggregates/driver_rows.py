"""A small batch's rows on the driver, collected once for every step after enrichment.

On the driver path (aggregates/driver_batch.py) each step used to collect its own projection of
the batch: the patterns' and the joins' merged records, the Arrow group-by's input, the Bloom
and sessions' key records, the enrichment's miss flags. A collect runs no Spark job there, but
each one is Catalyst analysing and optimizing a plan over the local rows plus its calls into the
JVM: ~50 ms apiece, most of a demo-rate batch. Here the batch is collected once with its
dead-letter reason, pane start, grouping dims and dead record (`partials.keyed_on_driver`, the one
rule, computed by Spark), and the steps read projections of that table made by pyarrow, with the
rows in the same order as their own collects gave them (tests/spark/test_driver_batch.py)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from aggregates.driver_batch import no_records
from aggregates.partials import ARROW_INPUT_COLUMNS, keyed_on_driver
from catalog import Catalog


class DriverRows:
    def __init__(self, batch: DataFrame, catalog: Catalog, batch_now_ms: int):
        """`batch`: on the driver (collecting it runs no Spark job); read at the first use."""
        self.batch, self.catalog, self.batch_now_ms = batch, catalog, batch_now_ms

    @functools.cached_property
    def table(self) -> pa.Table:
        return keyed_on_driver(self.batch, self.catalog, self.batch_now_ms)

    @functools.cached_property
    def _good(self) -> pa.ChunkedArray:
        return pc.is_null(self.table.column("dead_reason"))

    def merged(self, streams: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """`columns` of the records of `streams` that the batch merges (not dead-lettered), as
        `partials.merged_records` collects them."""
        if not streams:
            return no_records(columns)
        of_streams = pc.is_in(self.table.column("stream"), value_set=pa.array(list(streams), pa.string()))
        return self.table.filter(pc.and_(of_streams, self._good)).select(list(columns))

    def arrow_input(self) -> pa.Table:
        """What `arrow_on_driver(partials.arrow_input(batch))` gives: the Arrow group-by's rows."""
        names = [("g_dims" if c == "dims" else c) for c in ARROW_INPUT_COLUMNS]
        return self.table.select(names).rename_columns(list(ARROW_INPUT_COLUMNS))

    def true_counts(self, columns: Sequence[str]) -> dict[str, int]:
        """Per boolean column, how many merged records have it true (nulls count none)."""
        good = self.table.filter(self._good)
        return {c: int(pc.sum(pc.fill_null(good.column(c), False).cast(pa.int64())).as_py() or 0) for c in columns}


__all__ = ["DriverRows"]
