"""ALFWorld (Shridhar et al., ICLR 2021) as a `TextEnv`, with exact oracle step labels.

    env = make_env("alfworld", source="generated", num_train=16, num_eval=8, seed=0)
    r = env.reset("train", 0); r = env.step(r.info.admissible_actions[0]); env.expert_action()

Games come from `environments.alfworld_gen`: generated offline from the `alfworld` wheel
(default) or the official `alfworld-download` data. Observations, admissible commands, `won`
and reward are exactly what TextWorld's PDDL engine under ALFWorld's `AlfredDemangler` and
`AlfredInfos` wrappers prints; the expert is `AlfredExpert(expert_type="planner")`'s plan
(Fast Downward, from the current state).

Oracle step label (for the CSA proposal's step-level credit accuracy). Let d(s) be the number
of steps of a shortest plan from state s to the goal (0 once won). The label of a step s -> s'
is d(s) - d(s'): +1 for a step along a shortest plan; 0 for a step after which the goal is as
far as before (an invalid action, "look", "examine", going somewhere useless: a wasted step);
negative for a step that moves the goal further away (e.g. picking up the wrong object, which
must be put down again). Two ways to get d (`oracle=`):
- "fast" (default for generated games): an exact uniform-cost search over the task's abstract
  state (`environments.alfworld_distance`), about 9 ms per state on 2 shared cores.
  Generated games use unit action costs, so d is the exact number of steps.
- "planner": the length of Fast Downward's plan from s (breadth-first under unit costs, so the
  same d; `tests/test_alfworld_distance.py` checks that both agree on every sampled step of all
  six task types). Official games always use it: they keep ALFWorld's domain (cost 5 for
  heat/cool/clean/use), where d is the length of the plan the official planner expert returns,
  which need not be shortest, so no exact shortcut applies. The label is None where the planner
  finds no plan. States that differ only in `checked` facts (set by look/examine, read by
  nothing) share d; after a step that follows the plan, d(s') is the rest of that plan.

Anchor (GiGPO's state): the engine's own state, the PDDL facts without `checked` (the state
key the planner memo uses), as "pddl:" and a SHA-1 of the sorted facts, so that it is the
same in every process. Two steps share an anchor exactly when the agent's location, what it
holds and every object's place and condition are the same. Not the observation: "Nothing
happens." answers every invalid action in every room and "inventory" answers alike in every
room, so observation text would merge distinct states into one GiGPO step group (`rollout.anchor="faithful"` keeps that, as verl-agent does).

Speed (benchmarks/alfworld_speed.py, 2 shared CPU cores): about 34 random steps/s without
labels; with planner labels about 2 (each step that leaves the plan is a blind planner search,
0.1-25 s in large kitchens); the fast labels cost about 9 ms per new state (113 labels/s
against the planner's 0.27 on the same states, 413x), so labelled steps run near the
unlabelled rate (the benchmark prints both rates). `expert_action()` always asks the
planner (plan reused along the plan). Use `oracle_labels=False` where labels are not read. One
env per process (Fast Downward's translator swaps sys.stdout and sys.argv, so threads must not
share it).

CLI: `python -m environments.alfworld_env --generate 100 --split train` pre-fills the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time

from environments import alfworld_distance as dist
from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import register_env

_UNKNOWN = object()  # plan not computed for this state

# alfworld_gen.SPLITS, repeated so that importing this module (every process imports the
# registry) does not import alfworld_gen (tests/test_alfworld.py checks they agree).
SPLITS = ("train", "eval_seen", "eval_unseen")


def _gen():
  """environments.alfworld_gen, imported on first use: it imports textworld's game
  generator, about 0.5-1 s of CPU, which a process that plays no ALFWorld game never needs."""
  from environments import alfworld_gen  # pylint: disable=import-outside-toplevel
  return alfworld_gen


def state_anchor(key: frozenset[str]) -> str:
  """A stable text id of an engine state key (the same in every process and run)."""
  return "pddl:" + hashlib.sha1("\n".join(sorted(key)).encode()).hexdigest()


class AlfworldEnv(TextEnv):
  """ALFWorld's six task types through the official engine and wrappers."""

  splits = SPLITS

  def __init__(self, source: str = "generated", num_train: int | None = None,
               num_eval: int | None = None, seed: int = 0, step_limit: int = 50,
               cache_dir: str | None = None, data_dir: str | None = None,
               oracle_labels: bool = True, oracle: str = "fast"):
    """Args:
      source: "generated" (offline, default) or "official" ($ALFWORLD_DATA or data_dir).
      num_train / num_eval: tasks in "train" / each eval split. Generated: default 1000 / 140
        (generated lazily, so only the games played are ever built); official: default all.
      seed: generated games are a pure function of (seed, split, index).
      step_limit: the episode ends (truncated) after this many steps.
      cache_dir: where generated games live (default $CSA_JAX_CACHE/alfworld or
        ~/.cache/csa_jax/alfworld).
      oracle_labels: compute the oracle label at every step (see module docstring).
      oracle: "fast" (exact distance from the symbolic state, `alfworld_distance`) or
        "planner" (Fast Downward's plan length). Official games always use the planner: their
        5-cost actions make the planner's plan length differ from the shortest distance.
    """
    if source not in ("generated", "official"):
      raise ValueError(f"source must be 'generated' or 'official', got {source!r}")
    for name, n in (("num_train", num_train), ("num_eval", num_eval), ("step_limit", step_limit)):
      if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    gen = _gen()
    if source == "generated":
      counts = {"train": num_train or 1000, "eval_seen": num_eval or 140, "eval_unseen": num_eval or 140}
      self.tasks = gen.GeneratedTasks(seed, counts, cache_dir)
    else:
      counts = {"train": num_train, "eval_seen": num_eval, "eval_unseen": num_eval}
      self.tasks = gen.OfficialTasks(data_dir, counts)
    if oracle not in ("fast", "planner"):
      raise ValueError(f"oracle must be 'fast' or 'planner', got {oracle!r}")
    self.source = source
    self.oracle = "planner" if source == "official" else oracle
    self._static: dict = {}  # game file -> alfworld_distance.Static
    self._goal = None
    self._dists: dict = {}  # state key -> exact distance, for the loaded game
    self._d = _UNKNOWN
    self.step_limit = step_limit
    self.oracle_labels = oracle_labels
    self._engine = gen.Engine()
    self._plans: dict = {}  # state key -> planner plan (or None), for the loaded game
    self._plan = _UNKNOWN
    self._key = None
    self._steps = 0
    self._done = True
    self._task = ""
    self._task_type = ""
    self._obs = ""
    self._split, self._index = "", -1

  def num_tasks(self, split: str) -> int:
    return self.tasks.num_tasks(split)

  # -- planner ---------------------------------------------------------------------------------

  def _plan_here(self):
    """The planner's plan from the current state (None if it finds none), memoised."""
    if self._plan is _UNKNOWN:
      if self._engine.won:
        self._plan = []
      elif self._key in self._plans:
        self._plan = self._plans[self._key]
      else:
        self._plan = self._engine.replan()
      self._plans[self._key] = self._plan
    return self._plan

  def _distance_here(self):
    """Distance to the goal from the current state (None where the planner finds no plan)."""
    if self._engine.won:
      return 0
    if self.oracle == "planner":
      plan = self._plan_here()
      return None if plan is None else len(plan)
    if self._key not in self._dists:
      static = self._static.get(self._engine.game_file)
      if static is None:
        static = self._static[self._engine.game_file] = dist.static_of(self._engine.facts())
      self._dists[self._key] = dist.distance(static, self._goal, self._engine.facts())
    return self._dists[self._key]

  def expert_action(self) -> str | None:
    if self._done:
      return None
    plan = self._plan_here()
    return plan[0] if plan else None

  # -- episode ---------------------------------------------------------------------------------

  def reset(self, split: str, index: int) -> StepResult:
    n = self.tasks.num_tasks(split)
    if not isinstance(index, int) or not 0 <= index < n:
      raise ValueError(f"index must be an int in [0, {n}) for split {split!r}, got {index!r}")
    game_file = self.tasks.game_file(split, index, self._engine)
    if self._engine.game_file != game_file:
      self._engine.load(game_file)
      self._plans, self._dists = {}, {}
    state = self._engine.reset()
    traj = self.tasks.traj_data(split, index)
    self._task_type = traj["task_type"]
    if self.oracle == "fast":
      self._goal = dist.Goal.from_pddl_params(self._task_type, traj["pddl_params"])
    self._task = state.feedback.rsplit("Your task is to: ", 1)[-1].strip().rstrip(".")
    self._split, self._index = split, index
    self._steps = 0
    self._done = False
    self._key = self._engine.state_key()
    self._plan = _UNKNOWN
    self._d = self._distance_here() if self.oracle_labels else _UNKNOWN
    return self._result(state.feedback, action_valid=True, label=None)

  def step(self, action: str) -> StepResult:
    if self._done:
      return self._result(self._obs, action_valid=False, label=None, done=True,
                          error="step() after the episode ended; call reset()")
    action = action if isinstance(action, str) else str(action)
    # PddlEnv matches the stripped text exactly against the admissible commands; anything else
    # is "Nothing happens." with the state unchanged.
    valid = action.strip() in self._engine.admissible
    before, before_d = self._plan, self._d
    state = self._engine.step(action)
    self._steps += 1
    key = self._engine.state_key()
    if key == self._key:
      pass  # same distance, same plan
    elif self._engine.won:
      self._plan = []
    elif before not in (_UNKNOWN, None) and len(before) > 1 and action.strip() == before[0]:
      self._plan = before[1:]  # the rest of a plan is a plan from here
    else:
      self._plan = _UNKNOWN
    moved = key != self._key
    self._key = key
    if self._plan is not _UNKNOWN:
      self._plans[key] = self._plan
    if moved:
      self._d = self._distance_here() if self.oracle_labels else _UNKNOWN
    label = None
    if before_d not in (_UNKNOWN, None) and self._d not in (_UNKNOWN, None):
      label = float(before_d - self._d)
    won = self._engine.won
    truncated = not won and self._steps >= self.step_limit
    self._done = won or truncated
    return self._result(state.feedback, action_valid=valid, label=label, truncated=truncated)

  def _result(self, obs: str, action_valid: bool, label, truncated: bool = False,
              done: bool = False, error: str | None = None) -> StepResult:
    self._obs = obs
    won = self._engine.won
    d = self._d
    if d is _UNKNOWN and self._plan is not _UNKNOWN:
      d = None if self._plan is None else len(self._plan)
    info = StepInfo(
        task=self._task,
        admissible_actions=tuple(sorted(self._engine.admissible)),
        anchor=state_anchor(self._key),
        won=won,
        action_valid=action_valid,
        oracle_label=label,
        truncated=truncated,
        error=error,
        extra={"task_type": self._task_type, "source": self.source,
               "plan_len": None if d is _UNKNOWN else d,
               "split": self._split, "index": self._index,
               "game_file": self._engine.game_file, "steps": self._steps},
    )
    return StepResult(observation=obs, reward=1.0 if won else 0.0, done=done or won or truncated,
                      info=info)


if __name__ != "__main__":  # under `python -m`, the package import has registered it already
  register_env("alfworld", engines=("alfworld", "textworld", "fast-downward-textworld"))(AlfworldEnv)


# -- CLI: pre-fill the cache ---------------------------------------------------------------------


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--generate", type=int, required=True, help="games to generate (indices 0..N-1)")
  p.add_argument("--split", default="train", choices=SPLITS)
  p.add_argument("--start", type=int, default=0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--cache-dir", default=None)
  args = p.parse_args(argv)
  gen = _gen()
  tasks = gen.GeneratedTasks(args.seed, {s: args.start + args.generate for s in SPLITS},
                             args.cache_dir)
  engine = gen.Engine()
  times = []
  print(f"generating {args.generate} {args.split} games (seed {args.seed}) into {tasks.root}",
        flush=True)
  for i in range(args.start, args.start + args.generate):
    cached = tasks.is_cached(args.split, i)
    t0 = time.perf_counter()
    tasks.game_file(args.split, i, engine)
    dt = time.perf_counter() - t0
    meta = tasks.traj_data(args.split, i)
    if not cached:
      times.append(dt)
    print(f"[{i + 1 - args.start}/{args.generate}] {args.split}/{i:06d} {meta['task_type']:<31} "
          f"{meta['scene']['floor_plan']:<13} plan {meta['csa_jax']['plan_len']:>2} "
          f"attempt {meta['csa_jax']['attempt']} "
          + ("cached" if cached else f"{dt:.1f}s"), flush=True)
  if times:
    print(f"generated {len(times)} games: {statistics.mean(times):.2f} s/game mean, "
          f"{statistics.median(times):.2f} median, {max(times):.2f} max (generate + plan + play "
          "the plan)")


if __name__ == "__main__":
  main(sys.argv[1:])
