"""VirtualHome (Puig et al., 2018) household activities, as the Embodied Agent Interface
(Li et al., 2024, `virtualhome-eval` 0.1.1) ships them for scene 1, played step by step.

Data and engine (both from the `virtualhome-eval` wheel, no Unity): 342 tasks of scene 1 in
26 activity categories ("Wash clothes", "Watch TV", ...), each with its initial scene graph,
gold program (`[WALK] <computer> (1.417)` lines), natural-language description and goal
specification (`task_state_LTL_formula_accurate.json`: node states, edges and ordered
required actions); the symbolic `evolving_graph` simulator executes one script line at a
time exactly as the package's `MotionPlanner.my_execute_primitive_action_eval` does
(`ScriptExecutor.call_action_method` with `instance_selection=True` and an eval-mode
`ExecutionInfo`, whose message is what a failed step shows).

Goals. A task is won when every goal holds at once: each node goal (`washing_machine (1001)
is ON`), each edge goal (`soap (1002) ON washing_machine (1001)`, `character HOLDS_RH cup`)
in the current state, and the required actions as an ordered subsequence of the actions
executed so far (`check_order_with_or_score`, "TOUCH|PUSH" meaning either). Different from
upstream's `scene_evaluate_wID`: its edge loop stops at the first satisfied edge goal (a
`break`), so a task with two or more edge goals can never be "all satisfied" there; here each
edge goal counts. With that, the gold program of 341 of the 342 tasks wins its task when
executed here; the one that does not, `688_1` ("Drink": its 17th line grabs a glass the
character already holds, and the simulator refuses), is listed in EXCLUDED and served by no
split. Four tasks have an empty goal specification (`84_1`, `93_1` "Set up table", `339_1`,
`627_1` "Turn on light"): any first action would win them, so they are left out too (NO_GOALS).
337 tasks remain.

Splits. `unseen`: every task of the five categories in UNSEEN_CATEGORIES (held-out activity
types, the generalisation split). The other 21 categories are split by task: within each
category, tasks sorted by id, every fifth (positions 4, 9, ...) is `test`, the rest `train`.

Observation (text). The agent sees the objects of the task, as the EAI action-sequencing
prompt lists "relevant objects": the rooms, every object placed for this task (ids >= 1000,
distractors included), every object whose states or edges differ between the task's initial
and final graph, the goal objects and the gold program's objects (so the expert's actions
can be written; this narrows the search compared with the whole 300-object house). It shows
the current room, what the character holds, what it is close to and its posture, the task
objects in this room with their states and their ON/INSIDE relations among task objects,
and where the other task objects are. After a step the simulator refused, the observation
starts with its message ("Cannot do that: <soap> (1002) is not close to the character ...").

Actions: one script line, `[GRAB] <soap> (1002)` (the program format; names and ids as the
observation writes them, ids without the `1.` scene prefix); any text is parsed, and what
cannot be parsed or executed is answered with a reason, never raised. Admissible actions are
candidates, neither a guarantee nor the whole set: one-object actions on objects the
character is close to or holds, where the object has a property the action needs
(`Action`'s property lists) or its class is one some train-split gold program applies the
action to (the simulator types on a keyboard, which lacks HAS_SWITCH; actions with no
property list, TOUCH, WASH, LOOKAT ..., are offered only that way: offering them on every
close object made lists of 400 lines); PUTBACK/PUTIN/POUR of a held object onto/into a close
object, under the same rule; WALK to the rooms; WALK/FIND to task objects (with
`admissible="nearby"`, the default, only those in the current room; "all": every task
object); and the 0-object actions. The simulator may still refuse a candidate, and accepts
lines outside the list (walking straight to an object in another room, grabbing an object
whose container the character is close to, an action-object pair no train program uses).
Gold-program steps not in the list, measured: "nearby" 15 of 1,687 (train), 10 of 312
(test), 57 of 560 (unseen categories); "all" 9 / 10 / 55. List length: "nearby" mean 29-38,
at most 173 lines; "all" mean 47-57. RUN is listed as WALK (the simulator runs it as WALK;
the gold programs' 8 RUN lines are rewritten to WALK).

StepInfo:
  * reward: 1.0 on the step that wins the task, else 0.0 (binary completion).
  * oracle_label: change in the number of satisfied goal conditions (node + edge + required
    actions) made by this step; 0 for a refused action. Sound (the task's own goals) but not
    a distance: steps every plan needs (walking, grabbing) often change no goal.
  * anchor: the character's room, posture, held and close task objects, the states of the
    task objects and the required-action progress, without history.
  * extra: goals_satisfied, goals_total, goal_fraction (partial progress), task_id,
    category, gold_length, step_limit.
  * done: won, or step_limit = `step_limit_factor` x gold-program length (default 3) reached
    (then `truncated`).

Expert: the gold program, line by line, while every executed action since reset followed
it (a refused action changes nothing and keeps the path); off the path it returns None.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import threading
from typing import Sequence

from environments.base import StepInfo, StepResult, TaskListEnv
from environments.registry import register_env

SPLITS = ("train", "test", "unseen")
UNSEEN_CATEGORIES = ("Change TV channel", "Drink", "Go to sleep", "Make coffee", "Wash hands")
# Gold program refused by the simulator (see the module docstring).
EXCLUDED = ("688_1",)
# Tasks whose goal specification is empty: every state satisfies them, so any first action
# would "win"; served by no split.
NO_GOALS = ("84_1", "93_1", "339_1", "627_1")
_DATA_SUBDIR = "dataset/programs_processed_precond_nograb_morepreconds"
_SCENE_DIR = "TrimmedTestScene1_graph/results_intentions_march-13-18"
_ACTION_RE = re.compile(r"^\s*\[\s*([A-Za-z_]+)\s*\]")
_PARAM_RE = re.compile(r"<([^<>]+?)>\s*\(\s*([^()]*?)\s*\)")
_GOLD_PARAM_RE = re.compile(r"<([^<>]+)>\s*\((?:\d+\.)?(\d+)\)")
_MAX_ACTION_CHARS = 200
_ADMISSIBLE_MODES = ("nearby", "all")


@dataclasses.dataclass(frozen=True)
class Task:
  task_id: str          # e.g. "27_2" (the program file's id)
  category: str         # e.g. "Wash clothes"
  description: str      # the program's natural-language description
  gold: tuple[str, ...]  # "[WALK] <dining_room> (201)" lines
  node_goals: tuple[tuple[int, str, str], ...]     # (id, class_name, state)
  edge_goals: tuple[tuple[int, str, int], ...]     # (from_id, relation, to_id)
  action_goals: tuple[str, ...]                    # "TOUCH|PUSH"


def _root() -> str:
  import virtualhome_eval  # pylint: disable=g-import-not-at-top
  return os.path.dirname(virtualhome_eval.__file__)


def _canonical_gold(line: str) -> str:
  action = _ACTION_RE.match(line).group(1).upper()
  action = "WALK" if action == "RUN" else action  # the simulator runs RUN as WALK
  params = "".join(f" <{n.strip()}> ({i})" for n, i in _GOLD_PARAM_RE.findall(line))
  return f"[{action}]{params}"


def _read_program(task_id: str) -> tuple[str, tuple[str, ...]]:
  path = os.path.join(_root(), _DATA_SUBDIR, "executable_programs", _SCENE_DIR,
                      f"file{task_id}.txt")
  with open(path) as f:
    lines = f.read().splitlines()
  gold = tuple(_canonical_gold(l) for l in lines if l.strip().startswith("["))
  return lines[1].strip(), gold


@functools.lru_cache(maxsize=1)
def all_tasks() -> tuple[Task, ...]:
  """Every task of scene 1 (EXCLUDED included), sorted by category then numeric id."""
  path = os.path.join(_root(), "resources/virtualhome/task_state_LTL_formula_accurate.json")
  with open(path) as f:
    spec = json.load(f)["scene_1"]
  tasks = []
  for category, files in spec.items():
    for task_id, entry in files.items():
      goal = entry["vh_goal"]
      description, gold = _read_program(task_id)
      nodes = tuple(dict.fromkeys((g["id"], g["class_name"], g["state"])
                                  for g in goal["goal"] if "state" in g))
      edges = tuple(dict.fromkeys((g["from_id"], g["relation_type"], g["to_id"])
                                  for g in goal["goal"] if "relation_type" in g))
      tasks.append(Task(task_id, category, description, gold, nodes, edges,
                        tuple(dict.fromkeys(goal["actions"]))))
  key = lambda t: (t.category, tuple(int(x) for x in t.task_id.split("_")))
  return tuple(sorted(tasks, key=key))


@functools.lru_cache(maxsize=1)
def split_tasks() -> dict[str, tuple[Task, ...]]:
  out = {s: [] for s in SPLITS}
  by_cat: dict[str, list[Task]] = {}
  for t in all_tasks():
    if t.task_id not in EXCLUDED + NO_GOALS:
      by_cat.setdefault(t.category, []).append(t)
  for category, tasks in by_cat.items():
    for k, t in enumerate(tasks):
      if category in UNSEEN_CATEGORIES:
        out["unseen"].append(t)
      else:
        out["test" if k % 5 == 4 else "train"].append(t)
  return {s: tuple(v) for s, v in out.items()}


@functools.lru_cache(maxsize=1)
def _gold_affordances() -> dict[tuple[str, int], frozenset[str]]:
  """(action, argument slot) -> object classes some train-split gold program applies it to.

  The simulator is more permissive than `Action`'s property lists (it types on a keyboard,
  which lacks HAS_SWITCH, and grabs water); the candidate list admits those too. Only train
  programs count, so the test and unseen splits teach the action list nothing.
  """
  out: dict[tuple[str, int], set[str]] = {}
  for t in split_tasks()["train"]:
    for line in t.gold:
      action = _ACTION_RE.match(line).group(1)
      for slot, (obj, _) in enumerate(_PARAM_RE.findall(line)):
        out.setdefault((action, slot), set()).add(obj)
  return {k: frozenset(v) for k, v in out.items()}


_GRAPH_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _graphs(task_id: str):
  """(initial EnvironmentGraph, initial graph dict, final graph dict) of a task."""
  from virtualhome_eval.simulation.evolving_graph.environment import EnvironmentGraph  # pylint: disable=g-import-not-at-top
  path = os.path.join(_root(), _DATA_SUBDIR, "init_and_final_graphs", _SCENE_DIR,
                      f"file{task_id}.json")
  with open(path) as f:
    d = json.load(f)
  return EnvironmentGraph(d["init_graph"]), d["init_graph"], d["final_graph"]


@functools.lru_cache(maxsize=1)
def _name_equivalence():
  from virtualhome_eval.simulation.evolving_graph import utils  # pylint: disable=g-import-not-at-top
  return utils.load_name_equivalence()


def _changed_ids(init: dict, final: dict) -> set[int]:
  """Nodes whose states or edges differ between the initial and final graph."""
  states0 = {n["id"]: set(n["states"]) for n in init["nodes"]}
  states1 = {n["id"]: set(n["states"]) for n in final["nodes"]}
  ids = {i for i in states0.keys() | states1.keys() if states0.get(i) != states1.get(i)}
  e0 = {(e["from_id"], e["relation_type"], e["to_id"]) for e in init["edges"]}
  e1 = {(e["from_id"], e["relation_type"], e["to_id"]) for e in final["edges"]}
  for a, rel, b in e0 ^ e1:
    if rel not in ("CLOSE", "FACING"):  # these follow the character around: not the task's
      ids.update((a, b))
  return ids


class _ParseError(ValueError):
  pass


@register_env("virtualhome", engines=("virtualhome-eval",))
class VirtualHomeTextEnv(TaskListEnv):
  """VirtualHome scene 1 through the evolving-graph simulator; pure Python, no engine process."""

  splits = SPLITS

  def __init__(self, step_limit_factor: int = 3, categories: str | Sequence[str] = "all",
               admissible: str = "nearby"):
    if not isinstance(step_limit_factor, int) or step_limit_factor < 1:
      raise ValueError(f"step_limit_factor={step_limit_factor!r}; must be a positive integer")
    if admissible not in _ADMISSIBLE_MODES:
      raise ValueError(f"admissible={admissible!r}; valid: {', '.join(_ADMISSIBLE_MODES)}")
    self._admissible = admissible
    known = sorted({t.category for t in all_tasks()})
    if categories == "all":
      self._categories = None
    else:
      cats = [categories] if isinstance(categories, str) else list(categories)
      bad = [c for c in cats if c not in known]
      if bad or not cats:
        raise ValueError(f"unknown categories {bad or cats}; valid: 'all' or {known}")
      self._categories = frozenset(cats)
    self._factor = step_limit_factor
    self._task: Task | None = None
    self._done = True

  # ---- tasks --------------------------------------------------------------------------------

  def _tasks(self, split: str) -> tuple[Task, ...]:
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    tasks = split_tasks()[split]
    if self._categories is not None:
      tasks = tuple(t for t in tasks if t.category in self._categories)
    return tasks

  # ---- episode ------------------------------------------------------------------------------

  def reset_task(self, task: Task) -> StepResult:
    """Starts `task` (any of `all_tasks()`, the EXCLUDED one too)."""
    from virtualhome_eval.simulation.evolving_graph.environment import EnvironmentState  # pylint: disable=g-import-not-at-top
    from virtualhome_eval.simulation.evolving_graph.execution import ScriptExecutor  # pylint: disable=g-import-not-at-top
    with _GRAPH_LOCK:
      graph, init, final = _graphs(task.task_id)
    self._task = task
    self._graph = graph
    self._state = EnvironmentState(graph, _name_equivalence(), instance_selection=True)
    self._executor = ScriptExecutor(graph, _name_equivalence())
    nodes = {n["id"]: n for n in init["nodes"]}
    self._char = next(i for i, n in nodes.items() if n["class_name"] == "character")
    self._rooms = tuple(sorted(i for i, n in nodes.items() if n["category"] == "Rooms"))
    gold_ids = {int(i) for line in task.gold for _, i in _PARAM_RE.findall(line)}
    goal_ids = ({g[0] for g in task.node_goals} | {g[0] for g in task.edge_goals}
                | {g[2] for g in task.edge_goals})
    objs = ({i for i in nodes if i >= 1000} | _changed_ids(init, final) | gold_ids | goal_ids)
    self._objects = tuple(sorted(i for i in objs
                                 if i in nodes and i != self._char and i not in self._rooms))
    self._history: list[str] = []
    self._steps = 0
    self._gold_pos, self._on_gold = 0, True
    self._limit = self._factor * len(task.gold)
    self._done = False
    self._satisfied = self._count_satisfied()
    obs = self._describe()
    return StepResult(observation=obs, reward=0.0, done=False, info=self._info(None, True))

  def step(self, action: str) -> StepResult:
    if self._task is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    if not isinstance(action, str):
      raise TypeError(f"action must be a string, got {type(action).__name__}")
    self._steps += 1
    message = None
    try:
      line = self._parse(action)
      message = self._execute(line)
    except _ParseError as e:
      line, message = None, str(e)
    valid = message is None
    if valid:
      self._history.append(line)
    self._track_gold(line, valid)
    before = self._satisfied
    self._satisfied = self._count_satisfied()
    won = self._satisfied == self._goals_total()
    limit = self._steps >= self._limit
    self._done = won or limit
    obs = self._describe()
    if message is not None:
      obs = f"Cannot do that: {message}\n{obs}"
    info = self._info(self._satisfied - before if valid else 0, valid, won=won,
                      truncated=limit and not won)
    return StepResult(observation=obs, reward=1.0 if won else 0.0, done=self._done, info=info)

  def _parse(self, action: str) -> str:
    """The canonical script line of `action`, or _ParseError with a readable reason."""
    from virtualhome_eval.simulation.evolving_graph.scripts import Action  # pylint: disable=g-import-not-at-top
    text = action.strip()
    if len(text) > _MAX_ACTION_CHARS:
      raise _ParseError(f"the action is {len(text)} characters long; write one script line "
                        "such as [GRAB] <soap> (1002)")
    m = _ACTION_RE.match(text)
    if not m:
      raise _ParseError(f"cannot parse {text[:60]!r}; write one script line such as "
                        "[WALK] <kitchen> (205) or [GRAB] <soap> (1002)")
    name = m.group(1).upper()
    if name not in Action.__members__:
      raise _ParseError(f"unknown action [{name}]")
    params = _PARAM_RE.findall(text[m.end():])
    arity = Action[name].value[1]
    if len(params) != arity:
      raise _ParseError(f"[{name}] takes {arity} object(s) written <name> (id), got {len(params)}")
    out = []
    for obj_name, obj_id in params:
      if not (obj_id.isascii() and obj_id.isdigit()) or len(obj_id) > 9:
        raise _ParseError(f"object id {obj_id!r} is not a number")
      node = self._state.get_node(int(obj_id))
      if node is None:
        raise _ParseError(f"there is no object with id {int(obj_id)} in this house")
      if obj_name.strip().lower().replace(" ", "_") != node.class_name:
        raise _ParseError(f"object {int(obj_id)} is <{node.class_name}>, not <{obj_name.strip()}>")
      out.append(f" <{node.class_name}> ({int(obj_id)})")
    return f"[{name}]" + "".join(out)

  def _execute(self, line: str) -> str | None:
    """Runs one canonical line; None on success, else the simulator's message."""
    from virtualhome_eval.simulation.evolving_graph.execution import ExecutionInfo  # pylint: disable=g-import-not-at-top
    from virtualhome_eval.simulation.evolving_graph.scripts import Script, parse_script_line  # pylint: disable=g-import-not-at-top
    script = Script([parse_script_line(line, len(self._history) + 1)])
    info = ExecutionInfo(eval_mode=True)
    try:
      nxt = next(self._executor.call_action_method(script, self._state, info,
                                                   self._executor.char_index), None)
    except Exception as e:  # pylint: disable=broad-except
      # The executor raises for actions it does not support (e.g. PUTOFF's misspelt property).
      return f"{line}: {e}"
    if nxt is None:
      return info.get_error_string() or f"{line} cannot be executed here"
    self._state = nxt
    return None

  def _track_gold(self, line: str | None, valid: bool) -> None:
    if not self._on_gold or not valid:
      return  # a refused action leaves the state as it was: still on the path
    gold = self._task.gold
    if self._gold_pos < len(gold) and line == gold[self._gold_pos]:
      self._gold_pos += 1
    else:
      self._on_gold = False

  # ---- reading the state ----------------------------------------------------------------

  def _ids_from(self, from_id: int, relation: str) -> set[int]:
    """Targets of `from_id`'s `relation` edges (read without the package's accessor, which
    adds the base graph's ids into the state's own edge sets as it reads them)."""
    from virtualhome_eval.simulation.evolving_graph.environment import Relation  # pylint: disable=g-import-not-at-top
    rel = Relation[relation]
    s = self._state
    ids = set(s._new_edges_from.get((from_id, rel), ()))  # pylint: disable=protected-access
    ids.update(self._graph.get_node_ids_from(from_id, rel))
    return ids - s._removed_edges_from.get((from_id, rel), set())  # pylint: disable=protected-access

  def state_dict(self) -> dict:
    """The current scene graph as upstream writes it (`EnvironmentState.to_dict`)."""
    return self._state.to_dict()

  def _states(self, node_id: int) -> list[str]:
    return sorted(s.name for s in self._state.get_node(node_id).states)

  def _count_satisfied(self) -> int:
    from virtualhome_eval.simulation.evolving_graph.eval_utils import check_order_with_or_score  # pylint: disable=g-import-not-at-top
    t = self._task
    n = sum(state in self._states(i) for i, _, state in t.node_goals)
    n += sum(b in self._ids_from(a, rel) for a, rel, b in t.edge_goals)
    if t.action_goals:
      n += check_order_with_or_score(list(t.action_goals), " ".join(self._history))[0]
    return n

  def _goals_total(self) -> int:
    t = self._task
    return len(t.node_goals) + len(t.edge_goals) + len(t.action_goals)

  def _name(self, i: int) -> str:
    return f"{self._state.get_node(i).class_name} ({i})"

  def _room_of(self, i: int) -> int | None:
    rooms = self._ids_from(i, "INSIDE") & set(self._rooms)
    return min(rooms) if rooms else None

  def _held(self) -> list[int]:
    return sorted(self._ids_from(self._char, "HOLDS_RH") | self._ids_from(self._char, "HOLDS_LH"))

  def _close(self) -> list[int]:
    return sorted(self._ids_from(self._char, "CLOSE") & set(self._objects))

  def _describe(self) -> str:
    room = self._room_of(self._char)
    here = [i for i in self._objects if self._room_of(i) == room]
    objects = set(self._objects)
    parts = []
    for i in here:
      rels = [f"{r.lower()} {self._name(j)}" for r in ("ON", "INSIDE")
              for j in sorted(self._ids_from(i, r) & objects)]
      parts.append(f"{self._name(i)} [{', '.join(self._states(i))}]"
                   + (f" {', '.join(rels)}" if rels else ""))
    posture = [s for s in self._states(self._char) if s in ("SITTING", "LYING")]
    elsewhere = [f"{self._name(i)} in {self._state.get_node(r).class_name}"
                 for i in self._objects if (r := self._room_of(i)) not in (room, None)]
    room_name = self._name(room) if room is not None else "nowhere"
    lines = [
        f"You are in the {room_name}" + (f", {posture[0].lower()}" if posture else "") + ".",
        f"You hold: {', '.join(self._name(i) for i in self._held()) or 'nothing'}.",
        f"You are close to: {', '.join(self._name(i) for i in self._close()) or 'nothing'}.",
        f"Here: {'; '.join(parts) or 'none of the task objects'}.",
        f"Elsewhere: {'; '.join(elsewhere) or 'nothing'}.",
        f"Rooms: {', '.join(self._name(r) for r in self._rooms)}.",
        f"Goals satisfied: {self._satisfied}/{self._goals_total()}.",
    ]
    return "\n".join(lines)

  def _task_text(self) -> str:
    t = self._task
    goals = [f"{self._name(i)} is {state}" for i, _, state in t.node_goals]
    goals += [f"{self._name(a)} {rel} {self._name(b)}" for a, rel, b in t.edge_goals]
    text = f"{t.category}: {t.description} Goal: {'; '.join(goals) or 'none'}."
    if t.action_goals:
      text += f" Required actions, in order: {', '.join(t.action_goals)}."
    return text

  def admissible_actions(self) -> tuple[str, ...]:
    """Candidate script lines for the current state (see the module docstring)."""
    from virtualhome_eval.simulation.evolving_graph.scripts import Action  # pylint: disable=g-import-not-at-top
    held = self._held()
    close = self._close()
    reach = sorted(set(close) | set(held))
    affords = _gold_affordances()
    name = lambda i: self._state.get_node(i).class_name
    line = lambda a, *ids: f"[{a}]" + "".join(f" <{name(i)}> ({i})" for i in ids)

    def fits(a: str, slot: int, i: int) -> bool:
      # An action the engine lists no property for (TOUCH, WASH, LOOKAT, ...) is offered on
      # the object classes some gold program applies it to: offering it on everything close
      # made lists of 400 lines.
      need = set(Action[a].value[2][slot])
      props = {p.name for p in self._state.get_node(i).properties}
      return bool(props & need) or name(i) in affords.get((a, slot), ())

    # Actions on what the character holds or is close to first: a prompt that cannot fit the
    # whole list keeps its head.
    near, moves, zero = [], [], []
    targets = self._objects
    if self._admissible == "nearby":
      room = self._room_of(self._char)
      targets = tuple(i for i in self._objects if self._room_of(i) == room)
    for i in self._rooms + targets:
      moves += [line("WALK", i)] + ([line("FIND", i)] if i not in self._rooms else [])
    for a in Action:
      if a.name in ("WALK", "FIND", "RUN"):
        continue  # RUN moves as WALK does
      arity = a.value[1]
      if arity == 0:
        zero.append(line(a.name))
      elif arity == 1:
        near += [line(a.name, i) for i in reach if fits(a.name, 0, i)]
      else:
        near += [line(a.name, h, j) for h in held for j in close
                 if j != h and fits(a.name, 0, h) and fits(a.name, 1, j)]
    return tuple(dict.fromkeys(near + moves + zero))

  def _anchor(self) -> str:
    states = ";".join(f"{i}:{','.join(self._states(i))}" for i in self._objects)
    return (f"room={self._room_of(self._char)} char={','.join(self._states(self._char))} "
            f"held={self._held()} close={self._close()} sat={self._satisfied} | {states}")

  def _info(self, label: int | None, valid: bool, won: bool = False,
            truncated: bool = False) -> StepInfo:
    t = self._task
    total = self._goals_total()
    extra = {
        "goals_satisfied": self._satisfied,
        "goals_total": total,
        "goal_fraction": self._satisfied / total if total else 1.0,
        "task_id": t.task_id,
        "category": t.category,
        "gold_length": len(t.gold),
        "step_limit": self._limit,
    }
    return StepInfo(task=self._task_text(), admissible_actions=self.admissible_actions(),
                    anchor=self._anchor(), won=won, action_valid=valid,
                    oracle_label=None if label is None else float(label),
                    truncated=truncated, extra=extra)

  # ---- expert -----------------------------------------------------------------------------

  def expert_action(self) -> str | None:
    if self._task is None or self._done or not self._on_gold:
      return None
    gold = self._task.gold
    return gold[self._gold_pos] if self._gold_pos < len(gold) else None
