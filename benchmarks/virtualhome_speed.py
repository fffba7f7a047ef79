"""Steps/s of the VirtualHome adapter: gold programs of every train task, and random
candidate actions, each with the per-step admissible list, in both admissible modes.

Usage: PYTHONPATH=. python benchmarks/virtualhome_speed.py
"""

import random
import time

from environments import make_env


def _run(env, policy, n_tasks, rng):
  steps, t_reset, t_step = 0, 0.0, 0.0
  for i in range(n_tasks):
    t = time.perf_counter()
    r = env.reset("train", i)
    t_reset += time.perf_counter() - t
    while not r.done:
      a = env.expert_action() if policy == "expert" else rng.choice(r.info.admissible_actions)
      if a is None:
        break
      t = time.perf_counter()
      r = env.step(a)
      t_step += time.perf_counter() - t
      steps += 1
  return steps, t_step, t_reset


def main():
  rng = random.Random(0)
  for mode in ("nearby", "all"):
    env = make_env("virtualhome", admissible=mode)
    for policy, n in (("expert", env.num_tasks("train")), ("random", 40)):
      steps, t_step, t_reset = _run(env, policy, n, rng)
      print(f"admissible={mode:6s} {policy:6s}: {steps} steps over {n} episodes: "
            f"{steps / t_step:.0f} steps/s; reset {1000 * t_reset / n:.0f} ms "
            f"(scene graph read from JSON unless among the last 64)")


if __name__ == "__main__":
  main()
