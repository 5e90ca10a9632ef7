"""`sketchboard api` stopped as a service manager stops it: a real process, real HTTP. No Spark."""

from __future__ import annotations

import signal

import pytest

from store.lease import LeaseStore

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_api_cleanly_and_hands_the_lease_over(service_factory, signum):
    """uvicorn raises the signal again once it has shut down: with Python's default handlers the
    process died of it (-15) or of a KeyboardInterrupt, before its `finally` handed the leader lease
    over, so another replica waited the lease's ttl out before it sampled lag or evaluated rules."""
    service = service_factory(leader_lease_ttl="60s")
    service.start_api()
    leader = service.wait_for(lambda: service.get("/api/v1/pipeline")["leader"]["leading"] or None, 20,
                              "the API to take the leader lease")
    assert leader
    lease = service.get("/api/v1/pipeline")["leader"]["lease"]
    proc = service.procs.pop("api")
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 0, service.log_tail("api")
    assert "Traceback" not in service.log_tail("api", 20_000)
    store = LeaseStore(service.root / "data" / "store.db")
    try:
        assert store.read(lease).record.holder is None  # handed over, not left to expire
    finally:
        store.close()
