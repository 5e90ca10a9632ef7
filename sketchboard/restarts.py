"""Which failed pipeline queries `sketchboard pipeline` starts again by itself, and how often.

Spark 4 waits a fixed 10 s for a Python worker to connect back (SPARK-45245, no setting); on a
host under heavy load (seen at load averages above ~20 on 2 cores) a batch then fails although
nothing is wrong with the data or the code. Starting the query again from its checkpoint is what
a restart of the process would do, and exactly once holds across it (the store skips a batch id
it has committed). Anything else still ends the loop: a bug or bad state must not spin. Pure:
time is passed in."""

from __future__ import annotations

from collections import deque

# Failures of the host, not of the batch: Spark's messages when a Python worker did not start.
TRANSIENT_MESSAGES = ("Python worker failed to connect back", "Python worker exited unexpectedly (crashed)")


def transient(error: BaseException | object) -> bool:
    """Whether a query failed on the host's load rather than on its batch (Spark hands the
    Python side's error back as text inside its own exception)."""
    text = str(error)
    return any(message in text for message in TRANSIENT_MESSAGES)


class RestartBudget:
    """At most `limit` restarts in any `window_s` seconds: a failure that keeps coming back is
    not transient, and the loop ends with it."""

    def __init__(self, limit: int = 3, window_s: float = 600.0):
        self.limit, self.window_s = limit, window_s
        self._at: deque[float] = deque()

    def allow(self, now_s: float) -> bool:
        while self._at and now_s - self._at[0] >= self.window_s:
            self._at.popleft()
        if len(self._at) >= self.limit:
            return False
        self._at.append(now_s)
        return True
