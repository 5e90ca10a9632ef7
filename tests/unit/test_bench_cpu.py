"""bench/cpu.py, which the benchmarks read their processes' CPU with: a child found by a word of its
command line (`sketchboard up`'s api and pipeline), its CPU counted in its parent's tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cpu import child_by_command, tree_cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")


def test_a_child_is_found_by_a_word_of_its_command_line_and_counted_in_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(30)", "pipeline"])
    try:
        deadline = time.monotonic() + 10
        while child_by_command(os.getpid(), "pipeline") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child_by_command(os.getpid(), "pipeline") == child.pid
        assert child_by_command(os.getpid(), "api") is None  # a word, not a part of one ("pipeline" holds no "api")
        assert child_by_command(os.getpid(), "pipe") is None
        while not tree_cpu_seconds(child.pid) and time.monotonic() < deadline:  # python's start takes some
            time.sleep(0.05)
        assert tree_cpu_seconds(os.getpid()) >= tree_cpu_seconds(child.pid) > 0
    finally:
        child.kill()
        child.wait()


def test_a_child_touching_fresh_memory_shows_its_faults_and_its_cpu_split():
    """A child that writes 200 MiB of fresh pages (51 200 of 4 KiB) takes at least that many minor
    faults and spins for 0.3 s of CPU: the tree's usage shows both, and its parts add up to its CPU."""
    from bench.cpu import tree_usage

    code = ("import sys, time\nb = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
            "t = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('ok', flush=True)\n"
            "time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        usage = tree_usage(child.pid)
        assert usage.minor_faults >= 51_200
        # The kernel samples user and system per tick, so their split is rough on this VM (a run
        # saw 0.1 s user and 0.4 s system for the same child): each is there, and they add up.
        assert usage.cpu >= 0.3 and usage.user > 0 and usage.system > 0
        assert usage.cpu == pytest.approx(usage.user + usage.system)
        assert tree_cpu_seconds(child.pid) == pytest.approx(usage.cpu)
        assert (usage - usage).minor_faults == 0 and (usage + usage).user == pytest.approx(2 * usage.user)
    finally:
        child.kill()
        child.wait()


def test_the_side_by_sides_rounds_print_each_ratio_and_their_median():
    """The ratio is to the plain job's warm run (the bar's); its cold run is printed beside it."""
    from bench.side_by_side import rounds_table

    one = rounds_table([(100_000.0, 150_000.0, 60_000.0)])
    assert "| 100,000 |" in one and "| 60,000 |" in one and "| 150,000 |" in one
    assert "ratio Sketchboard / plain: 1.50 x (bar: 2 x; to the cold run: 2.50 x)" in one
    three = rounds_table([(100_000.0, 150_000.0, 50_000.0), (200_000.0, 420_000.0, 100_000.0),
                          (100_000.0, 190_000.0, 95_000.0)])
    assert "| 2 | 200,000 | 100,000 | 420,000 | 2.10 x (4.20 x) |" in three
    assert "median ratio Sketchboard / plain over 3 rounds: 1.90 x (from 1.50 to 2.10; bar: 2 x)" in three


def test_the_side_by_sides_like_for_like_config_declares_the_events_and_nothing_optional():
    """bench/configs/same_aggregates.yaml: every generated field declared (an undeclared one sends a
    body down the per-event path), the plain job's 1-minute window, none of the features it lacks."""
    from bench.side_by_side import SAME_AGGREGATES, STREAM, generate
    from catalog import load_catalog

    catalog = load_catalog(SAME_AGGREGATES)
    assert list(catalog.streams) == [STREAM]
    stream = catalog.stream(STREAM)
    declared = {stream.time_field, *stream.string_fields, *stream.values}
    assert {field for event in generate(500, 500)[0] for field in event} == declared
    assert stream.pane == 60_000 and stream.tiers == ()
    assert (stream.first_seen, stream.membership, stream.sessions, stream.enrich) == (None, None, None, ())


def test_the_side_by_side_refuses_a_config_it_cannot_post_to_before_it_runs_anything(tmp_path, capsys):
    from bench.side_by_side import main

    other = tmp_path / "other.yaml"
    other.write_text("streams:\n  readings:\n    time_field: t\nmetrics: {}\n")
    for config, reason in ((tmp_path / "missing.yaml", "cannot read"), (other, "no stream 'http_requests'")):
        with pytest.raises(SystemExit) as stopped:
            main(["--config", str(config)])
        assert stopped.value.code == 2 and reason in capsys.readouterr().err


def test_the_side_by_side_prints_the_bars_cpu_budget_beside_what_each_half_spent():
    """2x a plain job of 3.6 s for 2 M events on 2 cores: Sketchboard may take 1.8 s, so 3.6 s of CPU,
    1.8 us an event for its clients, API and pipeline together."""
    from bench.side_by_side import budget_line

    spent = {"clients": 0.4, "api": 5.6, "pipeline": 4.0, "rest": 0.2}
    line = budget_line(2_000_000, 2, 3.6, 5.8, spent)
    assert line == ("CPU an event: the plain job (warm) 2.9 us; Sketchboard 5.1 us (clients 0.2, api 2.8,"
                    " pipeline 2.0, rest 0.1). 2 x the plain job on 2 cores leaves 1.8 us an event for all of"
                    " Sketchboard's; this run spent 2.8 x that")
    # Without /proc the budget alone, which needs only the wall times.
    assert budget_line(1_000_000, 1, 2.0, None, None) == "2 x the plain job on 1 core leaves 1.0 us an event"


def test_the_ingest_benchmark_prints_the_bars_cpu_budget_a_request_beside_each_parts():
    """250 000 events/s in 1 000-event requests is 250 requests a second: on 2 cores, 8 ms of CPU a
    request for clients and server together (10 000-event requests: 80 ms)."""
    from bench.throughput import request_budget_line

    line = request_budget_line(1000, 2, {"API process": 1.5, "ingest workers": 5.5, "clients": 2.0})
    assert line == ("CPU a request: 9.00 ms (API process 1.50, ingest workers 5.50, clients 2.00). 250,000 events/s"
                    " in requests of 1,000 on 2 cores leaves 8.00 ms a request for all of them; this run spent"
                    " 1.12 x that")
    assert "leaves 80.00 ms a request" in request_budget_line(10_000, 2, {"API process": 1.0})
    assert "on 1 core leaves 4.00 ms" in request_budget_line(1000, 1, {"API process": 1.0})


def test_a_processs_own_cpu_is_read_while_it_lives_and_none_once_it_is_gone():
    """What the ingest benchmark reads its ingest workers' CPU with (one process each, not a tree)."""
    from bench.cpu import process_cpu_seconds

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.2: pass\nprint('ok', flush=True)\ntime.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        assert process_cpu_seconds(child.pid) >= 0.2
    finally:
        child.kill()
        child.wait()
    assert process_cpu_seconds(child.pid) is None


def test_the_side_by_sides_cpu_by_part_takes_the_api_and_pipeline_out_of_the_services_tree():
    from bench.cpu import Usage
    from bench.side_by_side import spent_by_part

    start = {"api": Usage(1.0, 0.0), "pipeline": Usage(2.0, 0.5), "service": Usage(3.6, 0.5), "clients": Usage(0.1, 0.0)}
    done = {"api": Usage(4.0, 0.5), "pipeline": Usage(4.0, 1.0), "service": Usage(9.0, 1.6), "clients": Usage(0.4, 0.1)}
    assert spent_by_part(start, done) == pytest.approx({"clients": 0.4, "api": 3.5, "pipeline": 2.5, "rest": 0.5})
    assert spent_by_part({**start, "api": None}, done) is None


def test_the_ingest_benchmark_says_how_many_groups_the_workers_took_the_bodies_in():
    from types import SimpleNamespace

    from bench.throughput import group_sizes

    assert group_sizes(SimpleNamespace(handled=1200, groups=820)) == " (1,200 bodies in 820 groups)"
    assert group_sizes(SimpleNamespace(handled=0, groups=0)) == ""
    assert group_sizes(None) == ""


def test_the_benchmarks_ingest_processes_takes_what_the_setting_takes(capsys):
    from bench.throughput import ingest_processes_argument, main

    assert ingest_processes_argument("auto") == "auto"
    assert ingest_processes_argument("3") == 3
    with pytest.raises(SystemExit):
        main(["--ingest-processes", "many"])
    refused = capsys.readouterr().err
    assert "--ingest-processes: a number of worker processes from 0 to 64, or auto; got 'many'" in refused
