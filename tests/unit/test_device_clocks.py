"""Device clocks (issue 17, part 2) without a JVM: the stream declaration, the sent time through
validation and the log's record formats, the per-batch plan (which events are shifted by how
much, what is stored), and the store's rows on every backend."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.clock_offsets import (
    CORRECTED,
    INCONSISTENT,
    UNKNOWN,
    WITHIN_TOLERANCE,
    ClockEstimate,
    clock_verdict,
    forget_stale,
)
from aggregates.device_clocks import clock_partials, plan_batch, with_clocks
from api.clock_routes import summarize
from catalog import ConfigError, parse_catalog
from catalog.clocks import off_by
from ingest.events import EventValidator
from ingest.log.records import event_to_json, events_to_batch, json_to_event, project, with_offsets
from ingest.source_rows import to_source_batch
from sketches import HllSketch
from store import BatchCommit, DeadLetter, DeviceClock

MIN = 60_000
HOUR = 3_600_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % MIN

CONFIG = """
streams:
  app:
    time_field: time
    key_field: device_id
    dimensions: [screen]
    values: [duration_ms]
    sent_time_field: sent_at
    max_future_skew: 5m
    retention: 1d
"""


@pytest.fixture(scope="module")
def stream():
    return parse_catalog(CONFIG).stream("app")


# -- the declaration ------------------------------------------------------------------------


def test_the_device_defaults_to_the_key_and_must_be_a_string_field(stream):
    assert (stream.sent_time_field, stream.device_key_field, stream.clock_tolerance) == ("sent_at", "device_id", 2_000)
    with pytest.raises(ConfigError, match="device_field 'duration_ms' must be the key, a dimension or a distinct"):
        parse_catalog(CONFIG.replace("sent_time_field: sent_at", "sent_time_field: sent_at\n    device_field: duration_ms"))
    with pytest.raises(ConfigError, match="sent_time_field 'screen' is also declared as dimensions"):
        parse_catalog(CONFIG.replace("sent_time_field: sent_at", "sent_time_field: screen"))
    with pytest.raises(ConfigError, match="sent_time_field needs a device_field or a key_field"):
        parse_catalog(CONFIG.replace("    key_field: device_id\n", ""))
    with pytest.raises(ConfigError, match="device_field needs sent_time_field"):
        parse_catalog(CONFIG.replace("sent_time_field: sent_at", "device_field: screen"))


# -- the sent time through validation and the log -------------------------------------------


def test_the_sent_time_is_validated_like_a_time_and_kept_in_both_record_formats(stream):
    v = EventValidator(stream)
    event = v.validate({"time": T0, "device_id": "d1", "sent_at": "2027-01-15T08:00:00Z"})
    assert event.sent_time_ms == int(datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() * 1000)  # epoch ms
    assert v.validate({"time": T0, "device_id": "d1"}).sent_time_ms is None  # optional: no sample then
    with pytest.raises(ValueError, match=r"^sent_at: sent time 'soon' is not an RFC 3339 timestamp"):
        v.validate({"time": T0, "device_id": "d1", "sent_at": "soon"})
    assert json_to_event(v, event_to_json(stream, event)) == event  # Kafka: the JSON record
    rows = to_source_batch(stream, 0, with_offsets([0], events_to_batch(stream, [event], T0 + 5))).to_pylist()
    assert (rows[0]["sent_time"], rows[0]["device"]) == (event.sent_time_ms, "d1")  # embedded: the Arrow segment


def test_a_sent_time_declared_later_is_read_from_the_older_records_extra_fields(stream):
    before = parse_catalog(CONFIG.replace("    sent_time_field: sent_at\n", "")).stream("app")
    old = [EventValidator(before).validate({"time": T0, "device_id": "d1", "sent_at": s}) for s in (T0 // 1000, "x")]
    batch = project(events_to_batch(before, old, T0), stream)
    assert batch.column("sent_at").to_pylist() == [T0, None]  # epoch s read as a time; not a time: no sample


# -- the plan of a batch (pure) -------------------------------------------------------------


def test_the_verdict_says_when_an_event_is_shifted():
    steady = ClockEstimate(((T0, -3 * HOUR + 80), (T0 + MIN, -3 * HOUR + 40)))
    assert clock_verdict(steady, tolerance_ms=2_000, max_spread_ms=300_000) == (CORRECTED, -3 * HOUR + 40)
    assert clock_verdict(ClockEstimate(((T0, 900),)), tolerance_ms=2_000, max_spread_ms=300_000) == (WITHIN_TOLERANCE, 0)
    jumped = ClockEstimate(((T0, -3 * HOUR), (T0 + MIN, 40)))  # reset from 3 h ahead to right, a minute ago
    assert clock_verdict(jumped, tolerance_ms=2_000, max_spread_ms=300_000) == (INCONSISTENT, 0)
    assert clock_verdict(ClockEstimate(), tolerance_ms=2_000, max_spread_ms=300_000) == (UNKNOWN, 0)
    assert forget_stale(steady, horizon_ms=T0 + 2 * MIN) == ClockEstimate()
    assert forget_stale(steady, horizon_ms=T0) == steady


def test_a_batch_plan_merges_its_samples_into_the_stored_estimates(stream):
    streams = {"app": stream}
    stored = {("app", "ahead"): DeviceClock(((T0, -HOUR + 50),), -HOUR + 50, -HOUR + 50, T0),
              ("app", "gone"): DeviceClock(((T0 - 2 * 86_400_000, 10_000),), 10_000, 10_000, T0 - 2 * 86_400_000),
              ("app", "fine"): DeviceClock(((T0, 300),), 300, 0, T0)}
    samples = [("app", "ahead", T0 + MIN, -HOUR + 20), ("app", "behind", T0 + MIN, 2 * HOUR + 90)]
    plan = plan_batch(stored, samples, streams, batch_now_ms=T0 + 2 * MIN)
    assert plan.corrections == {("app", "ahead"): -HOUR + 20, ("app", "behind"): 2 * HOUR + 90}
    assert plan.changed == {"app": {
        "ahead": DeviceClock(((T0, -HOUR + 50), (T0 + MIN, -HOUR + 20)), -HOUR + 20, -HOUR + 20, T0 + MIN),
        "behind": DeviceClock(((T0 + MIN, 2 * HOUR + 90),), 2 * HOUR + 90, 2 * HOUR + 90, T0 + MIN),
        "gone": DeviceClock(()),  # not heard from within the retention: forgotten
    }}  # "fine" did not change: not written again
    assert set(plan.after) == {("app", "ahead"), ("app", "behind"), ("app", "fine")}
    # The plan is a function of the state and the samples: a replayed batch plans the same.
    assert plan_batch(stored, list(reversed(samples)), streams, batch_now_ms=T0 + 2 * MIN) == plan


clock_samples_strategy = st.lists(st.tuples(st.sampled_from(["d1", "d2", "d3", "d4", "d5"]), st.integers(0, 40),
                                            st.sampled_from([50, 900, -3 * HOUR, 2 * HOUR, 4_000])), max_size=12)


@settings(max_examples=150, deadline=None)
@given(clock_samples_strategy, clock_samples_strategy, st.integers(0, 3 * 24 * 60), st.booleans())
def test_a_batch_judging_only_what_can_change_plans_as_judging_every_estimate(first, second, later_min, dropped):
    """Every batch but a process's first judges only the devices heard from, gone stale or of a
    stream no longer declaring a sent time (judging all 5 000 of the demo cost ~40-50 ms a batch:
    python -m bench.clock_plan); the plan must be the one judging every estimate gives."""
    stream = parse_catalog(CONFIG).stream("app")
    streams = {"app": stream}
    as_samples = lambda raw, base: [("app", d, base + m * MIN, off + m) for d, m, off in raw]  # noqa: E731
    state = plan_batch({}, as_samples(first, T0), streams, batch_now_ms=T0 + 41 * MIN).after
    now = T0 + 41 * MIN + later_min * MIN  # up to 3 days on: some devices past the 1-day retention
    samples = as_samples(second, now - 40 * MIN)
    if dropped:  # the stream no longer declares a sent time: its estimates go
        streams = {}
        samples = []
    whole = plan_batch(state, samples, streams, batch_now_ms=now, whole=True)
    assert plan_batch(state, samples, streams, batch_now_ms=now, whole=False) == whole


def test_the_devices_heard_from_become_rows_of_the_derived_clocks_stream(stream):
    """catalog/clocks.py: `app_clocks` with its metrics; per batch, a row per device heard from (at
    its newest minute of receive time, with its estimate after the batch), rolled up per pane."""
    catalog = parse_catalog(CONFIG)
    derived = catalog.streams["app_clocks"]
    assert (derived.derived_from, derived.dimensions, derived.pane) == ("app", ("off_by", "shifted"), MIN)
    assert catalog.metrics["app_clock_offset"].value == "abs_offset_ms"
    assert catalog.metrics["app_clock_devices"].distinct == "device"
    assert [off_by(o, 2_000) for o in (0, -2_000, 2_001, -MIN, MIN + 1, -HOUR - 1)] == [
        "tolerance", "tolerance", "1m", "1m", "1h", "more"]
    stored = {("app", "quiet"): DeviceClock(((T0, -5 * HOUR),), -5 * HOUR, -5 * HOUR, T0)}
    samples = [("app", "ahead", T0 + MIN, -HOUR - 20), ("app", "ahead", T0 + 2 * MIN, -HOUR - 30),
               ("app", "fine", T0 + MIN, 300), ("app", "fine2", T0 + MIN, -400)]
    plan = plan_batch(stored, samples, {"app": stream}, batch_now_ms=T0 + 3 * MIN)
    partials, newest = clock_partials(plan, {"app": stream})
    got = {(p.start_ms, tuple(sorted(p.dims.items()))): (p.data.count, p.data.values["abs_offset_ms"].max,
                                                          p.data.values["offset_ms"].min)
           for p in partials}
    assert got == {  # "quiet" was not heard from: no row
        (T0 + 2 * MIN, (("off_by", "more"), ("shifted", "yes"))): (1, HOUR + 30, -HOUR - 30),
        (T0 + MIN, (("off_by", "tolerance"), ("shifted", "no"))): (2, 400, -400),
    }
    assert newest == {"app_clocks": T0 + 2 * MIN}
    devices = {p.start_ms: round(HllSketch.from_bytes(p.data.distincts["device"]).estimate().estimate)
               for p in partials}
    assert devices == {T0 + MIN: 2, T0 + 2 * MIN: 1}
    # In the batch's commit, with the estimates it changed.
    commit = with_clocks(BatchCommit("main", 0, [], 0), plan, {"app": stream})
    assert commit.device_clocks == plan.changed and commit.partials == partials
    assert commit.max_event_ms == {"app_clocks": T0 + 2 * MIN}


def test_the_clocks_answer_summarizes_the_offsets():
    clocks = {f"d{i}": DeviceClock(((T0, o),), o, o if abs(o) > 2_000 else 0, T0)
              for i, o in enumerate([100, 300, -HOUR, 5 * HOUR, 90_000])}
    out = summarize("app", clocks, threshold_ms=MIN, limit=2)
    assert (out.devices, out.corrected, out.above) == (5, 3, 3)
    assert out.offset_quantiles_ms["p0"] == -HOUR and out.offset_quantiles_ms["p100"] == 5 * HOUR
    assert out.offset_quantiles_ms["p50"] == 300
    assert [(d.device, d.offset_ms) for d in out.worst] == [("d3", 5 * HOUR), ("d2", -HOUR)]


# -- the store, every backend ---------------------------------------------------------------


def test_estimates_and_corrections_are_stored_with_the_batch(store_backend):
    store = store_backend.create()
    clock = DeviceClock(((T0, -HOUR + 20), (T0 + MIN, -HOUR + 30)), -HOUR + 20, -HOUR + 20, T0 + MIN)
    dead = DeadLetter("app", 0, 7, "future_skew", T0 + 3 * HOUR, T0, None, {"screen": "home"}, clock_correction_ms=-HOUR)

    def commit(batch_id, clocks, dead_letters=()):
        return BatchCommit("main", batch_id, [], len(dead_letters), dead_letters=list(dead_letters),
                           read_by_stream={"app": len(dead_letters)},
                           dead_by_stream={"app": {"future_skew": len(dead_letters)}} if dead_letters else {},
                           device_clocks=clocks)

    store.commit_batch(commit(0, {"app": {"a": clock, "b": DeviceClock(((T0, 5),), 5, 0, T0)}}, [dead]),
                       lateness_ms={"app": 30_000}, now_ms=1)
    assert store.device_clocks("app") == {"a": clock, "b": DeviceClock(((T0, 5),), 5, 0, T0)}
    assert store.dead_letters()[0].letter == dead
    store.commit_batch(commit(1, {"app": {"b": DeviceClock(())}}), lateness_ms={"app": 30_000}, now_ms=2)
    assert store.device_clocks("app") == {"a": clock}
    # A replayed batch changes nothing: the estimates are those of its first commit.
    assert not store.commit_batch(commit(1, {"app": {"a": DeviceClock(())}}), lateness_ms={"app": 30_000},
                                  now_ms=3).committed
    assert store.device_clocks("app") == {"a": clock}


def test_a_process_first_batch_judges_the_stored_estimates_again_under_the_settings_of_now(store_backend):
    """Estimates read from the store were judged under the settings of the process that stored them:
    a wider clock_tolerance since must take back a correction at once, not when the device is next
    heard from. Later batches judge only what changed (their state is the plan's own)."""
    from aggregates.device_clocks import DeviceClocks

    store = store_backend.create()
    clock = DeviceClock(((T0, 3_000),), 3_000, 3_000, T0)  # 3 s off: corrected under the 2 s tolerance
    store.commit_batch(BatchCommit("main", 0, [], 0, device_clocks={"app": {"a": clock}}),
                       lateness_ms={"app": 30_000}, now_ms=1)
    wider = parse_catalog(CONFIG.replace("retention: 1d", "retention: 1d\n    clock_tolerance: 5s"))
    clocks = DeviceClocks(None, wider, store)  # no Spark: a batch with no sampled stream reads none
    plan = clocks.plan(None, batch_now_ms=T0 + MIN, streams=[])
    assert plan.corrections == {} and plan.changed == {"app": {"a": DeviceClock(((T0, 3_000),), 3_000, 0, T0)}}
    clocks.committed(plan)
    again = clocks.plan(None, batch_now_ms=T0 + 2 * MIN, streams=[])
    assert (again.corrections, again.changed, again.after) == ({}, {}, plan.after)


def test_events_naming_no_device_are_no_device_and_get_no_correction():
    """A device field that is a dimension is stored as "" when an event leaves it out: such
    events are no device at all, not one device whose smallest offset would correct them all
    (a phone 3 h ahead shifting a right clock's event back 3 h)."""
    from aggregates.driver_rules import clock_samples, corrected

    s = parse_catalog("streams:\n  app: {key_field: user, dimensions: [device], device_field: device,"
                      " sent_time_field: sent_at}\n").streams["app"]
    v = EventValidator(s)
    ahead = v.validate({"time": T0 + 3 * HOUR, "sent_at": T0 + 3 * HOUR, "user": "alice"})
    right = v.validate({"time": T0 - 1000, "sent_at": T0, "user": "bob"})
    named = v.validate({"time": T0 + 3 * HOUR, "sent_at": T0 + 3 * HOUR, "user": "carol", "device": "p1"})
    rows = pa.Table.from_batches([to_source_batch(s, 0, with_offsets([0, 1, 2],
                                                                     events_to_batch(s, [ahead, right, named], T0 + 50)))])
    assert rows["device"].to_pylist() == [None, None, "p1"]
    plan = plan_batch({}, clock_samples(rows, ["app"]), {"app": s}, batch_now_ms=T0 + 50)
    assert set(plan.corrections) == {("app", "p1")}
    assert corrected(rows, plan.corrections)["event_time"].to_pylist()[:2] == [T0 + 3 * HOUR, T0 - 1000]


def test_a_clock_tolerance_not_below_the_future_skew_is_refused():
    """Between the two, a device ahead would be left uncorrected and every event of it lost as
    future_skew."""
    with pytest.raises(ConfigError, match=r"clock_tolerance \(10m\) must be less than max_future_skew \(5m\)"):
        parse_catalog("streams:\n  app: {key_field: d, sent_time_field: s, clock_tolerance: 10m,"
                      " max_future_skew: 5m}\n")


def test_a_clock_set_forward_is_followed_at_once_and_one_set_back_is_not():
    """A forward jump's newest minute holds the smallest offset: it is used from the first batch
    that sees it (before, the older minutes' larger offsets made the estimate inconsistent for a
    whole clock_window, its events dead-lettered as future_skew meanwhile). A clock set back
    leaves the older, smaller minima above the newest: not used until they leave the window."""
    s = {"app": parse_catalog("streams:\n  app: {key_field: d, sent_time_field: sent_at}\n").streams["app"]}
    state: dict = {}
    for m in range(5):  # a clock an hour behind ...
        state = plan_batch(state, [("app", "d", T0 + m * MIN, HOUR)], s, batch_now_ms=T0 + m * MIN).after
    forward = plan_batch(state, [("app", "d", T0 + 5 * MIN, -HOUR)], s, batch_now_ms=T0 + 5 * MIN)  # ... now one ahead
    assert forward.corrections[("app", "d")] == -HOUR
    back = plan_batch(forward.after, [("app", "d", T0 + 6 * MIN, HOUR)], s, batch_now_ms=T0 + 6 * MIN)
    assert ("app", "d") not in back.corrections  # inconsistent: the -1 h minute is still in the window


def test_a_stream_name_too_long_for_its_clock_metrics_is_refused_at_sent_time_field():
    name = "a" * 50  # a*50_clocks fits; a*50_clock_devices has 64 characters
    text = CONFIG.replace("  app:", f"  {name}:")
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="t.yaml")
    line = text.splitlines().index("    sent_time_field: sent_at") + 1
    assert str(info.value) == (
        f"t.yaml: line {line}: streams.{name}.sent_time_field: stream name {name!r} is too long for its derived"
        f" stream and metric names: '{name}_clock_devices' has 64 characters, at most 63 (shorten the name to at most 49)")
    assert f"{'a' * 49}_clock_devices" in parse_catalog(text.replace(name, "a" * 49)).metrics
