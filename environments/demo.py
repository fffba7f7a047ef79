"""Prints a few expert and random episodes of an environment, as the agent sees them.

  python -m environments.demo ENV [--key value ...] [--expert 2] [--random 1]
      [--split train] [--seed 0] [--max_steps 30]
  e.g. python -m environments.demo twx --game cookingworld --step_limit 40

Unknown `--key value` options are passed to `make_env(ENV, key=value)` (ints and floats
are converted; `--game_params "numLocations=3,..."` stays text). A bad environment name,
option or value is one line on stderr and exit code 2. An episode cut by --max_steps
says so; a task text repeated from the previous episode is printed once.
"""

from __future__ import annotations

import argparse
import inspect
import random
import sys
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


PROG = "python -m environments.demo"
OWN_FLAGS = ("--expert", "--random", "--split", "--seed", "--max_steps")


class DemoError(Exception):
  """A bad argument: one line, exit code 2."""


def fail(msg: str) -> None:
  print(f"{PROG}: error: {msg}", file=sys.stderr)
  sys.exit(2)


def _parse_kwargs(rest: list[str]) -> dict:
  if len(rest) % 2 or any(not k.startswith("--") for k in rest[::2]):
    raise DemoError(f"environment options must be --key value pairs, got {' '.join(rest)}")
  return {k[2:]: _value(v) for k, v in zip(rest[::2], rest[1::2])}


def _one_line(err: BaseException) -> str:
  text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
          ).strip().splitlines()
  return text[0] if text else type(err).__name__


def _make_env(name: str, kwargs: dict):
  if name not in list_envs():
    raise DemoError(f"unknown environment {name!r}; known: {', '.join(list_envs())}")
  from environments.registry import _REGISTRY  # pylint: disable=import-outside-toplevel
  try:
    params = inspect.signature(_REGISTRY[name]).parameters
  except (TypeError, ValueError):
    params = {}
  if params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
    unknown = [k for k in kwargs if k not in params]
    if unknown:
      raise DemoError(f"--{unknown[0]} is neither a demo option ({', '.join(OWN_FLAGS)}) nor "
                      f"an argument of {name} ({', '.join('--' + p for p in params)})")
  try:
    return make_env(name, **kwargs)
  except Exception as err:  # pylint: disable=broad-except  (any engine's own error)
    raise DemoError(f"environment {name} {kwargs}: {type(err).__name__}: "
                    f"{_one_line(err)}") from None


def play(env, split: str, index: int, policy: str, rng: random.Random, max_steps: int,
         shown: dict | None = None) -> None:
  """One episode; `shown` remembers the last task text printed, so a long task (the
  tau-bench policy) repeated by the next episode is not printed again."""
  try:
    r = env.reset(split, index)
  except Exception as err:  # pylint: disable=broad-except
    raise DemoError(f"reset({split!r}, {index}): {type(err).__name__}: {_one_line(err)}") from None
  shown = {} if shown is None else shown
  task = r.info.task
  if task and task == shown.get("task") and task.count("\n") > 2:
    task = "(the same as the previous episode's)"
  shown["task"] = r.info.task
  print(f"=== {policy} episode, {split} task {index}\nTASK: {task}")
  obs = r.observation.strip()
  if r.info.task and r.info.task.strip() and r.info.task.strip() in obs and obs != r.info.task.strip():
    obs = obs.replace(r.info.task.strip(), "(the task above)")
  if obs != r.info.task.strip():
    print(textwrap.indent(obs, "  "))
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
  print(f"--- won={r.info.won} done={r.done} truncated={r.info.truncated} steps={steps}")
  if not r.done and steps == max_steps:
    print(f"--- stopped at --max_steps {max_steps} before the episode ended (pass a larger "
          "--max_steps to see the rest)")
  print()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("env", help=f"one of: {', '.join(list_envs())}")
  parser.add_argument("--expert", type=int, default=2, help="expert episodes")
  parser.add_argument("--random", type=int, default=1, help="random-action episodes")
  parser.add_argument("--split", default="train")
  parser.add_argument("--seed", type=int, default=0, help="first task index / rng seed")
  parser.add_argument("--max_steps", type=int, default=30)
  # argparse's own refusals (a flag without its value, a value of the wrong type) are two
  # lines (usage and error): one line here, as for everything else.
  parser.error = lambda message: fail(message)  # type: ignore[method-assign]
  args, rest = parser.parse_known_args(argv)
  for name in ("expert", "random", "max_steps", "seed"):
    if getattr(args, name) < 0:
      fail(f"--{name} must be >= 0, got {getattr(args, name)}")
  try:
    env = _make_env(args.env, _parse_kwargs(rest))
  except DemoError as e:
    fail(str(e))
  rng = random.Random(args.seed)
  shown: dict = {}
  try:
    for k in range(args.expert):
      play(env, args.split, args.seed + k, "expert", rng, args.max_steps, shown)
    for k in range(args.random):
      play(env, args.split, args.seed + k, "random", rng, args.max_steps, shown)
  except DemoError as e:
    fail(str(e))
  finally:
    env.close()


if __name__ == "__main__":
  main()
