"""The demo shop's checkout funnel, as a pure, seeded generator (no I/O, time passed in), for the
pattern `checkout_abandoned` of config/streams.yaml (docs/patterns.md, "The demo").

Checkouts start at `CHECKOUTS_PER_S` per second of the clock (times the traffic's daily shape),
whatever the HTTP request rate (the demo stays light). Each is a `started` event with the cart's
amount and items; `COMPLETED_SHARE` of them are `completed` a log-normal delay later (mostly a
minute or two, never past `MAX_COMPLETION_MS`), `LATE_COMPLETION_SHARE` come back and complete
after more than half an hour (the pattern has called them abandoned by then), and the rest never
complete: abandoned carts. Both events carry the checkout's id, customer, payment method, amount
and items; each is sent as it happens (within the call's span).

`CheckoutFunnel.due(now_ms)` returns the starts since the last call (at most `MAX_CATCHUP_MS` of
them after a stall) and the completions whose time has come.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from demo.shapes import PAYMENT_METHODS, shares

CHECKOUTS_PER_S = 0.5         # checkouts started per second of the clock, before the daily shape
MAX_CATCHUP_MS = 5_000        # after a stall, at most this much clock time of starts is drawn
COMPLETED_SHARE = 0.70        # completed within MAX_COMPLETION_MS
LATE_COMPLETION_SHARE = 0.03  # completed after LATE_COMPLETION_MS (abandoned for the pattern)
COMPLETION_MEDIAN_MS = 75_000.0
COMPLETION_SIGMA = 0.9
MIN_COMPLETION_MS = 5_000
MAX_COMPLETION_MS = 25 * 60_000
LATE_COMPLETION_MS = (31 * 60_000, 90 * 60_000)

STAGE_STARTED, STAGE_COMPLETED = "started", "completed"


@dataclass(frozen=True)
class Checkouts:
    """Columns of the checkout events sent at one moment."""

    time_ms: list[int]
    strings: dict[str, list[str]]      # checkout_id, customer_id, stage, payment_method
    numbers: dict[str, list[float]]    # amount, items


class CheckoutFunnel:
    """Seeded checkouts of `customers` from `started_ms` on (see the module's doc). `run` tags the
    checkout ids, so a restarted demo never reuses one (demo.searches.run_id)."""

    def __init__(self, seed: int, customers: Sequence[str], started_ms: int, *, run: str = "run",
                 rate_per_s: float = CHECKOUTS_PER_S):
        self.customers = list(customers)
        self.run = run
        self.rate_per_s = rate_per_s
        self._rng = np.random.default_rng([seed, 43])  # its own RNG: the other demo streams draw as before
        self._last_ms = started_ms
        self._serial = 0
        self._pending: list[tuple[int, int, tuple]] = []  # (time, order, row): a heap of completions
        self._order = 0

    @property
    def pending(self) -> int:
        """Completions drawn but not due yet."""
        return len(self._pending)

    def due(self, now_ms: int, rate_factor: float = 1.0) -> Checkouts:
        rng = self._rng
        span = min(max(now_ms - self._last_ms, 0), MAX_CATCHUP_MS)
        self._last_ms = max(self._last_ms, now_ms)
        n = int(rng.poisson(self.rate_per_s * rate_factor * span / 1000)) if span > 0 else 0
        rows: list[tuple] = []
        if n:
            times = now_ms - rng.integers(0, span, n)
            items = np.minimum(rng.geometric(0.45, n), 8)
            amount = items * rng.lognormal(math.log(22.0), 0.6, n)
            amount = np.round(np.where(amount < 50.0, amount + 4.99, amount), 2)  # shipping on small carts
            pay = rng.choice(len(PAYMENT_METHODS), size=n, p=shares(PAYMENT_METHODS))
            customers = rng.integers(0, len(self.customers), n)
            fate = rng.random(n)
            delay = np.clip(rng.lognormal(math.log(COMPLETION_MEDIAN_MS), COMPLETION_SIGMA, n),
                            MIN_COMPLETION_MS, MAX_COMPLETION_MS).astype(np.int64)
            late_delay = rng.integers(*LATE_COMPLETION_MS, n)
            for i in range(n):
                checkout = f"k-{self.run}-{self._serial}"
                self._serial += 1
                t = int(times[i])
                row = (checkout, self.customers[int(customers[i])], PAYMENT_METHODS[int(pay[i])][0],
                       float(amount[i]), int(items[i]))
                rows.append((t, STAGE_STARTED, *row))
                if fate[i] < COMPLETED_SHARE:
                    done = t + int(delay[i])
                elif fate[i] < COMPLETED_SHARE + LATE_COMPLETION_SHARE:
                    done = t + int(late_delay[i])
                else:
                    continue  # abandoned
                heapq.heappush(self._pending, (done, self._order, (done, STAGE_COMPLETED, *row)))
                self._order += 1
        while self._pending and self._pending[0][0] <= now_ms:
            rows.append(heapq.heappop(self._pending)[2])
        rows = [rows[i] for i in rng.permutation(len(rows)).tolist()]
        cols = list(zip(*rows)) or [()] * 7
        return Checkouts(
            time_ms=list(cols[0]),
            strings={"checkout_id": list(cols[2]), "customer_id": list(cols[3]), "stage": list(cols[1]),
                     "payment_method": list(cols[4])},
            numbers={"amount": list(cols[5]), "items": list(cols[6])},
        )
