"""One step of a batch run in a thread beside the steps that do not need its result.

The driver's batch steps are mostly Arrow, numpy and SQLite work, which release the GIL: in a
2 M-event demo drain, py-spy found the pipeline's thread holding the GIL in ~38 % of its
samples of the batch (`--gil` against all samples). The Bloom features' and sessions' key rows
(aggregates/key_rows.py) need only the batch's rows, so they run while the partials, the
commit's plan and the joins are computed, on the machine's other core. The result is taken
where the step ran before, so the batch's commit is the same; an error is raised there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


class SideStep(Generic[T]):
    def __init__(self, future: Future):
        self._future = future

    def result(self) -> T:
        return self._future.result()

    def wait(self) -> None:
        """Until the step is done, whatever its outcome (its error is raised by result())."""
        try:
            self._future.result()
        except BaseException:  # noqa: BLE001 - raised by result() where the batch takes it
            pass


def side_step(fn: Callable[..., T], *args, **kwargs) -> SideStep[T]:
    """fn(*args, **kwargs) started in the side thread (one for the process: one step at a time)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-side-step")
    return SideStep(_pool.submit(fn, *args, **kwargs))
