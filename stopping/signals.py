"""SIGTERM and SIGINT turned into a `threading.Event`, set from a thread of its own.

Python runs a signal handler in the main thread between two bytecodes, also while that thread
holds a lock. A handler calling `event.set()` takes the event's condition lock; if the main
thread was inside that event's own `wait` at the moment it held the lock (on entering, or just
after its timeout took the lock back), the handler waits for a lock its own thread holds and the
process hangs for good, deaf to further SIGTERMs. `sketchboard pipeline` waits on its stop event
between batches, many times a second on light load, so a stop could hang it (the soak test saw
one, SIGKILLed after 60 s).

So the handler here only writes a byte to a pipe (a system call, no Python lock), and a thread
blocked on the pipe's other end sets the event."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: threading.Event, signums: Iterable[int] = STOP_SIGNALS) -> Callable[[], None]:
    """Set `stop` when one of `signums` arrives; returns a function that puts back the handlers
    found. Call from the main thread (Python's rule for `signal.signal`)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # a full pipe (a storm of signals) never blocks the handler

    def relay() -> None:
        asked = os.read(read_end, 1)  # b"" (end of file) once put back without a signal
        os.close(read_end)  # later signals' writes fail (BrokenPipeError), and are ignored
        if asked:
            stop.set()

    def on_signal(signum, frame) -> None:
        try:
            os.write(write_end, b"\0")
        except OSError:  # the pipe full or its reader gone: a stop was asked already
            pass

    threading.Thread(target=relay, name="stop-on-signal", daemon=True).start()
    before = {signum: signal.signal(signum, on_signal) for signum in signums}

    def put_back() -> None:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        os.close(write_end)  # the relay's read ends, and its thread with it

    return put_back
