"""SIGTERM and SIGINT set a stop event from a thread of their own (stopping/signals.py), so a
signal landing while the main thread holds the event's lock (inside its own `wait`) cannot hang
the process. The hazard is made certain here, not waited for: the main thread takes the event's
condition lock and raises the signal while it holds it, in a child process, so that a hang fails
the test instead of hanging the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from stopping.signals import stop_on_signals

# The child holds the Event's condition lock (CPython's `threading.Event._cond`: what `wait` holds
# on entering and after its timeout) while its own handler runs, as when a SIGTERM lands there.
HOLDS_THE_LOCK = textwrap.dedent("""
    import signal, sys, threading
    from stopping.signals import stop_on_signals
    stop = threading.Event()
    stop_on_signals(stop)
    with stop._cond:
        signal.raise_signal(getattr(signal, sys.argv[1]))  # the handler runs here, the lock held
    print("stopped" if stop.wait(10) else "never set", flush=True)
""")


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_main_thread_holds_the_events_lock_still_stops(signum):
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_LOCK, signum], capture_output=True, text=True,
                          timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def _assert_main_thread() -> None:
    assert threading.current_thread() is threading.main_thread(), "signal handlers are set from the main thread"


def test_a_real_sigterm_sets_the_event_and_the_handlers_are_put_back():
    _assert_main_thread()
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    put_back = stop_on_signals(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)  # again: the relay is gone, the handler still harmless
    finally:
        put_back()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_put_back_without_a_signal_leaves_the_event_unset_and_ends_the_relay():
    _assert_main_thread()
    stop = threading.Event()
    relays = {t for t in threading.enumerate() if t.name == "stop-on-signal"}
    put_back = stop_on_signals(stop)
    relay = next(t for t in threading.enumerate() if t.name == "stop-on-signal" and t not in relays)
    put_back()
    relay.join(5)
    assert not relay.is_alive() and not stop.is_set()


def test_every_sketchboard_command_prints_its_threads_stacks_on_sigusr1():
    """`kill -USR1 <pid>` of a hung process says where its threads are (sketchboard/cli.py);
    without the registration SIGUSR1 would kill it."""
    child = textwrap.dedent("""
        import os, signal, threading
        from sketchboard import cli
        try:
            cli.main(["pipeline", "--help"])
        except SystemExit:
            pass
        threading.Thread(target=threading.Event().wait, name="waiting", daemon=True).start()
        os.kill(os.getpid(), signal.SIGUSR1)
        print("alive", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.splitlines()[-1:]) == (0, ["alive"]), done.stderr
    assert done.stderr.count("File ") >= 2 and "Current thread" in done.stderr, done.stderr
