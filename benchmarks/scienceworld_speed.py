"""Steps/s of the ScienceWorld adapter per admissible mode, against the raw engine step.

Runs the gold path of a few train tasks through `make_env("scienceworld", ...)` in each
admissible mode and through the engine's bare `PythonInterface.step` in the same JVM (the
reference), and prints steps/s and the ratio. Also times reset (load) with and without the
gold path. The first pass over the modes warms the JVM's JIT; read the second. Usage: PYTHONPATH=. python benchmarks/scienceworld_speed.py [--stock-jvm]
"""

import sys
import time

from environments import make_env

TASKS = (("boil", 0), ("use-thermometer", 0), ("find-living-thing", 0), ("grow-plant", 0))


def main():
  deterministic = "--stock-jvm" not in sys.argv
  env = make_env("scienceworld", task=[t for t, _ in TASKS], step_limit=1000,
                 admissible="none", deterministic=deterministic)
  try:
    paths = {}
    for i, (task, _) in enumerate(TASKS):
      idx = sum(len(env._folds(t)["train"]) for t, _ in TASKS[:i])  # variation 0 of task
      env.reset("train", idx)
      paths[task] = (idx, env.gold_path())
    print(f"deterministic JVM flag: {deterministic}")
    # Reference: bare engine steps (no score/anchor/admissible calls).
    server = env._server
    n, dt = 0, 0.0
    for task, (idx, gold) in paths.items():
      env.reset("train", idx)
      t = time.perf_counter()
      for a in gold:
        server.step(a)
      dt += time.perf_counter() - t
      n += len(gold)
    raw = n / dt
    print(f"raw engine step: {raw:.0f} steps/s over {n} steps")
    for mode in ("none", "objects", "full", "none", "objects", "full"):  # 1st pass warms the JIT
      env._admissible = mode
      n, dt, n_adm = 0, 0.0, 0
      for task, (idx, gold) in paths.items():
        env.reset("train", idx)
        t = time.perf_counter()
        for a in gold:
          r = env.step(a)
          n_adm += len(r.info.admissible_actions)
          if r.done:
            break
        dt += time.perf_counter() - t
        n += len(gold)
      print(f"admissible={mode:8s}: {n / dt:6.1f} steps/s  (x{n / dt / raw:.2f} of raw; "
            f"{n_adm / n:.0f} admissible actions on average)")
    for gold in (False, True):
      env._gold_at_reset = gold
      t = time.perf_counter()
      for task, (idx, _) in paths.items():
        env.reset("train", idx)
      print(f"reset with gold_path={gold}: {(time.perf_counter() - t) / len(paths):.2f} s")
  finally:
    env.close()


if __name__ == "__main__":
  main()
