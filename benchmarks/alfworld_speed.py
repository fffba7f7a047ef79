"""ALFWorld env speed (ALFWorld, Shridhar et al. 2021): steps/s with and without oracle labels.

    PYTHONPATH=. python benchmarks/alfworld_speed.py --games 6 --steps 30 [--cache-dir DIR]

Random admissible actions (seeded) on generated train games; prints steps/s for
oracle_labels=True (a planner search per step that leaves the plan), oracle_labels=False (no
planner), expert steps (plan reused, no search), and the raw engine without the grammar-parse
cache, each relative to the cached engine without labels measured in the same run.
"""

import argparse
import random
import subprocess
import sys
import time

from environments import alfworld_gen, make_env


def run(env, games, steps, expert=False):
  n, t = 0, 0.0
  for i in range(games):
    r = env.reset("train", i)
    rng = random.Random(i)
    t0 = time.perf_counter()
    for _ in range(steps):
      a = env.expert_action() if expert else rng.choice(r.info.admissible_actions)
      r = env.step(a)
      n += 1
      if r.done:
        break
    t += time.perf_counter() - t0
  return n / t


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--games", type=int, default=6)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--cache-dir", default=None)
  a = p.parse_args()
  kw = dict(num_train=max(a.games, 1), cache_dir=a.cache_dir)
  tasks, engine = make_env("alfworld", oracle_labels=False, **kw).tasks, alfworld_gen.Engine()
  for i in range(a.games):  # generate first, so timing excludes generation
    tasks.game_file("train", i, engine)
  base = run(make_env("alfworld", oracle_labels=False, **kw), a.games, a.steps)
  print(f"random, oracle_labels=False (cached grammar): {base:7.1f} steps/s  1.00x")
  lab = run(make_env("alfworld", oracle_labels=True, **kw), a.games, a.steps)
  print(f"random, oracle_labels=True:                   {lab:7.1f} steps/s  {lab / base:.2f}x")
  ex = run(make_env("alfworld", oracle_labels=True, **kw), a.games, a.steps, expert=True)
  print(f"expert, oracle_labels=True:                   {ex:7.1f} steps/s  {ex / base:.2f}x")
  ref = r"""
import random, sys, time, textworld
from textworld.envs import PddlEnv
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
n, t = 0, 0.0
for i, game in enumerate(sys.argv[1:]):
  env = AlfredInfos(AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))))
  env.load(game); st = env.reset(); rng = random.Random(i); t0 = time.perf_counter()
  for _ in range(STEPS):
    st, _, done = env.step(rng.choice(st["admissible_commands"])); n += 1
    if done: break
  t += time.perf_counter() - t0
print(n / t)
""".replace("STEPS", str(a.steps))
  env = make_env("alfworld", oracle_labels=False, **kw)
  games = [env.tasks.game_file("train", i, None) for i in range(a.games)]
  raw = float(subprocess.run([sys.executable, "-c", ref, *games], capture_output=True, text=True,
                             check=True).stdout.split()[-1])
  print(f"random, raw engine (no grammar cache):        {raw:7.1f} steps/s  {raw / base:.2f}x")


if __name__ == "__main__":
  main()
