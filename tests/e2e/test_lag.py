"""Consumer lag with real processes: the API samples lag while the pipeline (a separate
Spark process) is stopped and started again, and a producer keeps sending over HTTP.

The scenario lives in tests/e2e/lag_scenario.py, so that a browser test can run it too."""

from __future__ import annotations

import pytest

from tests.e2e.lag_scenario import PROCESS_TEST, SETTINGS, run_lag_scenario

pytestmark = pytest.mark.e2e


def test_lag_grows_and_stops_while_the_pipeline_is_down_and_drains_when_it_is_back(service_factory):
    run_lag_scenario(service_factory(**SETTINGS))


assert test_lag_grows_and_stops_while_the_pipeline_is_down_and_drains_when_it_is_back.__name__ == PROCESS_TEST
