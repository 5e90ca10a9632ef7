"""The late and broken part of the demo traffic: which share of events is sent late, after
their pane became final, older than the retention, or from a clock far in the future."""

from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class Stragglers:
    """The late and broken part of the demo traffic (fractions of all events, per stream).

    delayed_fraction      sent late by an exponential delay with mean delay_mean_s (most
                          land inside the allowed lateness: the pane is still provisional)
    late_fraction         sent after the pane became final: delay = allowed_lateness + pane
                          + 1 s + an exponential with mean allowed_lateness -> a correction
    horizon_fraction      event time older than the stream's retention (by 1 min..1 day)
                          -> dead letter `beyond_retention`
    future_fraction       event time ahead of the clock by more than max_future_skew (by
                          1 min..1 day more) -> dead letter `future_skew`
    """

    delayed_fraction: float = 0.05
    delay_mean_s: float = 5.0
    late_fraction: float = 0.005
    horizon_fraction: float = 0.0005
    future_fraction: float = 0.0002

    def __post_init__(self) -> None:
        fractions = (self.delayed_fraction, self.late_fraction, self.horizon_fraction, self.future_fraction)
        if any(not 0.0 <= f <= 1.0 for f in fractions) or sum(fractions) > 1.0:
            raise ValueError(f"straggler fractions must lie in [0, 1] and add up to at most 1, got {fractions}")
        if not self.delay_mean_s >= 0:
            raise ValueError(f"delay_mean_s must not be negative, got {self.delay_mean_s}")

    @classmethod
    def none(cls) -> Stragglers:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0)


# What _times() made of each event (for tests and for the curious).
ON_TIME, DELAYED, LATE, BEYOND_HORIZON, FUTURE = "on_time", "delayed", "late", "beyond_horizon", "future"
OFFLINE = "offline"  # mobile_app: part of a backlog a device sent after hours offline (demo/devices.py)
