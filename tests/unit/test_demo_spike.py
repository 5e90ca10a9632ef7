"""Demo latency spikes: one endpoint slowed by a factor for a window of event time, the
--spike option that asks for it, and the producer's lines when it starts and ends. Pure: a
fake clock, no network."""

from __future__ import annotations

import argparse
import io
import statistics
from pathlib import Path

import pytest

import demo
from demo import DELAYED, DemoProducer, DemoTraffic, LatencySpike, Stragglers, main, parse_spike
from sketchboard import cli
from tests.support.clock import FakeClock

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
NOW = 1_700_000_000.0
N = 20_000
CART = LatencySpike("/api/cart", factor=40.0, start_s=20.0, duration_s=30.0)  # [NOW+20 s, NOW+50 s)


def _twins(catalog, spikes=(CART,), stragglers=None) -> tuple[FakeClock, DemoTraffic, DemoTraffic]:
    """Two generators on one clock and seed, one with the spikes: they differ only by the spike."""
    clock = FakeClock(NOW)
    plain = DemoTraffic(catalog, seed=7, clock=clock, stragglers=stragglers)
    spiked = DemoTraffic(catalog, seed=7, clock=clock, stragglers=stragglers, spikes=spikes)
    return clock, plain, spiked


def _latencies(events: list[dict], endpoint: str) -> list[float]:
    return [e["latency_ms"] for e in events if e["endpoint"] == endpoint]


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@pytest.fixture(scope="module")
def inside_and_outside(catalog):
    """http_requests from the spiked generator well inside the window and before it."""
    clock = FakeClock(NOW)
    traffic = DemoTraffic(catalog, seed=11, clock=clock, spikes=(CART,))
    clock.now = NOW + 5  # before the window (events lag the clock by at most 2 s)
    before = traffic.generate_stream("http_requests", N)
    clock.now = NOW + 35  # every event time in [NOW+33 s, NOW+35 s]: inside
    inside = traffic.generate_stream("http_requests", N)
    return before, inside


def test_inside_the_window_the_endpoint_is_factor_times_slower(inside_and_outside):
    before, inside = inside_and_outside
    normal, slow = _latencies(before, CART.endpoint), _latencies(inside, CART.endpoint)
    assert len(normal) > 1_000 and len(slow) > 1_000
    assert statistics.median(slow) == pytest.approx(CART.factor * statistics.median(normal), rel=0.2)
    # What a p99 alert sees: far above anything the endpoint does normally.
    assert _p99(slow) > 10 * _p99(normal)
    assert min(slow) > statistics.median(normal)


def test_inside_the_window_other_endpoints_keep_their_latencies(inside_and_outside):
    before, inside = inside_and_outside
    for endpoint in {e["endpoint"] for e in before} - {CART.endpoint}:
        ratio = statistics.median(_latencies(inside, endpoint)) / statistics.median(_latencies(before, endpoint))
        assert 0.8 < ratio < 1.25, endpoint


def test_only_latencies_of_the_spiked_endpoint_change_and_exactly_by_the_factor(catalog):
    clock, plain, spiked = _twins(catalog)
    clock.now = NOW + 35
    a, b = plain.generate_stream("http_requests", 5_000), spiked.generate_stream("http_requests", 5_000)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k != "latency_ms"} == {k: v for k, v in y.items() if k != "latency_ms"}
        if x["endpoint"] == CART.endpoint:
            assert y["latency_ms"] == max(round(x["latency_ms"] * CART.factor, 2), 0.1)
        else:
            assert y["latency_ms"] == x["latency_ms"]


@pytest.mark.parametrize("offset_s", [5.0, 19.999, 52.0, 600.0])  # event times lie in [clock - 2 s, clock]
def test_outside_the_window_nothing_changes(catalog, offset_s):
    clock, plain, spiked = _twins(catalog)
    clock.now = NOW + offset_s
    assert spiked.generate(3_000) == plain.generate(3_000)


def test_the_event_time_decides_not_the_send_time(catalog):
    # 3 s after the window ended every on-time event is outside it, but delayed stragglers
    # still carry event times from inside it: those, and only those, are slow.
    start_ms, end_ms = CART.window_ms(NOW)
    stragglers = Stragglers(delayed_fraction=0.5, delay_mean_s=3.0, late_fraction=0.0, horizon_fraction=0.0,
                            future_fraction=0.0)
    clock, plain, spiked = _twins(catalog, stragglers=stragglers)
    clock.now = NOW + 53
    a, b = plain.generate_stream("http_requests", 20_000), spiked.generate_stream("http_requests", 20_000)
    slow_kinds = []
    for x, y, kind in zip(a, b, spiked.last_kinds):
        if x["endpoint"] == CART.endpoint and start_ms <= x["time"] < end_ms:
            assert y["latency_ms"] == max(round(x["latency_ms"] * CART.factor, 2), 0.1)
            slow_kinds.append(kind)
        else:
            assert y["latency_ms"] == x["latency_ms"]
    assert len(slow_kinds) > 50 and set(slow_kinds) == {DELAYED}


def test_start_counts_from_the_generators_clock_at_construction(catalog):
    clock = FakeClock(NOW + 1_000)
    traffic = DemoTraffic(catalog, clock=clock, spikes=(CART,))
    assert traffic.started_s == NOW + 1_000
    assert CART.window_ms(traffic.started_s) == (int((NOW + 1_020) * 1000), int((NOW + 1_050) * 1000))
    assert DemoTraffic(catalog, clock=clock).spikes == ()  # none by default


def test_spikes_multiply_where_they_overlap(catalog):
    double = (CART, LatencySpike("/api/cart", 0.5, 30.0, 10.0))
    clock, plain, spiked = _twins(catalog, spikes=double)
    clock.now = NOW + 35
    a, b = plain.generate_stream("http_requests", 2_000), spiked.generate_stream("http_requests", 2_000)
    for x, y in zip(a, b):
        if x["endpoint"] == CART.endpoint:
            assert y["latency_ms"] == pytest.approx(x["latency_ms"] * 20, abs=0.02)


# -- validation ----------------------------------------------------------------------------


def test_an_unknown_endpoint_is_refused_with_the_list_of_endpoints():
    with pytest.raises(ValueError, match="unknown demo endpoint '/api/carts'") as info:
        LatencySpike("/api/carts", 40.0, 20.0, 30.0)
    assert "/api/cart, /api/login" in str(info.value) and "/api/search" in str(info.value)


@pytest.mark.parametrize(
    ("factor", "start_s", "duration_s", "message"),
    [
        (0.0, 20.0, 30.0, "factor must be a finite number > 0"),
        (-2.0, 20.0, 30.0, "factor must be a finite number > 0"),
        (float("nan"), 20.0, 30.0, "factor must be a finite number > 0"),
        (float("inf"), 20.0, 30.0, "factor must be a finite number > 0"),
        (40.0, 20.0, 0.0, "duration must be a finite number of seconds > 0"),
        (40.0, 20.0, -1.0, "duration must be a finite number of seconds > 0"),
        (40.0, -5.0, 30.0, "start must be a finite number of seconds >= 0"),
    ],
)
def test_factor_start_and_duration_are_validated(factor, start_s, duration_s, message):
    with pytest.raises(ValueError, match=message):
        LatencySpike("/api/cart", factor, start_s, duration_s)


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("/api/cart:40:20s:30s", LatencySpike("/api/cart", 40.0, 20.0, 30.0)),
        ("/api/search:2.5:1m:500ms", LatencySpike("/api/search", 2.5, 60.0, 0.5)),
        ("/:3:0s:2m", LatencySpike("/", 3.0, 0.0, 120.0)),
    ],
)
def test_parse_spike_reads_endpoint_factor_start_and_duration(spec, expected):
    assert parse_spike(spec) == expected


BAD_SPECS = [
    ("/api/cart:40:20s", "is not ENDPOINT:FACTOR:START:DURATION"),
    ("/api/nope:40:20s:30s", "unknown demo endpoint '/api/nope'"),
    ("/api/cart:fast:20s:30s", "factor 'fast' is not a number"),
    ("/api/cart:0:20s:30s", "factor must be a finite number > 0"),
    ("/api/cart:40:20:30s", "not a duration: '20'"),
    ("/api/cart:40:20s:0s", "duration must be a finite number of seconds > 0"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_SPECS)
def test_a_bad_spike_spec_is_an_argparse_error_that_says_why(spec, message, capsys):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_spike(spec)
    with pytest.raises(SystemExit) as exit_info:
        main(["--spike", spec, "--config", str(CONFIG)])
    assert exit_info.value.code == 2
    assert f"argument --spike: '{spec}'" in capsys.readouterr().err


def test_main_takes_repeated_spikes_and_announces_them(capsys):
    # --duration 0 stops before the first request: nothing touches the network.
    code = main(["--spike", "/api/cart:40:20s:30s", "--spike", "/api/login:3:1m:10s", "--duration", "0",
                 "--url", "http://127.0.0.1:9", "--config", str(CONFIG)])
    assert code == 0
    err = capsys.readouterr().err
    assert "demo: latency spike planned: /api/cart x40 from +20 s for 30 s" in err
    assert "demo: latency spike planned: /api/login x3 from +60 s for 10 s" in err


def test_sketchboard_demo_checks_spikes_and_passes_them_on(monkeypatch, capsys):
    args = cli.build_parser().parse_args(["demo", "--spike", "/api/cart:40:20s:30s", "--spike", "/api/login:3:1m:10s"])
    assert args.spike == ["/api/cart:40:20s:30s", "/api/login:3:1m:10s"]
    seen: list[list[str]] = []
    monkeypatch.setattr(demo, "main", lambda argv, token=None: seen.append(argv) or 0)
    assert cli.cmd_demo(args) == 0
    argv = seen[0]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--spike"] == args.spike
    assert cli.build_parser().parse_args(["up", "--spike", "/api/cart:40:20s:30s"]).spike == ["/api/cart:40:20s:30s"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--spike", "/api/nope:40:20s:30s"])
    assert "sketchboard up: error: argument --spike" in capsys.readouterr().err


# -- the producer's progress lines ---------------------------------------------------------


def test_the_producer_says_once_when_a_spike_starts_and_when_it_ends(catalog):
    clock = FakeClock(NOW)
    out = io.StringIO()
    traffic = DemoTraffic(catalog, clock=clock, spikes=(CART, LatencySpike("/api/login", 3.0, 30.0, 5.0)))
    producer = DemoProducer("http://127.0.0.1:9", traffic, out=out)  # never run: nothing is sent
    for offset_s in (0, 10, 20, 25, 49.9, 50, 60, 70):  # the /api/login spike falls between two ticks
        producer.report_spikes(NOW + offset_s)
    assert out.getvalue().splitlines() == [
        "demo: latency spike started: /api/cart x40 for 30 s",
        "demo: latency spike started: /api/login x3 for 5 s",
        "demo: latency spike ended: /api/login",
        "demo: latency spike ended: /api/cart",
    ]


def test_a_rate_below_zero_is_refused_by_argparse_and_zero_is_passed_on(monkeypatch, capsys):
    """`--rate -50` crashed the demo with a traceback (numpy's n < 0); `--rate 0` was taken for
    unset and 200/s were sent."""
    for argv in (["demo", "--rate", "-50"], ["up", "--rate", "-50"], ["demo", "--rate", "nan"], ["up", "--rate", "x"]):
        with pytest.raises(SystemExit) as exit_:
            cli.build_parser().parse_args(argv)
        assert exit_.value.code == 2
        assert f"sketchboard {argv[0]}: error: argument --rate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--rate", "-50", "--duration", "0", "--url", "http://127.0.0.1:9", "--config", str(CONFIG)])
    assert exit_.value.code == 2 and "must be a number >= 0" in capsys.readouterr().err
    seen: list[list[str]] = []
    monkeypatch.setattr(demo, "main", lambda argv, token=None: seen.append(argv) or 0)
    assert cli.cmd_demo(cli.build_parser().parse_args(["demo", "--rate", "0"])) == 0
    assert seen[0][seen[0].index("--rate") + 1] == "0.0"
