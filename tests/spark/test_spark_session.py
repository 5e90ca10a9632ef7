"""The pipeline's Spark session settings (aggregates/spark.py) that the tests' session shares."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_the_sketch_aggregations_hash_map_is_bounded(spark):
    """Each (stream, pane, dimensions) group holds its KLL sketches on the heap (~2 KB each): with
    the hash map allowed a million groups per task, one backfill batch of 1 M events spread over a
    day (~400 000 groups) ran the 2 GB driver out of heap (`bench.throughput --hours 24`)."""
    from aggregates.spark import HASH_AGGREGATE_GROUPS

    threshold = int(spark.conf.get("spark.sql.objectHashAggregate.sortBased.fallbackThreshold"))
    assert threshold == HASH_AGGREGATE_GROUPS <= 100_000
