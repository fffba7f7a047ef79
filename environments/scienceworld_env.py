"""ScienceWorld (Wang et al., 2022, "ScienceWorld: Is your Agent Smarter than a 5th Grader?").

Adapter from the `scienceworld` engine (a Scala simulator behind py4j, one JVM per env) to
the `TextEnv` protocol. It talks to the engine's `PythonInterface` directly instead of the
package's `ScienceWorldEnv.step`, because that wrapper recomputes the full valid-action list
(680-3,000 strings, 40-300 ms) on every step; here that list is built only when asked for.

Tasks and splits. `task` is a task name ("boil"), an id ("1-1"), a list of those, or "all"
(the 30 tasks in the engine's task-id order). Each split is the engine's own variation fold
(`getVariationsTrain/Dev/Test`); `reset(split, index)` enumerates (task, variation) pairs of
that split task by task, variations ascending.

Determinism. The engine orders objects by Java identity hash codes, which differ from run to
run, so the same variation can start with its objects listed (and named: "wood cup" vs "cup")
differently, and heat transfer or gold-path generation can differ. The JVM is therefore
started with `-XX:hashCode=2` (every identity hash is 1), which makes a (split, index) reset
give the same text, the same valid actions and the same gold path in every run. Pass
`deterministic=False` for the engine's stock behaviour.

Admissible modes and cost (see benchmarks/scienceworld_speed.py for the measured numbers):
  * "full": the engine's valid action-object combinations (`getValidActionObjectCombinations`,
    every template filled with every visible referent and checked), 100-3,000 strings;
    the dominant cost of a step.
  * "objects": the engine's action templates ("open OBJ", "move OBJ to OBJ", 25 strings) as
    the admissible actions and the visible object referents in `extra["objects"]`: what the
    engine prints for "help" and "objects". Sound (every template is a command and every
    referent a name the parser knows) but a policy must fill the slots; ~1-2 ms a step.
  * "none": () and nothing is computed; `valid_actions()` gives the full list on demand.
  While the engine waits for the answer to an "Ambiguous request" prompt, the admissible
  actions in "full" and "objects" modes are the numbers it offers ("0", "1", ...).

Ambiguity. Like the engine, an ambiguous action ("focus on door") is answered with a
numbered list and the next action must be a number; the gold paths rely on this. The step
is valid (the engine understood it) and `extra["awaiting_choice"]` is True.

StepInfo fields:
  * task: the engine's task description.
  * anchor: the room description ("look around", a free action) plus the inventory and the
    score, without history: two states with the same anchor look the same to the agent and
    have the same progress. Limits: objects outside the room and hidden internal state
    (temperatures not shown, time left for a plant to grow, what is focused) are not in it.
    Not the observation: "No known action matches that input." or an inventory listing read
    the same in every room (`rollout.anchor="faithful"` keys on the observation instead,
    as verl-agent's GiGPO does).
  * won: the engine reports the task completed with score 100.
  * action_valid: False when the engine printed "No known action matches that input." or
    "Unknown action." (the latter consumes a move in the engine).
  * reward: change of the engine's score (0-100, or -100 on failure) divided by 100; the
    initial state may already score (e.g. 8 for "be in a room with an open door"), so a won
    episode's rewards sum to (100 - extra["score"] at reset) / 100, as in the engine's wrapper.
  * oracle_label: the same score change / 100: the engine's partial-progress subgoals
    completed (or undone) by this step, 0.0 for an invalid action. It is sound (the engine's
    own task scoring) but sparse: steps that are necessary yet complete no scored subgoal
    (walking, opening a door) get 0, and a step that ruins the task (focusing on the wrong
    object) gets a negative label. The engine cannot re-plan a gold path from an arbitrary
    state, so a "on a re-planned gold path" label is not available; `extra["on_gold_path"]`
    says whether every state-changing action so far followed the gold path from reset
    (None when the gold path has not been generated).
  * done: won, failed (score < 0, as the engine's own Python wrapper does), or the step
    limit reached (then `truncated`, unless won or failed on that step).
  * extra: score (0-100 integer as the engine reports), moves (the engine's move count),
    task_name, variation, split, awaiting_choice, and objects in "objects" mode.

Expert. `expert_action()` returns the next action of the engine's gold path (generated
from the initial state; 5-320 steps). It is defined while every state-changing action since
reset followed it (invalid actions that leave the move count unchanged do not count); off
the path it returns None. The engine's gold paths of some tasks (mendelian-genetics, melt)
hold a few steps the engine itself rejects and still win; the expert sends them as they are. Generating the gold path costs up to ~15 s per reset
(mendelian-genetics), so it is made lazily: on the first expert_action() of an episode the
task is reloaded with the gold path and the episode's actions are replayed (deterministic
with the default JVM flag). Pass `gold_path=True` to generate it at every reset. The gold
path of a few variations does not win in the engine itself (for example boil variation 20
in the stock engine); `extra["score"]` tells.

The step limit counts calls to `step` (invalid actions included), not the engine's moves.
"""

from __future__ import annotations

import re
import subprocess
import threading
from typing import Sequence

from environments.base import StepInfo, StepResult, TextEnv
from environments.jvm import extra_java_opts, safe_process_groups
from environments.registry import register_env

_NO_MATCH = "No known action matches that input."
_UNKNOWN = "Unknown action."
_AMBIGUOUS = "Ambiguous request:"
_ADMISSIBLE_MODES = ("full", "objects", "none")
_SPLITS = ("train", "dev", "test")
_CHOICE_RE = re.compile(r"^(\d+):\t", re.MULTILINE)
# The engine's variation folds are fixed by the jar; one lookup per task per process.
_FOLDS: dict[str, dict[str, tuple[int, ...]]] = {}
_FOLDS_LOCK = threading.Lock()


def all_task_names() -> tuple[str, ...]:
  """The 30 ScienceWorld task names in task-id order (1-1 boil ... 10-2)."""
  from scienceworld.constants import ID2TASK  # pylint: disable=g-import-not-at-top
  return tuple(ID2TASK.values())


def _resolve_tasks(task: str | Sequence[str]) -> tuple[str, ...]:
  from scienceworld.utils import infer_task  # pylint: disable=g-import-not-at-top
  known = all_task_names()
  if isinstance(task, str):
    if task == "all":
      return known
    task = [task]
  names = []
  for t in task:
    if not isinstance(t, str):
      raise TypeError(f"task must be a string or a list of strings, got {t!r}")
    name = infer_task(t)
    if name not in known:
      raise ValueError(f"unknown ScienceWorld task {t!r}; valid: 'all' or one of {', '.join(known)}")
    names.append(name)
  if not names:
    raise ValueError("task list is empty; give a task name, a list of names, or 'all'")
  if len(set(names)) != len(names):
    raise ValueError(f"task list names a task twice: {list(task)}")
  return tuple(names)


def _launch(deterministic: bool):
  """Starts a JVM with the engine; returns (gateway, PythonInterface, process)."""
  from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway  # pylint: disable=g-import-not-at-top
  from scienceworld.constants import BASEPATH, JAR_PATH  # pylint: disable=g-import-not-at-top
  opts = ["-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2"] if deterministic else []
  opts += extra_java_opts("scienceworld")
  safe_process_groups()  # no Python preexec_fn in the forked child (environments/jvm.py)
  port, proc = launch_gateway(
      classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, return_proc=True, javaopts=opts,
      # Out of the terminal's process group: Ctrl-C reaches the trainer, which saves
      # after the current iteration, and not the engine it still needs until then.
      create_new_process_group=True)
  gateway = JavaGateway(
      gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=proc)
  server = gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
  return gateway, server, proc


@register_env("scienceworld", engines=("scienceworld",))
class ScienceWorldTextEnv(TextEnv):
  """ScienceWorld behind the TextEnv protocol; one JVM (~760 MB) per instance."""

  splits = _SPLITS

  def __init__(self, task: str | Sequence[str] = "boil", step_limit: int = 50,
               admissible: str = "full", simplifications: str = "easy",
               gold_path: bool = False, deterministic: bool = True):
    if admissible not in _ADMISSIBLE_MODES:
      raise ValueError(f"admissible={admissible!r}; valid: {', '.join(_ADMISSIBLE_MODES)}")
    if not isinstance(step_limit, int) or step_limit < 1:
      raise ValueError(f"step_limit={step_limit!r}; must be a positive integer")
    if not isinstance(simplifications, str):
      raise TypeError(f"simplifications={simplifications!r}; must be a comma-separated string")
    self._tasks = _resolve_tasks(task)
    self._step_limit = step_limit
    self._admissible = admissible
    self._simplifications = simplifications
    self._gold_at_reset = gold_path
    self._gateway, self._server, self._proc = _launch(deterministic)
    valid_simpl = ["easy"] + str(self._server.getPossibleSimplifications()).split(", ")
    for s in simplifications.split(","):
      if s and s not in valid_simpl:
        raise ValueError(f"unknown simplification {s!r}; valid: {', '.join(valid_simpl)}")
    self._episode: tuple[str, str, int] | None = None  # (split, task, variation)
    self._done = True

  # ---- tasks and splits -------------------------------------------------------------------

  def _folds(self, task: str) -> dict[str, tuple[int, ...]]:
    with _FOLDS_LOCK:
      if task not in _FOLDS:
        self._server.load(task, 0, "", False)
        _FOLDS[task] = {
            "train": tuple(sorted(int(v) for v in self._server.getVariationsTrain())),
            "dev": tuple(sorted(int(v) for v in self._server.getVariationsDev())),
            "test": tuple(sorted(int(v) for v in self._server.getVariationsTest())),
        }
      return _FOLDS[task]

  def _check_split(self, split: str) -> None:
    if split not in _SPLITS:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(_SPLITS)}")

  def num_tasks(self, split: str) -> int:
    self._check_split(split)
    return sum(len(self._folds(t)[split]) for t in self._tasks)

  def task_variation(self, split: str, index: int) -> tuple[str, int]:
    """The (task name, engine variation) that reset(split, index) loads."""
    self._check_split(split)
    n = self.num_tasks(split)
    if not isinstance(index, int) or not 0 <= index < n:
      raise IndexError(f"index {index!r} out of range for split {split!r} with {n} tasks")
    for t in self._tasks:
      fold = self._folds(t)[split]
      if index < len(fold):
        return t, fold[index]
      index -= len(fold)
    raise AssertionError("unreachable")

  # ---- episode ------------------------------------------------------------------------------

  def _load(self, task: str, variation: int, gold: bool) -> str:
    self._server.load(task, variation, self._simplifications, gold)
    # The engine's own reset is `look around` as the first move (as its Python wrapper does).
    return str(self._server.step("look around"))

  def reset(self, split: str, index: int) -> StepResult:
    task, variation = self.task_variation(split, index)
    obs = self._load(task, variation, self._gold_at_reset)
    self._episode = (split, task, variation)
    self._gold = (tuple(str(a) for a in self._server.getGoldActionSequence())
                  if self._gold_at_reset else None)
    # Every action sent since reset and whether it left the state unchanged, for replay.
    self._sent: list[tuple[str, bool]] = []
    self._gold_pos = 0
    self._on_gold = True
    self._steps = 0
    # The engine scores the initial state at the first `look around` (e.g. "be in a room with
    # an open door"); rewards count progress from there, as the engine's wrapper does.
    self._score = int(round(100 * float(self._server.getScore())))
    self._done = False
    self._awaiting = None
    return StepResult(observation=obs, reward=0.0, done=False, info=self._info(obs, None, True))

  def step(self, action: str) -> StepResult:
    if self._episode is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    if not isinstance(action, str):
      raise TypeError(f"action must be a string, got {type(action).__name__}")
    moves_before = int(self._server.getNumMoves())
    obs = str(self._server.step(action))
    self._steps += 1
    valid = not (obs.startswith(_NO_MATCH) or obs.startswith(_UNKNOWN))
    state_unchanged = not valid and int(self._server.getNumMoves()) == moves_before
    self._sent.append((action, state_unchanged))
    self._awaiting = obs if obs.startswith(_AMBIGUOUS) else None
    self._track_gold(action, state_unchanged)
    score = int(round(100 * float(self._server.getScore())))
    delta = (score - self._score) / 100.0
    self._score = score
    completed = bool(self._server.getCompleted())
    won = completed and score >= 100
    failed = score < 0
    limit = self._steps >= self._step_limit
    self._done = won or failed or completed or limit
    info = self._info(obs, delta, valid, won=won,
                      truncated=limit and not (won or failed or completed))
    return StepResult(observation=obs, reward=delta, done=self._done, info=info)

  def _track_gold(self, action: str, state_unchanged: bool) -> None:
    if self._gold is None or not self._on_gold:
      return
    if self._gold_pos < len(self._gold) and action == self._gold[self._gold_pos]:
      self._gold_pos += 1  # even if the engine rejects it: a few gold paths hold such steps
    elif not state_unchanged:
      # An unparsed action that leaves the move count unchanged is a no-op: still on the path.
      self._on_gold = False

  def _info(self, obs: str, delta: float | None, valid: bool, won: bool = False,
            truncated: bool = False) -> StepInfo:
    split, task, variation = self._episode
    extra = {
        "score": self._score,
        "moves": int(self._server.getNumMoves()),
        "task_name": task,
        "variation": variation,
        "split": split,
        "awaiting_choice": self._awaiting is not None,
        "on_gold_path": self._on_gold if self._gold is not None else None,
    }
    admissible: tuple[str, ...] = ()
    if self._admissible != "none" and self._awaiting is not None:
      admissible = tuple(_CHOICE_RE.findall(self._awaiting))
    elif self._admissible == "full":
      admissible = self.valid_actions()
    elif self._admissible == "objects":
      admissible = tuple(str(a) for a in self._server.getPossibleActions())
      extra["objects"] = tuple(str(o) for o in self._server.getPossibleObjects())
    anchor = (f"{self._server.freeActionLook()}\n{self._server.freeActionInventory()}\n"
              f"score: {self._score}")
    return StepInfo(
        task=str(self._server.getTaskDescription()),
        admissible_actions=admissible,
        anchor=anchor,
        won=won,
        action_valid=valid,
        oracle_label=None if delta is None else (delta if valid else 0.0),
        truncated=truncated,
        extra=extra,
    )

  def valid_actions(self) -> tuple[str, ...]:
    """The engine's full valid-action list for the current state (the costly call)."""
    if self._episode is None:
      raise RuntimeError("valid_actions() called before reset()")
    return tuple(str(a) for a in self._server.getValidActionObjectCombinations())

  # ---- expert -----------------------------------------------------------------------------

  def gold_path(self) -> tuple[str, ...]:
    """The engine's gold action sequence from this episode's initial state."""
    if self._episode is None:
      raise RuntimeError("gold_path() called before reset()")
    if self._gold is None:
      self._generate_gold()
    return self._gold

  def _generate_gold(self) -> None:
    # Reload with the gold path, then replay this episode's actions to restore the state.
    _, task, variation = self._episode
    self._load(task, variation, True)
    self._gold = tuple(str(a) for a in self._server.getGoldActionSequence())
    self._gold_pos, self._on_gold = 0, True
    for action, state_unchanged in self._sent:
      self._server.step(action)
      self._track_gold(action, state_unchanged)

  def expert_action(self) -> str | None:
    if self._episode is None or self._done:
      return None
    gold = self.gold_path()
    if not self._on_gold or self._gold_pos >= len(gold):
      return None
    return gold[self._gold_pos]

  # ---- lifetime ---------------------------------------------------------------------------

  def close(self) -> None:
    proc = getattr(self, "_proc", None)
    if proc is None:
      return
    self._proc = None
    if proc.poll() is None:
      try:
        self._gateway.shutdown()
      except Exception:  # pylint: disable=broad-except
        pass  # the JVM may have died meanwhile; it is reaped below either way
    # py4j marks its client disconnected only after a shutdown the JVM answered. Left
    # connected to a dead JVM, every Java proxy that is garbage collected later tries to
    # connect and logs a traceback from inside the collector, wherever it runs (inside an
    # ast.parse, on Python 3.11, that corrupts the parser's state: SystemError).
    self._gateway._gateway_client.is_connected = False  # pylint: disable=protected-access
    if proc.poll() is None:
      try:
        proc.stdin.write(b"\n")  # py4j's launcher exits on a newline from stdin
        proc.stdin.flush()
      except (BrokenPipeError, OSError, ValueError):
        pass
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)

  def __del__(self):
    self.close()
