"""Steps/s of EnvPool (1, 2, 4 workers) against a plain sequential loop, in one run.

  python -m benchmarks.envpool [--steps 2000] [--workers 1,2,4] [--entries twx_coin,...]

Every entry plays random admissible actions on `num_envs` environments; the reference is
one Python loop over the same number of plain env objects. Add an environment by adding an
entry to ENTRIES.
"""

from __future__ import annotations

import argparse
import random
import time

import environments  # noqa: F401  (registers the installed environments)
from environments import make_env
from environments.pool import EnvPool

# name -> (registered env, kwargs, pool backend)
ENTRIES = {
    "twx_coin": ("twx", {"game": "coin", "step_limit": 50}, "thread"),
    "twx_cookingworld": ("twx", {"game": "cookingworld", "step_limit": 50}, "thread"),
    # ALFWorld's engine and planner are Python (and not thread-safe): one process per env.
    # Eight generated games, cached after the first run; no oracle labels (a planner
    # search per random step would measure the planner, not the pool).
    "alfworld": ("alfworld", {"source": "generated", "num_train": 8, "step_limit": 50,
                              "oracle_labels": False}, "process"),
}
# Random steps per measurement, where an entry needs fewer than --steps to be stable.
STEPS = {"alfworld": 200}


def _sequential(env_name, kwargs, num_envs, steps):
  envs = [make_env(env_name, **kwargs) for _ in range(num_envs)]
  rng = random.Random(0)
  try:
    results = [env.reset("train", i % _num_train(env_name, kwargs)) for i, env in enumerate(envs)]
    done_steps, task = 0, num_envs
    start = time.perf_counter()
    while done_steps < steps:
      for i, env in enumerate(envs):
        r = env.step(rng.choice(results[i].info.admissible_actions))
        if r.done:
          r, task = env.reset("train", task % env.num_tasks("train")), task + 1
        results[i] = r
      done_steps += num_envs
    return done_steps / (time.perf_counter() - start)
  finally:
    for env in envs:
      env.close()


def _num_train(env_name, kwargs) -> int:
  return kwargs.get("num_train", 1000)


def _pooled(env_name, kwargs, num_envs, steps, backend):
  rng = random.Random(0)
  with EnvPool(env_name, kwargs, num_envs, backend=backend) as pool:
    slots = list(range(num_envs))
    results = pool.reset(slots, [("train", i % _num_train(env_name, kwargs)) for i in slots])
    done_steps, task = 0, num_envs
    start = time.perf_counter()
    while done_steps < steps:
      results = pool.step(slots, [rng.choice(r.info.admissible_actions) for r in results])
      ended = [s for s in slots if results[s].done]
      if ended:
        fresh = pool.reset(ended, [("train", (task + k) % _num_train(env_name, kwargs))
                                   for k in range(len(ended))])
        task += len(ended)
        for s, r in zip(ended, fresh):
          results[s] = r
      done_steps += num_envs
    assert pool.num_restarts == 0
    return done_steps / (time.perf_counter() - start)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--workers", default="1,2,4")
  parser.add_argument("--entries", default=",".join(ENTRIES))
  args = parser.parse_args(argv)
  print(f"{'entry':18s} {'workers':>7s} {'sequential/s':>12s} {'pool/s':>9s} {'ratio':>6s}")
  for name in args.entries.split(","):
    env_name, kwargs, backend = ENTRIES[name]
    for n in (int(w) for w in args.workers.split(",")):
      steps = min(args.steps, STEPS.get(name, args.steps))
      seq = _sequential(env_name, kwargs, n, steps)
      pooled = _pooled(env_name, kwargs, n, steps, backend)
      print(f"{name:18s} {n:7d} {seq:12.0f} {pooled:9.0f} {pooled / seq:6.2f}", flush=True)


if __name__ == "__main__":
  main()
