"""One SparkSession (local[2]) for the whole run: start-up costs ~10 s."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from aggregates.spark import build_spark

    session = build_spark("local[2]", app_name="sketchboard-tests", driver_memory="1g")
    yield session
    session.stop()
