"""Rate limits: a token bucket per key (a token's name, or the client's address when the API is
open). Pure: time comes from an injected clock.

A request that costs more than a whole burst (one POST of 100 000 events against a burst of
50 000) is let through when the bucket is full and leaves it in debt, so the key then waits as
long as those events would have taken at the allowed rate: a limit that could never be met
would only turn one big honest request into an error."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000):
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive (use no limiter to disable a limit)")
        self.rate, self.burst = float(rate), float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()  # the ingest route charges events from a worker thread

    def take(self, key: str, cost: float = 1.0) -> float:
        """0 when allowed (and charged); otherwise the seconds until it would be, nothing charged."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            need = min(cost, self.burst)
            if tokens < need:
                self._put(key, tokens, now)
                return (need - tokens) / self.rate
            self._put(key, tokens - cost, now)
            return 0.0

    def reserve(self, key: str, cost: float) -> bool:
        """Charge `cost` if the bucket holds that many tokens now (no debt, unlike `take`): what a
        caller that learns the true cost later sets aside, then gives back the difference with
        `refund`. False, and nothing charged, when it does not."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            enough = tokens >= cost
            self._put(key, tokens - cost if enough else tokens, now)
            return enough

    def refund(self, key: str, cost: float) -> None:
        """Give back `cost` of a reservation (never above the burst)."""
        if cost <= 0:
            return
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            self._put(key, min(self.burst, tokens + (now - at) * self.rate + cost), now)

    def _put(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)  # most recently used last
        while len(self._buckets) > self._max_keys:
            # The least recently seen key goes: it restarts with a full bucket if it comes back,
            # which is what an idle key would have had anyway after burst/rate seconds.
            self._buckets.popitem(last=False)


def retry_after(seconds: float) -> str:
    """The Retry-After value: whole seconds, at least 1 (0 would invite an immediate retry)."""
    return str(max(1, math.ceil(seconds)))


def client_key(token_name: str | None, client: tuple | None) -> str:
    """Per token when there is one (one client, many addresses behind a proxy or NAT), else
    per client address."""
    if token_name is not None:
        return f"token:{token_name}"
    return f"addr:{client[0] if client else 'unknown'}"
