"""Run a benchmark script timed by this process's CPU time instead of the wall clock.

On a loaded machine the wall clock measures the neighbours; one compute thread's CPU time
measures the work. For scripts whose timed work runs in this process (not in actors or a
server), with ``OMP_NUM_THREADS=1``:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_time.py benchmarks/bench_model_overhead.py
"""

from __future__ import annotations

import runpy
import sys
import time

if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {sys.argv[0]} SCRIPT [ARGS...]")
    time.perf_counter = time.process_time  # every later read of the benchmark's clock
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
