"""The demo's mobile app: a fleet of devices whose clocks cannot be trusted ("Whose clock are you
using, anyway?", DDIA ch. 11), as a pure, seeded generator (no I/O, time passed in).

Each device has a fixed clock error: most are synced within a second, some are off by seconds
to minutes, a few by hours either way (a phone set to the wrong zone, a clock never set). It
stamps an event when it happens and again when it sends it, both by its own clock. Most events
go out within a second; now and then a device that was offline (a flight, a tunnel) comes back
and sends its whole backlog at once: events that happened one to four hours earlier, all with
the same sent time. The pipeline estimates each device's error from the sent times and our
receive time and puts these events where they belong, as stragglers and corrections.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEVICES = 5_000
# (share of devices, smallest |error|, largest |error|) in ms; the sign is drawn per device.
CLOCK_ERRORS: tuple[tuple[float, int, int], ...] = (
    (0.80, 0, 1_000),                   # synced (NTP): within a second
    (0.12, 1_000, 10 * 60_000),         # drifted: seconds to minutes
    (0.06, 10 * 60_000, 3 * 3_600_000), # set by hand, wrong by minutes to hours
    (0.02, 3 * 3_600_000, 14 * 3_600_000),  # the wrong time zone, or never set
)
SEND_DELAY_MEAN_MS = 300.0          # live events: sent this long after they happen (exponential)
BURST_PER_EVENT = 0.0005            # offline backlogs coming back, per live event
BURST_EVENTS = (20, 120)            # events in one backlog
BURST_AGE_MS = (3_600_000, 4 * 3_600_000)  # how long ago the backlog's events happened
SCREENS: tuple[tuple[str, float], ...] = (
    ("home", 0.30), ("product", 0.25), ("search", 0.15), ("cart", 0.10), ("checkout", 0.05),
    ("account", 0.08), ("settings", 0.07),
)
PLATFORMS: tuple[tuple[str, float], ...] = (("ios", 0.45), ("android", 0.55))
APP_VERSIONS: tuple[tuple[str, float], ...] = (("4.2", 0.6), ("4.1", 0.3), ("3.9", 0.1))


def _pick(rng: np.random.Generator, pairs: tuple[tuple[str, float], ...], n: int) -> list[str]:
    weights = np.array([w for _, w in pairs])
    return [pairs[i][0] for i in rng.choice(len(pairs), size=n, p=weights / weights.sum()).tolist()]


@dataclass(frozen=True)
class DeviceEvents:
    """Columns of n events: what happened when by our clock, and how the devices stamped it."""

    device: list[str]
    true_ms: list[int]    # when it happened, by our clock (what the pipeline should find)
    time_ms: list[int]    # the event time, by the device's clock
    sent_ms: list[int]    # the sent time, by the device's clock
    offline: list[bool]   # part of a backlog sent after hours offline
    strings: dict[str, list[str]]
    numbers: dict[str, list[float]]


class DeviceFleet:
    """Seeded devices with fixed clock errors; `events(n, now_ms)` draws n live events plus the
    backlogs that come back meanwhile."""

    def __init__(self, seed: int = 0, devices: int = DEVICES):
        rng = np.random.default_rng([seed, 17])
        self._rng = np.random.default_rng([seed, 18])
        self.ids = [f"dev{i:05d}" for i in rng.permutation(devices).tolist()]
        shares = np.array([s for s, _, _ in CLOCK_ERRORS])
        kind = rng.choice(len(CLOCK_ERRORS), size=devices, p=shares / shares.sum())
        low = np.array([lo for _, lo, _ in CLOCK_ERRORS])[kind]
        high = np.array([hi for _, _, hi in CLOCK_ERRORS])[kind]
        sign = np.where(rng.random(devices) < 0.5, -1, 1)
        # A device's clock reads ours minus this (received - sent = error + network delay).
        self.errors_ms = (sign * rng.uniform(low, high)).astype(np.int64)
        self.platform = _pick(rng, PLATFORMS, devices)
        self.version = _pick(rng, APP_VERSIONS, devices)
        self._users = [f"u{i:05d}" for i in rng.integers(0, 50_000, devices).tolist()]

    def error_of(self, device: str) -> int:
        return int(self.errors_ms[self.ids.index(device)])

    def events(self, n: int, now_ms: int) -> DeviceEvents:
        rng = self._rng
        who = (rng.zipf(1.3, n) - 1) % len(self.ids)  # some devices are used far more than others
        delay = rng.exponential(SEND_DELAY_MEAN_MS, n).astype(np.int64)
        sent = np.full(n, now_ms, dtype=np.int64) - rng.integers(0, 250, n)
        true = sent - delay
        offline = np.zeros(n, dtype=bool)
        for _ in range(int(rng.binomial(n, BURST_PER_EVENT))):
            device = int(rng.integers(len(self.ids)))
            size = int(rng.integers(*BURST_EVENTS))
            ages = np.sort(rng.integers(BURST_AGE_MS[0], BURST_AGE_MS[1], size))[::-1]
            who = np.concatenate([who, np.full(size, device)])
            sent = np.concatenate([sent, np.full(size, now_ms - int(rng.integers(0, 250)))])  # all sent at once
            true = np.concatenate([true, sent[-size:] - ages])
            offline = np.concatenate([offline, np.ones(size, dtype=bool)])
        m = len(who)
        error = self.errors_ms[who]
        durations = np.round(rng.lognormal(np.log(8_000.0), 1.0, m), 0)
        return DeviceEvents(
            device=[self.ids[i] for i in who.tolist()],
            true_ms=true.tolist(),
            time_ms=(true - error).tolist(),
            sent_ms=(sent - error).tolist(),
            offline=offline.tolist(),
            strings={"device_id": [self.ids[i] for i in who.tolist()], "screen": _pick(rng, SCREENS, m),
                     "platform": [self.platform[i] for i in who.tolist()],
                     "app_version": [self.version[i] for i in who.tolist()],
                     "user_id": [self._users[i] for i in who.tolist()]},
            numbers={"duration_ms": durations.tolist()},
        )
