"""The memory allocators of a Sketchboard process told to keep freed memory for the next batch.

A pipeline batch and an API request allocate and free arrays of megabytes again and again (a
batch's columns, its sort orders, a request's parsed columns and encoded segment). By default both
allocators give freed memory back to the kernel at once: glibc trims its heap when more than twice
the last large block is free at its top and maps anything above its threshold on its own, and Arrow's
mimalloc decommits freed memory 1 s after it is freed. The next batch then takes the same pages
again as page faults, each one a kernel entry and a page zeroed. In issue 28's end to end (2 M events
POSTed and aggregated, docs/benchmarks.md session 77) the pipeline took ~90 000 minor faults and
the API ~45 000, and the kernel's share of their CPU was ~20 % and ~13 %.

So each process keeps what it freed:
- Arrow's mimalloc purges freed memory after 5 s instead of 1 s (`MIMALLOC_PURGE_DELAY`): an idle
  service still gives it back, a busy one reuses it. mimalloc reads it when Arrow is loaded, so it
  is put in the environment before any import of pyarrow (and the children inherit it).
- mimalloc's arenas without transparent huge pages (`MIMALLOC_ALLOW_THP=0`): by default mimalloc
  lets the kernel back its arenas (1 GiB reserved, committed at once) with 2 MiB pages, and a page
  its purge gave back comes again as a whole huge page zeroed, however little of it is used. In
  the end to end the pipeline spent 2.9-3.6 s of system time, most of it zeroing such pages, of its
  ~5 s CPU for 2 M events; without them 0.2-0.4 s, and the end to end went from 330 000-350 000 to
  555 000-575 000 events/s (docs/benchmarks.md, session 94). Same place, same reason: the environment.
- glibc maps blocks on their own only from 32 MiB (its own ceiling for the threshold it otherwise
  raises as blocks are freed) and trims its heaps past 512 MiB free: through `mallopt`, since glibc
  read its `MALLOC_*_` variables at its first allocation, long before this runs.
- glibc keeps one arena, the main one, for every thread (`M_ARENA_MAX` 1). A thread's own arena
  is made of heaps of at most 64 MiB, mapped apart, and a heap that a batch's arrays of tens of
  MiB leave empty is unmapped, then faulted in again by the next batch (here: 24 MiB blocks freed
  and taken again by a thread, ~1 000 faults a round; none in the main arena). The API's requests
  and the pipeline's Bloom and sessions step run in threads. In issue 28's end to end (4 M events,
  three alternated pairs with `MALLOC_ARENA_MAX=1` and a 256 MiB top pad in the environment) the
  pipeline took 106 000-143 000 minor faults and 0.6-1.0 s of system time, against 179 000-195 000
  and 1.1-1.6 s without; as shipped the faults follow the batches past 32 MiB arrays more than the
  arenas (docs/benchmarks.md session 100). The GIL serialises most allocations anyway, so one
  lock costs little.

A value the environment already sets is left alone: each of mimalloc's two, glibc's
`MALLOC_ARENA_MAX`, and its `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` (either one set
keeps both as the environment made them). Elsewhere than glibc on Linux nothing is changed but
mimalloc's settings.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, MutableMapping

log = logging.getLogger("sketchboard")

MIMALLOC_PURGE_DELAY_MS = 5_000
# mimalloc's options (read from the environment as Arrow loads it) and the values set where unset.
MIMALLOC_SETTINGS = {"MIMALLOC_PURGE_DELAY": str(MIMALLOC_PURGE_DELAY_MS), "MIMALLOC_ALLOW_THP": "0"}
GLIBC_MMAP_THRESHOLD = 32 << 20
GLIBC_TRIM_THRESHOLD = 512 << 20
GLIBC_ARENA_MAX = 1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h
_GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_ARENA_VARIABLE = "MALLOC_ARENA_MAX"
# The thresholds as the environment variables glibc reads when a process starts.
_GLIBC_SETTINGS = dict(zip(_GLIBC_VARIABLES, (str(GLIBC_MMAP_THRESHOLD), str(GLIBC_TRIM_THRESHOLD)), strict=True))


def keep_freed_memory(environ: MutableMapping[str, str] = os.environ,
                      mallopt: Callable[[int, int], int] | None = None) -> list[str]:
    """Apply the settings above to this process (and, through `environ`, to its children); returns
    what was set, for the log. `mallopt`: glibc's, found here where None."""
    done = []
    for name, value in MIMALLOC_SETTINGS.items():
        if name not in environ:
            environ[name] = value
            done.append(f"{name}={value}")
    mallopt = mallopt or _glibc_mallopt()
    if mallopt is None:
        return done
    if _ARENA_VARIABLE not in environ:
        if mallopt(_M_ARENA_MAX, GLIBC_ARENA_MAX) == 1:
            done.append(f"glibc arenas {GLIBC_ARENA_MAX}")
        else:
            log.warning("glibc's mallopt refused the arenas: each thread may take its own, as glibc decides")
    if any(name in environ for name in _GLIBC_VARIABLES):
        return done
    # Both or neither: the trim threshold alone would fix the mmap threshold at its 128 KiB default
    # (any explicit setting stops glibc raising it), and every block above it would fault afresh.
    if mallopt(_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD) == 1:
        done.append(f"glibc mmap threshold {GLIBC_MMAP_THRESHOLD >> 20} MiB, trim threshold {GLIBC_TRIM_THRESHOLD >> 20} MiB")
    else:
        log.warning("glibc's mallopt refused the thresholds: freed memory is given back as glibc decides")
    return done


def child_environment(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The same settings for a child process started with a fresh interpreter that does not call
    keep_freed_memory (the API's ingest workers): as the environment variables mimalloc and glibc
    read when the child starts. What the environment sets already is left to it."""
    out = {name: value for name, value in MIMALLOC_SETTINGS.items() if name not in environ}
    if _ARENA_VARIABLE not in environ:
        out[_ARENA_VARIABLE] = str(GLIBC_ARENA_MAX)
    if not any(name in environ for name in _GLIBC_VARIABLES):
        out.update(_GLIBC_SETTINGS)
    return out


def remote_environment(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The same settings for processes on other machines, which inherit nothing from this one (a
    Spark cluster's executors and their Python workers, through `spark.executorEnv.*`): every
    variable as this process's environment sets it, else as child_environment sets it."""
    given = {name: environ[name] for name in (*MIMALLOC_SETTINGS, _ARENA_VARIABLE, *_GLIBC_VARIABLES)
             if name in environ}
    return {**given, **child_environment(environ)}


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    try:  # glibc answers with its name and version; musl and other systems have no such name
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
    except (ValueError, OSError, AttributeError):
        return None
    try:
        # The process's own symbols, glibc's among them: ctypes.util.find_library would run
        # `ldconfig -p` at every start of a command.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


__all__ = ["GLIBC_ARENA_MAX", "GLIBC_MMAP_THRESHOLD", "GLIBC_TRIM_THRESHOLD", "MIMALLOC_PURGE_DELAY_MS",
           "MIMALLOC_SETTINGS", "child_environment", "keep_freed_memory", "remote_environment"]
