"""Steps/s of the `swe` environment per kind of action, on the offline synth tasks.

Times reset (a fresh working copy), `view`, `search`, `replace` (host-side edits), `run`
(a sandboxed shell command) and `submit` (SWE-bench grading: the hidden tests applied and
run), each on train task 0 of `source=synth` (generated and cached on first use).
Usage: PYTHONPATH=. python benchmarks/swe_speed.py [--mechanism rlimit] [--cache_dir DIR]
"""

import argparse
import time

from environments import make_env
from environments.swe import actions as A


def _time(fn, n):
  t = time.perf_counter()
  for _ in range(n):
    fn()
  return (time.perf_counter() - t) / n


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--mechanism", default="")
  p.add_argument("--cache_dir", default="")
  p.add_argument("-n", type=int, default=20)
  args = p.parse_args()
  env = make_env("swe", mechanism=args.mechanism, cache_dir=args.cache_dir, step_limit=10_000)
  try:
    env.reset("train", 0)
    print(f"sandbox: {env._box.mechanism}, processes bounded by: {env._box.nproc_mechanism}")
    path = A.parse(env.expert_action()).args[0]
    edit = A.replace_action(path, "import", "import")  # a no-op replacement
    rows = [("reset", lambda: env.reset("train", 0), max(3, args.n // 4)),
            ("view", lambda: env.step(f"view {path} 1 40"), args.n),
            ("search", lambda: env.step("search def take toolz"), args.n),
            ("replace", lambda: env.step(edit), args.n),
            ("run", lambda: env.step("run ls toolz | head -3"), args.n)]
    env.reset("train", 0)
    for name, fn, n in rows:
      dt = _time(fn, n)
      print(f"{name:8s} {1 / dt:7.1f} /s  ({1000 * dt:6.1f} ms)")

    def submit():
      env.reset("train", 0)
      env.step("submit")
    dt = _time(submit, 3)
    print(f"{'submit':8s} {1 / dt:7.2f} /s  ({1000 * dt:6.1f} ms, reset + grading)")
  finally:
    env.close()


if __name__ == "__main__":
  main()
