"""ALFWorld env speed (ALFWorld, Shridhar et al. 2021): steps/s with and without oracle labels.

    PYTHONPATH=. python benchmarks/alfworld_speed.py --games 6 --steps 30 [--cache-dir DIR]

Random admissible actions (seeded) on generated train games (one game of each task type with
--games 6). Prints, all measured in the same run:
- labels alone: distances per second on the same random-walk states, from the fast exact
  distance (`environments/alfworld_distance.py`) and from a planner search (Fast Downward, what
  the planner label costs per state it has not seen), and their ratio;
- env steps/s: oracle="fast" labels, oracle="planner" labels (a planner search per step that
  leaves the plan), no labels, expert steps (plan reused), and the raw engine without the
  grammar-parse cache, each relative to the cached engine without labels.
"""

import argparse
import random
import subprocess
import sys
import time

from environments import alfworld_distance, alfworld_gen, make_env


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


def label_rates(env, games, steps):
  """(fast distances/s, planner distances/s, states, mismatches) on the same walk states."""
  engine = env._engine
  t_fast = t_plan = 0.0
  n = bad = 0
  for i in range(games):
    r = env.reset("train", i)
    goal = alfworld_distance.Goal.from_pddl_params(
        r.info.extra["task_type"], env.tasks.traj_data("train", i)["pddl_params"])
    static = alfworld_distance.static_of(engine.facts())
    rng = random.Random(1000 + i)
    for _ in range(steps):
      r = env.step(rng.choice(r.info.admissible_actions))
      if r.done:
        break
      facts = engine.facts()
      t0 = time.perf_counter()
      d_fast = alfworld_distance.distance(static, goal, facts)
      t1 = time.perf_counter()
      plan = engine.replan()
      t2 = time.perf_counter()
      t_fast, t_plan, n = t_fast + t1 - t0, t_plan + t2 - t1, n + 1
      bad += plan is None or d_fast != len(plan)
  return n / t_fast, n / t_plan, n, bad


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
  fast, plan, n, bad = label_rates(make_env("alfworld", oracle_labels=False, **kw), a.games,
                                   a.steps)
  print(f"labels alone on {n} random-walk states ({bad} disagree):")
  print(f"  fast exact distance:   {fast:9.1f} labels/s  {fast / plan:.0f}x the planner")
  print(f"  planner (Fast Downward): {plan:7.2f} labels/s  1x")
  base = run(make_env("alfworld", oracle_labels=False, **kw), a.games, a.steps)
  print(f"random, oracle_labels=False (cached grammar): {base:7.1f} steps/s  1.00x")
  labf = run(make_env("alfworld", oracle="fast", **kw), a.games, a.steps)
  print(f"random, oracle='fast' labels:                 {labf:7.1f} steps/s  {labf / base:.2f}x")
  lab = run(make_env("alfworld", oracle="planner", **kw), a.games, a.steps)
  print(f"random, oracle='planner' labels:              {lab:7.1f} steps/s  {lab / base:.2f}x")
  print(f"  labelled env steps/s, fast over planner:    {labf / lab:.1f}x")
  ex = run(make_env("alfworld", oracle="planner", **kw), a.games, a.steps, expert=True)
  print(f"expert, oracle='planner' labels:              {ex:7.1f} steps/s  {ex / base:.2f}x")
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
