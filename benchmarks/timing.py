"""The one timing helper the benchmarks share."""

import statistics
import time


def median_seconds(fn, reps: int, warmup: int = 0) -> float:
  """Median wall time of `reps` calls of `fn` after `warmup` untimed calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)
