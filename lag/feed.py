"""The websocket's `lag` topic: `LagFeed` sends the lag monitor's report once per sampling round,
and when its verdict changes between rounds."""

from __future__ import annotations

from lag.report import LagMonitor


class LagFeed:
    """One `lag` message per new sampling round, and one whenever the status or the sampler's
    error changed since the last message though no round came: a sampler that stopped writes no
    round, and its silence is what turns the status ERR (GET /api/v1/lag and /metrics say so,
    and the dashboard, which reads only this feed, must too). Without a new round the status is
    looked at once per sample interval at most (on Kafka each look asks the brokers for the
    partitions). The reason alone does not count: it carries ages that change at every look."""

    topic = "lag"

    def __init__(self, monitor: LagMonitor):
        self.monitor = monitor
        self._last_round: int | None = None  # the newest round sent (write order: store/lag.py round_seq)
        self._last_verdict: tuple[str, str | None] | None = None  # (status, sampler_error) last sent
        self._last_look: float | None = None  # the monitor's clock at the last report made

    def poll(self) -> list[dict]:
        # A new round by write order, not by time: a new leader's clock may be behind the old one's.
        newest = self.monitor.store.newest_round(self.monitor.pipeline)
        if newest is None:
            return []
        new_round = newest != self._last_round
        now = self.monitor.clock()  # (a clock set back looks at once: never a feed stuck until it catches up)
        if not new_round and self._last_look is not None and 0 <= now - self._last_look < self.monitor.interval_s:
            return []
        self._last_look = now
        message = self.monitor.message()
        verdict = (message["status"], message["sampler_error"])
        if not new_round and verdict == self._last_verdict:
            return []
        self._last_round, self._last_verdict = newest, verdict
        if self.monitor.registry is not None:  # fan-out: every consumer of the log, for the lag panel's table
            message["consumers"] = self.monitor.consumers()
        return [message]
