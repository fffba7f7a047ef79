"""ALFWorld tasks (Shridhar et al., ICLR 2021): the engine, generated task sets, official data.

ALFWorld plays ALFRED household tasks as text through TextWorld's PDDL engine (Fast Downward)
with the official wrappers `AlfredDemangler` and `AlfredInfos`; its planner expert
(`AlfredExpert(expert_type="planner")`) is Fast Downward's plan from the current state.

Two task sources:
- "official": what `alfworld-download` fetched under $ALFWORLD_DATA/json_2.1.1/{train,
  valid_seen,valid_unseen} (games kept as `AlfredTWEnv.collect_game_files` keeps them).
- "generated" (offline, the default): games in the ALFWorld format (`game.tw-pddl` +
  `traj_data.json`) written from what the `alfworld` wheel ships: the PDDL domain, the text
  grammar, the goal templates (`gen/goal_library.py`), the object rules (`gen/constants.py`)
  and the 120 FloorPlan receptacle layouts (`gen/layouts/`). Each game is a pure function of
  (seed, split, index), with the shipped domain at unit action costs (`unit_cost_domain`) and
  at most MAX_RECEPTACLES receptacles per room; it is kept only once the planner has found a plan from its start and
  that plan, played through the engine, wins. Games are generated lazily and cached on disk.
  Floor plans follow ALFRED's scene split: "train" and "eval_seen" use
  `constants.TRAIN_SCENE_NUMBERS`, "eval_unseen" only `constants.TEST_SCENE_NUMBERS`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from typing import Any

# Importing alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld) on import; nothing is fetched.
import alfworld.gen.constants as C
import numpy as np
import alfworld.gen.goal_library as goal_library
import textworld
import textworld.envs.pddl.textgen as _textgen
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH
from textworld.envs import PddlEnv

# Bump when the generator's output changes: it names the cache directory.
GENERATOR_VERSION = "v1"

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "eval_seen", "eval_unseen")
OFFICIAL_SPLIT_DIRS = {"train": "train", "eval_seen": "valid_seen", "eval_unseen": "valid_unseen"}

LAYOUT_DIR = os.path.join(os.path.dirname(C.__file__), "layouts")
# The appliance each state-change task needs, and which object types it accepts.
_APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", C.VAL_ACTION_OBJECTS["Cleanable"]),
    "pick_heat_then_place_in_recep": ("Microwave", C.VAL_ACTION_OBJECTS["Heatable"]),
    "pick_cool_then_place_in_recep": ("Fridge", C.VAL_ACTION_OBJECTS["Coolable"]),
}
# ALFRED's sampler never asks to put two objects on these.
_NO_TWO_OBJ_PARENT = {"CoffeeMachine", "ToiletPaperHanger", "HandTowelHolder"}
_LAMPS = ("DeskLamp", "FloorLamp")
# Receptacles a lamp may stand in (lamps are not in the containment rules: they never move).
_LAMP_HOSTS = {"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand"}
_STATIC_RECEPTACLES = set(C.VAL_RECEPTACLE_OBJECTS) - set(C.MOVABLE_RECEPTACLES)
_PLACEABLE = set().union(*C.VAL_RECEPTACLE_OBJECTS.values())
MAX_ATTEMPTS = 20
MAX_PLAN_LEN = 40
MAX_RECEPTACLES = 16


def default_cache_dir() -> str:
  root = os.environ.get("CSA_JAX_CACHE") or os.path.expanduser("~/.cache/csa_jax")
  return os.path.join(root, "alfworld")


# ---------------------------------------------------------------------------------------------
# The engine: TextWorld's PddlEnv under the official ALFWorld wrappers.
# ---------------------------------------------------------------------------------------------

_TEXTGEN_CACHE: dict[Any, Any] = {}


def install_textgen_cache() -> None:
  """Memoises TextWorld's grammar parsing, which dominates an ALFWorld step (about 3x).

  TextWorld re-parses the same grammar strings (command templates, fact queries) with tatsu
  for every admissible command at every step. Parsing is pure, so we keep each parse and hand
  out deep copies (derivation mutates the symbols): the text produced is unchanged, which
  tests/test_alfworld.py checks against an engine in a process without this cache.
  """
  if getattr(_textgen, "_csa_jax_cached", False):
    return
  parse = _textgen._parse_and_convert

  def cached_parse(text, rule_name=None, trace=False):
    key = ("sym", text, rule_name)
    if key not in _TEXTGEN_CACHE:
      _TEXTGEN_CACHE[key] = parse(text, rule_name=rule_name, trace=trace)
    return copy.deepcopy(_TEXTGEN_CACHE[key])

  rule_cls = _textgen.Rule

  class CachedRule(rule_cls):  # only textgen's name is rebound; textworld.logic is untouched
    @classmethod
    def parse_conjunctive_query(cls, expression):
      key = ("query", expression)
      if key not in _TEXTGEN_CACHE:
        _TEXTGEN_CACHE[key] = rule_cls.parse_conjunctive_query(expression)
      return _TEXTGEN_CACHE[key]

  _textgen._parse_and_convert = cached_parse
  _textgen.Rule = CachedRule
  _textgen._csa_jax_cached = True


@contextlib.contextmanager
def _keep_argv():
  # fast_downward.pddl2sas overwrites sys.argv (a hack for its options module).
  argv = list(sys.argv)
  try:
    yield
  finally:
    sys.argv[:] = argv


class Engine:
  """One ALFWorld game at a time: PddlEnv + AlfredDemangler + AlfredInfos (as AlfredTWEnv).

  `replan()` is what `AlfredExpert(expert_type="planner")` reads (`policy_commands`), computed
  only when asked rather than at every step.
  """

  def __init__(self, fast_textgen: bool = True):
    if fast_textgen:
      install_textgen_cache()
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    with _keep_argv():
      self.pddl = PddlEnv(infos)
    self.env = AlfredInfos(AlfredDemangler(self.pddl, shuffle=False))
    self.game_file: str | None = None
    self.state = None

  def load(self, game_file: str) -> None:
    with _keep_argv():
      self.env.load(game_file)
    self.game_file = game_file

  def reset(self):
    with _keep_argv():
      self.state = self.env.reset()
    return self.state

  def step(self, command: str):
    self.state, _, _ = self.env.step(command)
    return self.state

  @property
  def admissible(self) -> tuple[str, ...]:
    return tuple(self.state["admissible_commands"])

  @property
  def won(self) -> bool:
    return bool(self.state["won"])

  def replan(self) -> list[str] | None:
    """The planner's plan from the current state; [] when won, None when it finds none."""
    plan = self.pddl._pddl_state.replan(self.pddl._entity_infos)
    if not plan and not self.won:
      return None
    return list(plan)

  def facts(self) -> list:
    """The current PDDL state as textworld Propositions."""
    return list(self.pddl._pddl_state.facts)

  def state_key(self) -> frozenset[str]:
    # `checked` is set by look/examine/open and read by no precondition or goal, so states that
    # differ only in it have the same distance to the goal.
    return frozenset(str(f) for f in self.pddl._pddl_state.facts if f.name != "checked")


# ---------------------------------------------------------------------------------------------
# Generated tasks.
# ---------------------------------------------------------------------------------------------


def _rtype(receptacle_id: str) -> str:
  parts = receptacle_id.split("|")
  return parts[-1] if len(parts) > 4 else parts[0]  # "Sink|x|y|z|SinkBasin" -> SinkBasin


def _mangle(name: str) -> str:
  # The mangling ALFWorld's PDDL files use (undone by Demangler).
  for a, b in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_"), (",", "_comma_")):
    name = name.replace(a, b)
  return name


def all_floorplans() -> list[int]:
  names = os.listdir(LAYOUT_DIR)
  nums = {int(m.group(1)) for n in names if (m := re.match(r"FloorPlan(\d+)-openable\.json$", n))}
  return sorted(n for n in nums if f"FloorPlan{n}-objects.json" in names)


def split_floorplans(split: str) -> list[int]:
  """ALFRED's scene split: unseen floor plans are never used by train or eval_seen."""
  check_split(split)
  scenes = C.TEST_SCENE_NUMBERS if split == "eval_unseen" else C.TRAIN_SCENE_NUMBERS
  available = set(all_floorplans())
  return [s for s in scenes if s in available]


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"unknown ALFWorld split {split!r}; valid: {', '.join(SPLITS)}")


def _rng(*parts) -> random.Random:
  digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
  return random.Random(int.from_bytes(digest[:8], "little"))


@dataclasses.dataclass(frozen=True)
class _Scene:
  floorplan: int
  receptacles: dict[str, tuple[float, float, int, int]]  # id -> interaction pose
  types: frozenset[str]  # object types of the floor plan
  start_points: tuple[tuple[float, float], ...]


@functools.lru_cache(maxsize=None)
def _load_scene(floorplan: int) -> _Scene:
  base = os.path.join(LAYOUT_DIR, f"FloorPlan{floorplan}")
  with open(base + "-openable.json") as f:
    recs = {k: tuple(v) for k, v in json.load(f).items() if _rtype(k) in _STATIC_RECEPTACLES}
  with open(base + "-objects.json") as f:
    types = frozenset(json.load(f))
  points = tuple(map(tuple, np.load(base + "-layout.npy").tolist()))
  return _Scene(floorplan, dict(sorted(recs.items())), types, points)


def _location(pose) -> str:
  x, z, rotation, horizon = pose
  return f"loc|{int(round(x / 0.25))}|{int(round(z / 0.25))}|{int(rotation) // 90}|{int(horizon)}"


def _goal_candidates(scene: _Scene, task_type: str) -> list[tuple[str, str, str]]:
  """(object type, parent receptacle type, toggle type) choices ALFRED's sampler would allow."""
  rtypes = sorted({_rtype(r) for r in scene.receptacles})
  pickup = sorted(t for t in scene.types if t in _PLACEABLE and t not in _STATIC_RECEPTACLES)
  holders = {t: {rt for rt in rtypes if t in C.VAL_RECEPTACLE_OBJECTS[rt]} for t in pickup}
  out = []
  if task_type == "look_at_obj_in_light":
    lamps = [l for l in _LAMPS if l in scene.types]
    if not lamps or not any(rt in _LAMP_HOSTS for rt in rtypes):
      return []
    return [(t, "", l) for t in pickup if holders[t] for l in lamps]
  appliance, accepted = _APPLIANCE.get(task_type, (None, None))
  if appliance and appliance not in rtypes:
    return []
  for t in pickup:
    if accepted is not None and t not in accepted:
      continue
    for rt in sorted(holders[t]):
      if rt == appliance or (task_type == "pick_two_obj_and_place" and rt in _NO_TWO_OBJ_PARENT):
        continue
      if holders[t] - {rt}:  # somewhere else to start from, so the goal is not already met
        out.append((t, rt, ""))
  return out


def _keep_receptacles(scene, obj_t, parent_t, toggle_t, task_type, rng) -> list[str]:
  """At most MAX_RECEPTACLES receptacles of the floor plan, always those the goal needs.

  The planner is a blind search, exponential in the number of places: a 47-receptacle kitchen
  takes it minutes per plan, a 16-receptacle room seconds.
  """
  recs = list(scene.receptacles)
  of = lambda pred: [r for r in recs if pred(r)]
  keep = set()
  if parent_t:
    keep.add(rng.choice(of(lambda r: _rtype(r) == parent_t)))
  appliance = _APPLIANCE.get(task_type, (None,))[0]
  if appliance:
    keep.add(rng.choice(of(lambda r: _rtype(r) == appliance)))
  if toggle_t:
    keep.add(rng.choice(of(lambda r: _rtype(r) in _LAMP_HOSTS)))
  keep.add(rng.choice(of(lambda r: obj_t in C.VAL_RECEPTACLE_OBJECTS[_rtype(r)]
                         and _rtype(r) != parent_t)))
  others = sorted(set(recs) - keep)
  rng.shuffle(others)
  keep.update(others[:max(0, MAX_RECEPTACLES - len(keep))])
  return sorted(keep)


@functools.lru_cache(maxsize=None)
def unit_cost_domain() -> str:
  """The shipped domain with every action cost 1 (heat/cool/clean/use/slice cost 5 there).

  Only the planner reads costs. Its search (Fast Downward lazy search ordered by g, no
  reopening) is breadth-first under unit costs, so its plans are shortest in steps; with the
  5-cost actions it may return a plan that is neither cheapest nor shortest.
  """
  with open(ALFRED_PDDL_PATH) as f:
    domain = f.read()
  assert domain.count("(increase (total-cost) 5)") == 5, "alfred.pddl changed: check costs"
  return domain.replace("(increase (total-cost) 5)", "(increase (total-cost) 1)")


def _object_id(otype: str, pose, k: int, rng: random.Random) -> str:
  # ALFRED-style id "Type|+x|+y|+z": the receptacle's position plus a small per-object offset.
  x, z = pose[0] + rng.uniform(-0.3, 0.3), pose[1] + rng.uniform(-0.3, 0.3)
  y = 0.5 + 0.1 * k + rng.uniform(0.0, 0.09)
  return f"{otype}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}"


def generate_problem(seed: int, split: str, index: int, attempt: int = 0) -> tuple[dict, dict]:
  """Writes one candidate game (traj_data, game.tw-pddl data); pure in its arguments.

  The floor plan is drawn among the split's floor plans that can host the task type.
  Raises ValueError when this attempt finds no free start point.
  """
  check_split(split)
  task_type = TASK_TYPES[index % len(TASK_TYPES)]
  rng = _rng("alfworld", GENERATOR_VERSION, seed, split, index, attempt)
  hosts = [fp for fp in split_floorplans(split) if _goal_candidates(_load_scene(fp), task_type)]
  scene = _load_scene(rng.choice(hosts))
  cands = _goal_candidates(scene, task_type)
  obj_t, parent_t, toggle_t = rng.choice(cands)

  recs = _keep_receptacles(scene, obj_t, parent_t, toggle_t, task_type, rng)
  locs = {r: _location(scene.receptacles[r]) for r in recs}
  start = None
  for x, z in rng.sample(scene.start_points, len(scene.start_points)):
    cand = f"loc|{int(round(x / 0.25))}|{int(round(z / 0.25))}|{rng.randrange(4)}|30"
    if cand not in locs.values():
      start = cand
      break
  if start is None:
    raise ValueError(f"FloorPlan{scene.floorplan} has no free start point")

  # Objects: 1-2 of each pickupable type of the floor plan (2-3 of the target for "two"), in
  # receptacles that may hold them; targets never start in a receptacle of the parent type.
  pickup = sorted(t for t in scene.types if t in _PLACEABLE and t not in _STATIC_RECEPTACLES)
  objects = []  # (id, type, receptacle id)
  for t in pickup:
    hosts = [r for r in recs if t in C.VAL_RECEPTACLE_OBJECTS[_rtype(r)]]
    if t == obj_t:
      hosts = [r for r in hosts if _rtype(r) != parent_t]
    if not hosts:
      continue
    n = rng.randint(2, 3) if (t == obj_t and task_type == "pick_two_obj_and_place") else rng.randint(1, 2)
    for k in range(n):
      r = rng.choice(hosts)
      objects.append((_object_id(t, scene.receptacles[r], k, rng), t, r))
  if toggle_t:
    hosts = [r for r in recs if _rtype(r) in _LAMP_HOSTS]
    r = rng.choice(hosts)
    objects.append((_object_id(toggle_t, scene.receptacles[r], 0, rng), toggle_t, r))

  otypes = sorted({t for _, t, _ in objects})
  rtypes = sorted({_rtype(r) for r in recs})
  decl = ["agent1 - agent", f"{start} - location"]
  decl += sorted({f"{l} - location" for l in locs.values()})
  decl += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
  decl += [f"{o} - object" for o, _, _ in objects] + [f"{r} - receptacle" for r in recs]
  init = [f"(atLocation agent1 {start})"]
  for r in recs:
    rt = _rtype(r)
    init += [f"(receptacleType {r} {rt}Type)", f"(receptacleAtLocation {r} {locs[r]})"]
    if rt in C.OPENABLE_CLASS_SET:
      init.append(f"(openable {r})")
  for rt in rtypes:
    init += [f"(canContain {rt}Type {t}Type)" for t in otypes if t in C.VAL_RECEPTACLE_OBJECTS[rt]]
  props = {"Heatable": "heatable", "Coolable": "coolable", "Cleanable": "cleanable",
           "Toggleable": "toggleable", "Sliceable": "sliceable"}
  for o, t, r in objects:
    init += [f"(objectType {o} {t}Type)", f"(inReceptacle {o} {r})", f"(objectAtLocation {o} {locs[r]})"]
    if t not in _LAMPS:
      init.append(f"(pickupable {o})")
    if t in C.MOVABLE_RECEPTACLES:
      init.append(f"(isReceptacleObject {o})")
    init += [f"({p} {o})" for k, p in props.items() if t in C.VAL_ACTION_OBJECTS[k]]

  def mangle_fact(fact: str) -> str:
    return "(" + " ".join(_mangle(w) for w in fact.strip("()").split()) + ")"

  goal = goal_library.gdict[task_type]["pddl"].format(
      obj=obj_t, recep=parent_t, toggle=toggle_t, mrecep="").replace("#", "-")
  problem = (
      f"(define (problem gen_{seed}_{split}_{index})\n(:domain alfred)\n(:objects\n"
      + "\n".join(f"{_mangle(d.split(' - ')[0])} - {d.split(' - ')[1]}" for d in decl)
      + "\n)\n(:init\n" + "\n".join(mangle_fact(p) for p in init) + "\n)\n" + goal.strip() + "\n")

  template = rng.choice(goal_library.gdict[task_type]["templates"])
  goal_text = template.format(obj=obj_t.lower(), recep=parent_t.lower(), toggle=toggle_t.lower(), mrecep="")
  with open(ALFRED_TWL2_PATH) as f:
    grammar = f.read().replace("UNKNOWN GOAL", goal_text)
  domain = unit_cost_domain()
  traj = {
      "task_type": task_type,
      "task_id": f"csa_jax_gen-{GENERATOR_VERSION}-{seed}-{split}-{index}",
      "pddl_params": {"object_target": obj_t, "parent_target": parent_t, "toggle_target": toggle_t,
                      "mrecep_target": "", "object_sliced": False},
      "scene": {"floor_plan": f"FloorPlan{scene.floorplan}", "scene_num": scene.floorplan},
      "turk_annotations": {"anns": [{"task_desc": goal_text}]},
      "csa_jax": {"generator": GENERATOR_VERSION, "seed": seed, "split": split, "index": index,
                  "attempt": attempt},
  }
  game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem,
          "solvable": None, "walkthrough": None}
  return traj, game


def verify_game(engine: Engine, game_file: str) -> list[str] | None:
  """The planner's plan from the start if, played through the engine, it wins; else None.

  Also rejects goals already met at the start (an empty plan) and plans over MAX_PLAN_LEN.
  Leaves `engine` with the game loaded.
  """
  engine.load(game_file)
  engine.reset()
  if engine.won:
    return None
  plan = engine.replan()
  if not plan or len(plan) > MAX_PLAN_LEN:
    return None
  for i, cmd in enumerate(plan):
    if cmd not in engine.admissible or engine.won:
      return None
    engine.step(cmd)
  if not engine.won:
    return None
  engine.reset()
  return plan


class GeneratedTasks:
  """Lazily generated, planner-verified games cached under `cache_dir`."""

  source = "generated"

  def __init__(self, seed: int, num_tasks: dict[str, int], cache_dir: str | None = None):
    self.seed = seed
    self._num = dict(num_tasks)
    self.root = os.path.join(cache_dir or default_cache_dir(), "generated", GENERATOR_VERSION,
                             f"seed{seed}")

  def num_tasks(self, split: str) -> int:
    check_split(split)
    return self._num[split]

  def game_dir(self, split: str, index: int) -> str:
    return os.path.join(self.root, split, f"{index:06d}")

  def is_cached(self, split: str, index: int) -> bool:
    return os.path.exists(os.path.join(self.game_dir(split, index), "game.tw-pddl"))

  def game_file(self, split: str, index: int, engine: Engine) -> str:
    """Path of the game, generating and verifying it first if it is not cached."""
    path = os.path.join(self.game_dir(split, index), "game.tw-pddl")
    if not os.path.exists(path):
      self._generate(split, index, engine)
    return path

  def _generate(self, split: str, index: int, engine: Engine) -> None:
    final = self.game_dir(split, index)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    t0 = time.perf_counter()
    for attempt in range(MAX_ATTEMPTS):
      try:
        traj, game = generate_problem(self.seed, split, index, attempt)
      except ValueError:
        continue
      tmp = tempfile.mkdtemp(prefix=f".{index:06d}-", dir=os.path.dirname(final))
      try:
        game_file = os.path.join(tmp, "game.tw-pddl")
        with open(game_file, "w") as f:
          json.dump(game, f)
        plan = verify_game(engine, game_file)
        if plan is None:
          continue
        game.update(solvable=True, walkthrough=plan)
        traj["csa_jax"].update(plan_len=len(plan), gen_seconds=round(time.perf_counter() - t0, 3))
        with open(game_file, "w") as f:
          json.dump(game, f)
        with open(os.path.join(tmp, "traj_data.json"), "w") as f:
          json.dump(traj, f, indent=1)
        try:
          os.rename(tmp, final)  # atomic: another process may have written the same game
        except OSError:
          if not os.path.exists(os.path.join(final, "game.tw-pddl")):
            raise
        engine.game_file = os.path.join(final, "game.tw-pddl")  # same content, final path
        return
      finally:
        shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"no solvable ALFWorld game for seed={self.seed} split={split} "
                       f"index={index} after {MAX_ATTEMPTS} attempts")

  def traj_data(self, split: str, index: int) -> dict:
    with open(os.path.join(self.game_dir(split, index), "traj_data.json")) as f:
      return json.load(f)


class OfficialTasks:
  """The games `alfworld-download` fetched, filtered as `AlfredTWEnv.collect_game_files`."""

  source = "official"

  def __init__(self, data_dir: str | None, num_tasks: dict[str, int | None]):
    data_dir = data_dir or os.environ.get("ALFWORLD_DATA") or os.path.expanduser("~/.cache/alfworld")
    root = os.path.join(data_dir, "json_2.1.1")
    if not os.path.isdir(root):
      raise FileNotFoundError(
          f"no official ALFWorld data at {root}: run `alfworld-download` (needs network) and point "
          "ALFWORLD_DATA (or data_dir=) at it, or use source='generated'")
    self.root = root
    self._games = {}
    for split, sub in OFFICIAL_SPLIT_DIRS.items():
      games = self._collect(os.path.join(root, sub))
      cap = num_tasks.get(split)
      self._games[split] = games[:cap] if cap else games

  @staticmethod
  def _collect(path: str) -> list[str]:
    games = []
    for dirpath, _, files in os.walk(path):
      if "traj_data.json" not in files or "game.tw-pddl" not in files:
        continue
      if "movable" in dirpath or "Sliced" in dirpath:
        continue  # unsupported upstream too
      with open(os.path.join(dirpath, "traj_data.json")) as f:
        if json.load(f).get("task_type") not in TASK_TYPES:
          continue
      with open(os.path.join(dirpath, "game.tw-pddl")) as f:
        if not json.load(f).get("solvable"):
          continue
      games.append(os.path.join(dirpath, "game.tw-pddl"))
    return sorted(games)  # os.walk order is not deterministic

  def num_tasks(self, split: str) -> int:
    check_split(split)
    return len(self._games[split])

  def game_file(self, split: str, index: int, engine: Engine) -> str:
    del engine
    return self._games[split][index]

  def traj_data(self, split: str, index: int) -> dict:
    with open(os.path.join(os.path.dirname(self._games[split][index]), "traj_data.json")) as f:
      return json.load(f)
