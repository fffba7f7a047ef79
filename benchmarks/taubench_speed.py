"""Steps/s of the tau-bench adapter: expert episodes (gold tool calls, the closing message and
the scripted user's stop) over every train task of each domain; the end-of-episode grade
(database hash, and the gold replay on the first visit of a task) is timed apart.

Usage: PYTHONPATH=. python benchmarks/taubench_speed.py
"""

import time

from environments import make_env


def main():
  for domain in ("retail", "airline"):
    env = make_env("taubench", domain=domain, system_prompt="brief")
    steps, t_step, t_last, t_reset = 0, 0.0, 0.0, 0.0
    n = env.num_tasks("train")
    for i in range(n):
      t = time.perf_counter()
      r = env.reset("train", i)
      t_reset += time.perf_counter() - t
      while not r.done:
        a = env.expert_action()
        t = time.perf_counter()
        r = env.step(a)
        dt = time.perf_counter() - t
        if r.done:
          t_last += dt  # the step that ends the call carries the grade
        else:
          t_step += dt
          steps += 1
    print(f"{domain}: {steps} turns before the last: {steps / t_step:.0f} turns/s; "
          f"last turn with the grade {1000 * t_last / n:.0f} ms; reset {1000 * t_reset / n:.1f} ms "
          f"({n} episodes)")


if __name__ == "__main__":
  main()
