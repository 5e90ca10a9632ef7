"""Benchmarks: throughput of the pieces and of the running service."""

import sys

# A benchmark run as `python -m bench.<name>` measures the pipeline or the API in its own process:
# with the allocators' settings every `sketchboard` process starts with (sketchboard/allocators.py),
# before anything loads pyarrow. Without them a 2 M-event drain ran ~35 % slower from the query's
# start, its first batches faulting in huge pages (docs/benchmarks.md, session 94). While Python
# looks the module up, sys.argv[0] is "-m"; a test that imports a benchmark changes nothing.
if sys.argv[:1] == ["-m"]:
    from sketchboard.allocators import keep_freed_memory

    keep_freed_memory()
