"""The websocket's `lag` topic: `LagFeed` sends the lag monitor's report once per sampling round."""

from __future__ import annotations

from lag.report import LagMonitor


class LagFeed:
    """One `lag` message per new sampling round (nothing when no new samples were stored)."""

    topic = "lag"

    def __init__(self, monitor: LagMonitor):
        self.monitor = monitor
        self._last_at_ms: int | None = None

    def poll(self) -> list[dict]:
        newest = self.monitor.store.newest_at_ms(self.monitor.pipeline)
        if newest is None or newest == self._last_at_ms:
            return []
        self._last_at_ms = newest
        message = self.monitor.report().to_message()
        if self.monitor.registry is not None:  # fan-out: every consumer of the log, for the lag panel's table
            message["consumers"] = self.monitor.consumers()
        return [message]
