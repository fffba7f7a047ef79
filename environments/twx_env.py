"""TextWorldExpress (Jansen & Cote, 2022, arXiv 2208.01174) behind the `TextEnv` protocol.

All eight games of the `textworld-express` engine: cookingworld, twc, coin, mapreader,
arithmetic, sorting, simonsays, peckingorder. Each env object owns one JVM (~110 MB) that
starts in about 0.1 s. Task `index` of a split is the index-th of the engine's valid seeds
for that fold (sorted), so `reset(split, index)` is deterministic.

What the adapter reports (see `StepInfo`):
  observation: the engine's observation text for this step, unchanged.
  anchor (GiGPO's state, see `state_anchor`): the room description (the engine's `look`),
    the inventory and the score, without history. Not the observation: the engine answers
    an invalid action with "Unknown action: ..." and "inventory" with the inventory in
    every room, so observation text would put steps in different rooms into one GiGPO step
    group (`rollout.anchor="faithful"` keeps that, as verl-agent does). Hidden state that
    neither the room, the inventory nor the score shows (e.g. whether cookingworld's
    cookbook was read) is not in it.
  task: the engine's task description.
  admissible_actions: the engine's validActions, sorted.
  reward: increase of the engine's normalised score (can be negative, e.g. in twc when an
    item is taken out of its place, or at a failure).
  won: the engine's `tasksuccess`.
  action_valid: False when the engine answered "Unknown action" (it parses exactly its
    valid-action strings; trailing spaces are tolerated, case is not).
  done: success, failure (`taskfailure`), or `step_limit` steps taken (truncated=True).
  oracle_label: the task-progress label of the step (see `progress_label`).
  extra: score, look (room description), inventory, on_gold_path, engine_step.

Oracle step label. The engine makes its gold path only at reset (`generateGoldPath`),
from the initial state; it has no planner callable from a mid-episode state (the Java
`PythonInterface` exposes none), so a re-planned "is this action on a shortest path from
here" label is not available. The soundest label is the engine's own scorer: +1 when the
step raised the score, -1 when it lowered it or made the task fail, 0 otherwise. It is
sound (it is exactly the engine's progress accounting) but coarse: 0 does not mean
useless (opening a door, moving toward the coin, reading a cookbook score 0). What raises
the score per game is in `ORACLE_LABEL_MEANING`. `extra["on_gold_path"]` is True while the
whole episode so far equals a prefix of the reset-time gold path (sound but only informative
on that path).

Expert determinism. Observations, admissible actions and rewards are the same for a
(split, index) in every run, and so is the gold path of seven games. "coin" is the
exception: its gold path is an exploration (look around, then a walk through the rooms
until the coin is seen) that the engine draws from an unseeded random generator, so it
differs from one JVM to the next (7 of 15 train seeds differed between two runs). Expert
demonstrations for coin, and what a policy cloned from them learns, therefore vary from
run to run.
"""

from __future__ import annotations

import dataclasses
import threading

from environments.base import StepInfo, StepResult, TextEnv
from environments.jvm import extra_java_opts, safe_process_groups
from environments.registry import register_env

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays",
         "peckingorder")

# Small defaults (expert paths of roughly 3-25 steps); the engine's own defaults are larger
# (e.g. 11 locations with doors for coin and cookingworld). Override with `game_params`.
DEFAULT_GAME_PARAMS = {
    "cookingworld": ("numLocations=3,numIngredients=2,numDistractorItems=2,includeDoors=0,"
                     "limitInventorySize=0"),
    "twc": "numLocations=2,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0",
    "coin": "numLocations=5,numDistractorItems=0,includeDoors=0,limitInventorySize=0",
    # maxDistanceApart=4 with 8 locations fails to generate 11 of the 3000 seeds; 3 fails none.
    "mapreader": ("numLocations=8,maxDistanceApart=3,maxDistractorItemsPerLocation=0,"
                  "includeDoors=0,limitInventorySize=0"),
    # These four take no size parameters worth shrinking; the engine's defaults are small.
    "arithmetic": "",
    "sorting": "",
    "simonsays": "",
    "peckingorder": "",
}

# What a +1 / -1 oracle label means in each game: the events that changed the engine's
# score in 60 episodes per game of mixed expert/random play (train tasks 0-59).
ORACLE_LABEL_MEANING = {
    "cookingworld": ("+1: took a recipe ingredient or prepared one as the recipe says "
                     "(slice/dice/chop/cook), prepared or ate the meal; -1: failure, e.g. ate "
                     "something that is not the meal or cooked an ingredient the wrong way."),
    "twc": ("+1: picked up a misplaced item or put an item in its usual location; -1: put "
            "an item in a wrong location or took one out of its usual location."),
    "coin": "+1: took the coin (the only scored event; it wins). No -1 events.",
    "mapreader": ("+1: took the coin, or put it into the box (wins). No -1 events were "
                  "seen; one would mean a score decrease or failure."),
    "arithmetic": ("+1: read the math problem, or put the right item in the box (wins); "
                   "-1: took a wrong item (score drops) or put a wrong one in the box "
                   "(failure)."),
    "sorting": ("+1: put the next-smallest item in the box; -1: took or put an item out "
                "of order (often a failure)."),
    "simonsays": "+1: did what Simon said; -1: anything else (failure).",
    "peckingorder": ("+1: took the item the instructions book asked for; -1: took another "
                     "item (failure) or put an item down (score drops)."),
}

SPLITS = ("train", "dev", "test")
_UNKNOWN_ACTION = "Unknown action"
# Start JVMs one at a time: py4j's launch reads the port from the child's stdout, and
# many concurrent launches on a small machine only contend.
_LAUNCH_LOCK = threading.Lock()


def state_anchor(infos: dict) -> str:
  """The state the agent is in, for GiGPO's step groups: room, inventory and score.

  simonsays has no room (its `look` is empty): its state is how many instructions were
  obeyed, which the score counts.
  """
  return f"{infos.get('look', '')}\n{infos.get('inventory', '')}\nscore: {float(infos['score'])}"


def progress_label(score_before: float, score_after: float, failed: bool) -> float:
  """+1 if the step raised the engine score, -1 if it lowered it or failed the task."""
  if failed or score_after < score_before:
    return -1.0
  if score_after > score_before:
    return 1.0
  return 0.0


@dataclasses.dataclass(frozen=True)
class TwxConfig:
  game: str = "coin"
  game_params: str | None = None  # None: DEFAULT_GAME_PARAMS[game]
  step_limit: int = 50

  def __post_init__(self):
    if self.game not in GAMES:
      raise ValueError(f"unknown TextWorldExpress game {self.game!r}; valid: {', '.join(GAMES)}")
    if self.step_limit < 1:
      raise ValueError(f"step_limit must be >= 1, got {self.step_limit}")

  @property
  def params(self) -> str:
    return DEFAULT_GAME_PARAMS[self.game] if self.game_params is None else self.game_params


def _launch_gateway_for_twx(*args, javaopts=(), **kwargs):
  """py4j's `launch_gateway` as the package calls it, with the JVM in its own process group
  and the options of CSA_JAX_TWX_JAVA_OPTS (environments/jvm.py) after the package's."""
  from py4j.java_gateway import launch_gateway  # pylint: disable=import-outside-toplevel
  return launch_gateway(*args, javaopts=[*javaopts, *extra_java_opts("twx")],
                        **{**kwargs, "create_new_process_group": True})


def _own_process_group_for_jvms() -> None:
  """Starts the package's JVMs in their own process group (and with the session's extra
  JVM options).

  Ctrl-C in a terminal sends SIGINT to the whole foreground group; the trainer turns it
  into "save after this iteration", which needs the engines alive until then. The package
  offers no option, so its module-level `launch_gateway` is replaced (idempotent), and the
  group is made without a Python preexec_fn (environments/jvm.py: one hung a test run). The
  JVM still dies with this process (die_on_exit: it exits when its stdin pipe closes).
  """
  from textworld_express import textworld_express as twx_mod  # pylint: disable=import-outside-toplevel
  safe_process_groups()
  twx_mod.launch_gateway = _launch_gateway_for_twx


def _java_ints(java_list) -> list[int]:
  """A Java list of integers, sorted, read in one py4j call.

  The package's `getValidSeeds*` copy a fold's 1,000 seeds element by element, one
  round trip to the JVM each: 0.2 s of wall time and as much CPU a fold, most of what
  starting an engine cost after the JVM itself. The list's `toString()` is one call."""
  text = java_list.toString()
  if not (text.startswith("[") and text.endswith("]")):
    raise RuntimeError(f"unexpected seed list from the engine: {text[:80]!r}")
  return sorted(int(x) for x in text[1:-1].split(",") if x.strip())


@register_env("twx", engines=("textworld-express",))
class TwxEnv(TextEnv):
  """One TextWorldExpress game; `make_env("twx", game=..., game_params=..., step_limit=...)`."""

  splits = SPLITS

  def __init__(self, game: str = "coin", game_params: str | None = None, step_limit: int = 50):
    self.config = TwxConfig(game=game, game_params=game_params, step_limit=step_limit)
    from textworld_express import TextWorldExpressEnv  # pylint: disable=import-outside-toplevel
    _own_process_group_for_jvms()
    with _LAUNCH_LOCK:
      # The wrapper's own step limit is unused: this adapter counts steps itself.
      self._env = TextWorldExpressEnv(envStepLimit=10**9)
    try:
      self._env.load(self.config.game, self.config.params)
    except ValueError as e:
      self.close()
      raise ValueError(f"bad game_params {self.config.params!r} for {self.config.game}: {e}") from None
    server = self._env.server
    self._seeds = {"train": _java_ints(server.getSeedsTrain()),
                   "dev": _java_ints(server.getSeedsDev()),
                   "test": _java_ints(server.getSeedsTest())}
    self._active = False
    self._task = ""
    self._gold: list[str] = []
    self._history: list[str] = []
    self._score = 0.0
    self._done = True

  # --- protocol ---------------------------------------------------------------------

  def num_tasks(self, split: str) -> int:
    return len(self._fold_seeds(split))

  def seed_of(self, split: str, index: int) -> int:
    seeds = self._fold_seeds(split)
    if not 0 <= index < len(seeds):
      raise IndexError(f"task index {index} out of range for split {split!r} "
                       f"(0..{len(seeds) - 1})")
    return seeds[index]

  def reset(self, split: str, index: int) -> StepResult:
    seed = self.seed_of(split, index)
    try:
      obs, infos = self._env.reset(seed=seed, gameFold=split, generateGoldPath=True)
    except Exception as e:
      self._active = False
      msg = str(e).strip().splitlines()
      raise RuntimeError(
          f"TextWorldExpress could not make {self.config.game} {split} task {index} (seed {seed}) "
          f"with game_params {self.config.params!r}: {msg[-1] if msg else type(e).__name__}"
      ) from e
    self._gold = list(self._env.getGoldActionSequence())
    self._task = infos["taskDescription"]
    self._history = []
    self._score = float(infos["score"])
    self._done = False
    self._active = True
    info = self._info(infos, obs, won=False, valid=True, label=None, truncated=False)
    return StepResult(observation=obs, reward=0.0, done=False, info=info)

  def step(self, action: str) -> StepResult:
    if not self._active:
      raise RuntimeError("step() before reset()")
    if self._done:
      raise RuntimeError("step() after the episode ended; call reset()")
    if not isinstance(action, str):
      raise TypeError(f"action must be str, got {type(action).__name__}")
    obs, _, _, infos = self._env.step(action)
    self._history.append(action)
    score = float(infos["score"])
    won = bool(infos["tasksuccess"])
    failed = bool(infos["taskfailure"])
    valid = not obs.startswith(_UNKNOWN_ACTION)
    reward = score - self._score
    label = progress_label(self._score, score, failed)
    self._score = score
    out_of_steps = len(self._history) >= self.config.step_limit
    done = won or failed or out_of_steps
    truncated = out_of_steps and not (won or failed)
    self._done = done
    info = self._info(infos, obs, won=won, valid=valid, label=label, truncated=truncated)
    return StepResult(observation=obs, reward=reward, done=done, info=info)

  def expert_action(self) -> str | None:
    """The reset-time gold path's next action while the episode follows it, else None."""
    if not self._active or self._done or not self._on_gold_path():
      return None
    t = len(self._history)
    return self._gold[t] if t < len(self._gold) else None

  def close(self) -> None:
    env, self._env = getattr(self, "_env", None), None
    if env is None:
      return
    try:
      env.close()
    except Exception:  # pylint: disable=broad-except
      pass  # The JVM may already be gone (killed or crashed); nothing left to free.
    gateway = getattr(env, "_gateway", None)
    proc = getattr(gateway, "java_process", None)
    if proc is not None and proc.poll() is None:
      proc.kill()
      proc.wait()
    # py4j frees Java objects from finalizers that run whenever Python's GC collects them;
    # with the JVM gone they would try to connect and log a traceback at a random moment
    # (on Python 3.11 that can land inside ast.parse and break it). Mark the client
    # disconnected so those finalizers do nothing, then release the objects now.
    client = getattr(gateway, "_gateway_client", None)
    if client is not None:
      client.is_connected = False
    env.server = None
    # The wrapper's __del__ calls close() again and prints a BrokenPipeError; disarm it.
    env.close = lambda: None

  # --- extras -----------------------------------------------------------------------

  @property
  def gold_path(self) -> tuple[str, ...]:
    return tuple(self._gold)

  @property
  def engine_pid(self) -> int | None:
    """Process id of this env's JVM (tests kill it to simulate a crash)."""
    proc = getattr(getattr(self._env, "_gateway", None), "java_process", None)
    return None if proc is None else proc.pid

  def _fold_seeds(self, split: str) -> list[int]:
    if split not in self._seeds:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return self._seeds[split]

  def _on_gold_path(self) -> bool:
    n = len(self._history)
    return n <= len(self._gold) and self._history == self._gold[:n]

  def _info(self, infos, obs, *, won, valid, label, truncated) -> StepInfo:
    return StepInfo(
        task=self._task,
        admissible_actions=tuple(sorted(infos["validActions"])),
        anchor=state_anchor(infos),
        won=won,
        action_valid=valid,
        oracle_label=label,
        truncated=truncated,
        extra={
            "score": float(infos["score"]),
            "look": infos.get("look", ""),
            "inventory": infos.get("inventory", ""),
            "on_gold_path": self._on_gold_path(),
            "engine_step": len(self._history),
            "game": self.config.game,
        },
    )
