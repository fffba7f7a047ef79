"""Prints a few expert and random episodes of an environment, as the agent sees them.

  python -m environments.demo ENV [--key value ...] [--expert 2] [--random 1]
      [--split train] [--seed 0] [--max_steps 30]
  e.g. python -m environments.demo twx --game cookingworld --step_limit 40

Unknown `--key value` options are passed to `make_env(ENV, key=value)` (ints and floats
are converted; `--game_params "numLocations=3,..."` stays text).
"""

from __future__ import annotations

import argparse
import random
import textwrap

import environments  # noqa: F401  (registers the installed environments)
from environments import list_envs, make_env


def _value(text: str):
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


def _parse_kwargs(rest: list[str]) -> dict:
  if len(rest) % 2 or any(not k.startswith("--") for k in rest[::2]):
    raise SystemExit(f"env options must be --key value pairs, got {rest}")
  return {k[2:]: _value(v) for k, v in zip(rest[::2], rest[1::2])}


def play(env, split: str, index: int, policy: str, rng: random.Random, max_steps: int) -> None:
  r = env.reset(split, index)
  print(f"=== {policy} episode, {split} task {index}\nTASK: {r.info.task}")
  print(textwrap.indent(r.observation.strip(), "  "))
  steps = 0
  for _ in range(max_steps):
    if r.done:
      break
    if policy != "expert" and not r.info.admissible_actions:
      print("  (the environment lists no admissible actions to draw from)")
      break
    action = env.expert_action() if policy == "expert" else rng.choice(r.info.admissible_actions)
    if action is None:
      print("  (the expert has no action from here)")
      break
    print(f"  [{len(r.info.admissible_actions)} admissible] > {action}")
    r = env.step(action)
    steps += 1
    print(textwrap.indent(r.observation.strip(), "    "))
    print(f"    reward={r.reward:+.3f} valid={r.info.action_valid} "
          f"oracle_label={r.info.oracle_label}")
  print(f"--- won={r.info.won} done={r.done} truncated={r.info.truncated} steps={steps}\n")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("env", help=f"one of: {', '.join(list_envs())}")
  parser.add_argument("--expert", type=int, default=2, help="expert episodes")
  parser.add_argument("--random", type=int, default=1, help="random-action episodes")
  parser.add_argument("--split", default="train")
  parser.add_argument("--seed", type=int, default=0, help="first task index / rng seed")
  parser.add_argument("--max_steps", type=int, default=30)
  args, rest = parser.parse_known_args(argv)
  env = make_env(args.env, **_parse_kwargs(rest))
  rng = random.Random(args.seed)
  try:
    for k in range(args.expert):
      play(env, args.split, args.seed + k, "expert", rng, args.max_steps)
    for k in range(args.random):
      play(env, args.split, args.seed + k, "random", rng, args.max_steps)
  finally:
    env.close()


if __name__ == "__main__":
  main()
