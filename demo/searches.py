"""The demo shop's search box: searches, and the clicks on their results some time later, as a
pure, seeded generator (no I/O, time passed in), for a window join of `clicks` to `searches` on
`search_id` ("Stream-stream join (window join)", DDIA ch. 11).

A search has a category (what was looked for), a platform, a user and a number of results (a few
find nothing, and nothing can be clicked then). Whether it gets clicked depends on its category
(`CATEGORIES`: 25-60 % of searches); a clicked search gets one click, sometimes several. Each
click happens a log-normal delay after its search: mostly seconds, a tail of minutes to tens of
minutes, a few after the 30-minute join window (`CLICK_DELAY_*`). A click is sent as it happens;
a small share is buffered by the device and sent after the clicks stream's allowed lateness (its
pane is final by then: a correction), and a small share names a search id that no search ever
had (an unknown key the join must count, not lose).

`SearchClicks.searches(n, now_ms)` draws n searches at `now_ms` and schedules their clicks;
`SearchClicks.due_clicks(now_ms)` returns the clicks whose send time has come, in send order.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# (category, share of searches, share clicked, median results, share with no results)
CATEGORIES: tuple[tuple[str, float, float, float, float], ...] = (
    ("products", 0.40, 0.55, 120.0, 0.04),
    ("brands", 0.14, 0.60, 60.0, 0.02),
    ("deals", 0.14, 0.45, 40.0, 0.05),
    ("orders", 0.10, 0.40, 5.0, 0.10),   # order tracking: few results, often read without a click
    ("help", 0.12, 0.25, 15.0, 0.12),    # help articles: the answer is often in the snippet
    ("stores", 0.10, 0.35, 8.0, 0.06),
)
CATEGORY_NAMES = tuple(c[0] for c in CATEGORIES)
CTR = {c[0]: c[2] for c in CATEGORIES}  # the expected click-through rate (searches with a click) per category
PLATFORMS: tuple[tuple[str, float], ...] = (("web", 0.50), ("android", 0.30), ("ios", 0.20))
MAX_RESULTS = 1_000
SEARCH_JITTER_MS = 400.0        # searches are sent this long after they happen (exponential), at most:
MAX_SEARCH_JITTER_MS = 2_000
# Clicks on a clicked search: 1 + (geometric - 1), mean 1 / EXTRA_CLICK_P ~ 1.5, at most MAX_CLICKS.
EXTRA_CLICK_P = 0.65
MAX_CLICKS = 10
# Position clicked: P(k) ~ k^-POSITION_EXPONENT over the first MAX_POSITION results (about half of
# the clicks go to the top result, one in ten past the tenth), wrapped into
# the search's own results (a search with 3 results gets clicks on 1-3 only).
POSITION_EXPONENT = 1.6
MAX_POSITION = 30
POSITION_BUCKETS: tuple[tuple[str, int], ...] = (("1", 1), ("2-3", 3), ("4-10", 10), ("11+", MAX_POSITION))
# Delay from a search to a click: CLICK_DELAY_MIN_MS + log-normal (median, sigma); a draw past
# CLICK_DELAY_MAX_MS is redrawn uniformly from its second half. About 1.5 % of clicks come more than
# 10 min after their search and about 0.25 % after 30 min (outside the demo's join window).
CLICK_DELAY_MIN_MS = 1_000
CLICK_DELAY_MEDIAN_MS = 15_000.0
CLICK_DELAY_SIGMA = 1.7
CLICK_DELAY_MAX_MS = 60 * 60_000
SEND_DELAY_MEAN_MS = 300.0      # a click goes out this long after it happens (exponential)
LATE_SHARE = 0.01               # clicks a device buffered: sent after the stream's allowed lateness
UNKNOWN_SHARE = 0.005           # clicks naming a search id no search ever had (per click drawn)

# What a click is, for tests (and the curious): SearchClicks.due_clicks() returns one per click.
CLICK_ON_TIME, CLICK_LATE, CLICK_UNKNOWN = "on_time", "late", "unknown"


def position_bucket(position: int) -> str:
    """The dimension value of a clicked position: 1, 2-3, 4-10 or 11+."""
    for name, upto in POSITION_BUCKETS:
        if position <= upto:
            return name
    return POSITION_BUCKETS[-1][0]


def run_id(seed: int, started_ms: int) -> str:
    """A short tag for one generator run, so search ids never repeat across runs (a restarted demo
    must not send ids a join could match to the previous run's searches) yet stay seeded."""
    return hashlib.blake2b(repr((seed, started_ms)).encode(), digest_size=4).hexdigest()


@dataclass(frozen=True)
class Searches:
    """Columns of n searches."""

    time_ms: list[int]
    strings: dict[str, list[str]]      # search_id, user_id, query_category, platform
    numbers: dict[str, list[float]]    # results


@dataclass(frozen=True)
class Clicks:
    """Columns of the clicks sent at one moment, in send order, with what the join should make of them."""

    time_ms: list[int]
    sent_ms: list[int]                  # when the click was sent (by our clock)
    delay_ms: list[int | None]          # click time - its search's time; None for an unknown search
    kinds: list[str]                    # CLICK_ON_TIME, CLICK_LATE, CLICK_UNKNOWN
    strings: dict[str, list[str]]       # search_id, user_id, platform, position_bucket
    numbers: dict[str, list[float]]     # position


class SearchClicks:
    """Seeded searches and the clicks on their results (see the module's doc).

    late_after_ms: a buffered click is sent this long after it happens plus an exponential with
    mean late_spread_ms; DemoTraffic passes the clicks stream's allowed_lateness + pane + 1 s and
    its allowed_lateness, the rule demo.stragglers uses for events sent after their pane is final.
    users: the user ids searches come from (Zipf-skewed by rank).
    """

    def __init__(self, seed: int = 0, *, run: str = "run", users: Sequence[str] | None = None,
                 late_after_ms: int = 71_000, late_spread_ms: int = 60_000,
                 late_share: float = LATE_SHARE, unknown_share: float = UNKNOWN_SHARE):
        if not (0.0 <= late_share <= 1.0 and 0.0 <= unknown_share <= 1.0):
            raise ValueError(f"late_share and unknown_share must lie in [0, 1], got {late_share}, {unknown_share}")
        self._rng = np.random.default_rng([seed, 23])
        self.run = run
        self.users = list(users) if users else [f"u{i:05d}" for i in range(50_000)]
        self.late_after_ms = late_after_ms
        self.late_spread_ms = late_spread_ms
        self.late_share = late_share
        self.unknown_share = unknown_share
        self._serial = 0   # search ids: s-<run>-<serial>; unknown clicks take serials no search is sent with
        self._pending: list[tuple[int, int, tuple]] = []   # (sent_ms, order, click row): a heap
        self._order = 0
        weights = np.arange(1, MAX_POSITION + 1, dtype=float) ** -POSITION_EXPONENT
        self._position_cdf = np.cumsum(weights / weights.sum())

    @property
    def pending(self) -> int:
        """Clicks drawn but not sent yet."""
        return len(self._pending)

    def count(self, n: int, ratio: float) -> int:
        """A binomial share of n, drawn from this generator's own RNG (the other demo streams'
        draws stay what they were before searches existed)."""
        return int(self._rng.binomial(n, ratio)) if n > 0 else 0

    def searches(self, n: int, now_ms: int) -> Searches:
        """n searches that happened up to MAX_SEARCH_JITTER_MS before now_ms; their clicks are
        scheduled and come out of due_clicks() once their send time has come."""
        rng = self._rng
        cat = rng.choice(len(CATEGORIES), size=n, p=_shares([c[1] for c in CATEGORIES]))
        platform = rng.choice(len(PLATFORMS), size=n, p=_shares([p[1] for p in PLATFORMS]))
        times = now_ms - np.minimum(rng.exponential(SEARCH_JITTER_MS, n), MAX_SEARCH_JITTER_MS).astype(np.int64)
        median = np.array([c[3] for c in CATEGORIES])[cat]
        results = np.minimum(np.round(median * rng.lognormal(0.0, 1.0, n)), MAX_RESULTS).astype(np.int64)
        results = np.where(rng.random(n) < np.array([c[4] for c in CATEGORIES])[cat], 0, np.maximum(results, 1))
        # P(clicked | results) = ctr / P(results): the category's CTR holds over all its searches.
        p_click = np.array([c[2] / (1.0 - c[4]) for c in CATEGORIES])[cat]
        clicked = (results > 0) & (rng.random(n) < p_click)
        clicks = np.where(clicked, np.minimum(rng.geometric(EXTRA_CLICK_P, n), np.minimum(results, MAX_CLICKS)), 0)
        ranks = (rng.zipf(1.1, n) - 1) % len(self.users)
        ids = [f"s-{self.run}-{self._serial + i}" for i in range(n)]
        self._serial += n
        users = [self.users[r] for r in ranks.tolist()]
        platforms = [PLATFORMS[i][0] for i in platform.tolist()]

        # One row per click: whose search, when, which position.
        owner = np.repeat(np.arange(n), clicks)
        m = len(owner)
        delay = self._click_delays(m)
        position = self._positions(results[owner])
        click_times = times[owner] + delay
        self._schedule(click_times, delay, position, [ids[i] for i in owner.tolist()],
                       [users[i] for i in owner.tolist()], [platforms[i] for i in owner.tolist()])
        self._unknown_clicks(int(rng.binomial(m, self.unknown_share)) if m else 0, now_ms)
        return Searches(
            time_ms=times.tolist(),
            strings={"search_id": ids, "user_id": users, "platform": platforms,
                     "query_category": [CATEGORIES[i][0] for i in cat.tolist()]},
            numbers={"results": results.tolist()},
        )

    def due_clicks(self, now_ms: int) -> Clicks:
        """The clicks whose send time is at or before now_ms, in send order, removed from the schedule."""
        rows = []
        while self._pending and self._pending[0][0] <= now_ms:
            rows.append(heapq.heappop(self._pending))
        cols = list(zip(*(row for _, _, row in rows))) or [()] * 8
        time_ms, delay, kinds, search_id, user, platform, position, sent = cols
        return Clicks(
            time_ms=list(time_ms), sent_ms=list(sent), delay_ms=list(delay), kinds=list(kinds),
            strings={"search_id": list(search_id), "user_id": list(user), "platform": list(platform),
                     "position_bucket": [position_bucket(p) for p in position]},
            numbers={"position": list(position)},
        )

    # -- draws --------------------------------------------------------------------------

    def _click_delays(self, m: int) -> np.ndarray:
        rng = self._rng
        delay = rng.lognormal(math.log(CLICK_DELAY_MEDIAN_MS), CLICK_DELAY_SIGMA, m)
        span = CLICK_DELAY_MAX_MS - CLICK_DELAY_MIN_MS
        delay = np.where(delay > span, rng.uniform(span / 2, span, m), delay)
        return CLICK_DELAY_MIN_MS + delay.astype(np.int64)

    def _positions(self, results: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self._position_cdf, self._rng.random(len(results)), side="right") + 1
        k = np.minimum(k, MAX_POSITION)
        return (k - 1) % np.maximum(results, 1) + 1

    def _send_times(self, click_times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rng = self._rng
        m = len(click_times)
        late = rng.random(m) < self.late_share
        on_time = click_times + rng.exponential(SEND_DELAY_MEAN_MS, m).astype(np.int64)
        buffered = click_times + self.late_after_ms + rng.exponential(max(self.late_spread_ms, 1), m).astype(np.int64)
        return np.where(late, buffered, on_time), late

    def _schedule(self, click_times: np.ndarray, delay: np.ndarray | list, position: np.ndarray,
                  ids: list[str], users: list[str], platforms: list[str], unknown: bool = False) -> None:
        sent, late = self._send_times(click_times)
        kinds = [CLICK_UNKNOWN if unknown else CLICK_LATE if x else CLICK_ON_TIME for x in late.tolist()]
        delays = delay.tolist() if isinstance(delay, np.ndarray) else delay
        for row in zip(click_times.tolist(), delays, kinds, ids, users, platforms, position.tolist(), sent.tolist()):
            heapq.heappush(self._pending, (row[-1], self._order, row))
            self._order += 1

    def _unknown_clicks(self, k: int, now_ms: int) -> None:
        # Ids from the search serials, never sent as a search: they look like any other id.
        if k == 0:
            return
        rng = self._rng
        ids = [f"s-{self.run}-{self._serial + i}" for i in range(k)]
        self._serial += k
        times = now_ms - np.minimum(rng.exponential(SEARCH_JITTER_MS, k), MAX_SEARCH_JITTER_MS).astype(np.int64)
        users = [self.users[r] for r in ((rng.zipf(1.1, k) - 1) % len(self.users)).tolist()]
        platforms = [PLATFORMS[i][0] for i in rng.choice(len(PLATFORMS), size=k, p=_shares([p[1] for p in PLATFORMS])).tolist()]
        position = self._positions(np.full(k, MAX_POSITION))
        self._schedule(times, [None] * k, position, ids, users, platforms, unknown=True)


def _shares(weights: Sequence[float]) -> np.ndarray:
    w = np.array(weights, dtype=float)
    return w / w.sum()
