"""Consumer lag with real processes: the API samples lag while the pipeline (a separate
Spark process) is stopped and started again, and a producer keeps sending over HTTP.

The scenario lives in tests/e2e/lag_scenario.py; tests/browser/test_lag_e2e.py runs it too,
with the dashboard open, and when that one is selected (Chromium present) this one is skipped
(tests/conftest.py) so the suite starts Spark for it only once. It runs on both logs (the
`log_backend` fixture): on Kafka the API produces to a real broker, lag comes from the topic's
offsets and record timestamps, and the pipeline reads with Spark's Kafka source; the skip above
concerns the embedded variant only (the browser test runs on the embedded log)."""

from __future__ import annotations

import pytest

from tests.e2e.lag_scenario import PROCESS_TEST, SETTINGS, run_lag_scenario

pytestmark = pytest.mark.e2e


def test_lag_grows_and_stops_while_the_pipeline_is_down_and_drains_when_it_is_back(service_factory, log_backend,
                                                                                   tmp_path):
    test_log = log_backend.new(tmp_path / "log")
    run_lag_scenario(service_factory(**SETTINGS, **test_log.settings()))


assert test_lag_grows_and_stops_while_the_pipeline_is_down_and_drains_when_it_is_back.__name__ == PROCESS_TEST
