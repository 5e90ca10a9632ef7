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


def test_python_workers_import_the_installed_pyspark_not_sparks_zip_of_it(spark):
    """Spark puts its zipped pyspark and py4j first on its workers' PYTHONPATH; Python compiles
    zipped modules anew in every process (~1 s each). Local workers run through the launcher of
    aggregates/spark_python.py, which drops them: the installed package, compiled once."""
    import pyspark

    files = spark.sparkContext.parallelize([0], 1).map(
        lambda _: (__import__("pyspark").__file__, __import__("os").environ.get("PYTHONPATH", ""))).collect()
    (worker_pyspark, worker_path), = files
    assert worker_pyspark == pyspark.__file__ and ".zip" not in worker_pyspark
    assert "pyspark.zip" not in worker_path and "py4j" not in worker_path
