"""KeyDoor: a delayed-credit text task with a horizon dial (pure Python).

The testbed for the proposal's claim that step-level credit helps most on long horizons
with a mix of routine and decisive steps. Design, after the long-term credit-assignment
diagnostics: bsuite's `umbrella_length` (Osband et al., 2020, "Behaviour Suite for
Reinforcement Learning": a decisive first action, then a chain of steps whose actions do
not matter, the outcome reward only at the end) and Key-to-Door (Hung et al., 2019,
"Optimizing agent behavior over long time scales by transporting value"; Raposo et al.,
2021, "Synthetic Returns"): pick up a key early, the door at the end opens only with it.

An episode of task (split, index):

1. The key room (step 0, decisive). The task line names the vault's key colour ("Task:
   take the blue key to the vault."); the observation lists `num_keys` keys of different
   colours in a per-task order; the admissible actions are "take <colour> key". Any other
   text takes no key.
2. The corridor: `horizon` routine steps. Every action, even an invalid one, moves one
   step on (so no routine action changes the outcome or the episode's length); the
   admissible ones are "walk on" and two distractors that also move on ("look around",
   "whistle"), listed in a per-step order. The observation says which key is held and how
   many steps remain.
3. With `decisions=2`, a second decisive step midway: a fork whose safe branch the task
   line names ("... at the fork go left"); the wrong branch is a dead end the agent only
   learns of at the vault.
After the last corridor step the episode ends at the vault: reward 1 and `won` when the
held key is the task's (and the fork was taken right), else 0. Episodes are exactly
`decisions + horizon` steps long; nothing is truncated.

Oracle step labels (exact, `StepInfo.oracle_label`): +1 for the right key (or branch), -1
for a wrong or missing one, 0 on every routine step. Anchor states (exact,
`StepInfo.anchor`): the room, the corridor position, the key held and the branch taken:
the whole state that decides the rest of the episode, nothing of the history.

The expert (`expert_action`) has a systematic misconception: with probability
`expert_noise` it takes the right key's partner colour (red and gold, blue and green,
white and black are confused; every task lists the partner among its keys) and at the fork
the other branch, so it is right with probability 1 - expert_noise at each decisive step;
with probability `routine_noise` it writes a distractor instead of "walk on". Its
randomness is seeded by the task, so demonstrations are reproducible. Cloning it (with
the lost episodes: `sft.demo_filter=all`) gives an SFT policy whose decisive choice is
about as noisy as the expert's, whatever the horizon. The noise is a fixed confusion and
not a uniformly random key on purpose: both of the expert's answers are functions of the
task line that a tiny decoder learns from 100 demonstrations, whereas a uniformly random
key at probability 0.6 left the right answer too rare to learn (measured: sampled SFT
success 0.22, chance level, against 0.78 at probability 0.3).

Where it differs from the published designs: the distractor actions carry no reward of
their own (bsuite's umbrella has distractor rewards; here their noise is only in the
policy's log-probs and in which text the policy writes); the right answer is given in the
task line, not observed once and remembered (Key-to-Door's memory demand is not tested:
history_turns is short on purpose); invalid actions are flagged (`action_valid=False`) so
the invalid-action penalty and metrics apply, and move on like any other action.
"""

from __future__ import annotations

import random
import zlib

from environments.base import StepInfo, StepResult, TaskListEnv
from environments.registry import register_env

COLOURS = ("red", "blue", "green", "white", "black", "gold")
# The expert's confusions (a symmetric pairing of COLOURS).
PARTNER = {"red": "gold", "gold": "red", "blue": "green", "green": "blue",
           "white": "black", "black": "white"}
ROUTINE = ("walk on", "look around", "whistle")
BRANCHES = ("left", "right")
# Tasks per split; the splits draw from disjoint seed ranges.
SPLIT_SIZES = {"train": 5000, "dev": 1000, "test": 1000}


def _seed(*parts) -> int:
  return zlib.crc32(repr(parts).encode())


@register_env("keydoor", revision=1)
class KeyDoorEnv(TaskListEnv):
  """Decisive key choice, `horizon` routine steps, outcome at the end."""

  splits = tuple(SPLIT_SIZES)

  def __init__(self, horizon: int = 4, num_keys: int = 4, decisions: int = 1,
               expert_noise: float = 0.0, routine_noise: float = 0.5):
    if not isinstance(horizon, int) or horizon < 1:
      raise ValueError(f"horizon must be an int >= 1, got {horizon!r}")
    if not 2 <= num_keys <= len(COLOURS):
      raise ValueError(f"num_keys must be in [2, {len(COLOURS)}], got {num_keys!r}")
    if decisions not in (1, 2):
      raise ValueError(f"decisions must be 1 or 2, got {decisions!r}")
    if decisions == 2 and horizon < 2:
      raise ValueError("decisions=2 needs horizon >= 2 (the fork sits inside the corridor)")
    for name, p in (("expert_noise", expert_noise), ("routine_noise", routine_noise)):
      if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {p!r}")
    self.horizon, self.num_keys, self.decisions = horizon, num_keys, decisions
    self.expert_noise, self.routine_noise = expert_noise, routine_noise
    self._task = None

  # -- tasks ---------------------------------------------------------------------------

  def _tasks(self, split: str):
    if split not in SPLIT_SIZES:
      raise ValueError(f"unknown split {split!r}; keydoor has {', '.join(SPLIT_SIZES)}")
    return _TaskList(split, SPLIT_SIZES[split], self.num_keys)

  @property
  def length(self) -> int:
    return self.horizon + self.decisions

  @property
  def fork_step(self) -> int | None:
    """The step index of the fork (decisions=2): after half the corridor."""
    return 1 + self.horizon // 2 if self.decisions == 2 else None

  def reset_task(self, task: dict) -> StepResult:
    self._task = task
    self._t, self._key, self._branch = 0, None, None
    self._expert_rng = random.Random(_seed("expert", task["split"], task["index"]))
    return self._result("", 0.0, False, valid=True, label=None)

  # -- the episode ----------------------------------------------------------------------

  def _kind(self) -> str:
    if self._t == 0:
      return "key"
    return "fork" if self._t == self.fork_step else "walk"

  def _admissible(self) -> tuple[str, ...]:
    kind, task = self._kind(), self._task
    if kind == "key":
      return tuple(f"take {c} key" for c in task["keys"])
    if kind == "fork":
      return tuple(f"go {b}" for b in BRANCHES)
    order = random.Random(_seed("routine", task["split"], task["index"], self._t))
    return tuple(order.sample(ROUTINE, len(ROUTINE)))

  def _task_line(self) -> str:
    line = f"take the {self._task['key']} key to the vault"
    if self.decisions == 2:
      line += f", at the fork go {self._task['branch']}"
    return line + "."

  def _observation(self) -> str:
    kind = self._kind()
    if kind == "key":
      return "Key room. Keys: " + ", ".join(self._task["keys"]) + "."
    held = f"You hold the {self._key} key." if self._key else "You hold no key."
    left = self.length - self._t
    where = "A fork: left or right." if kind == "fork" else f"Corridor, {left} to the vault."
    return f"{held} {where}"

  def _anchor(self) -> str:
    if self._t >= self.length:
      return f"vault key={self._key} branch={self._branch}"
    if self._t == 0:
      return "key room"
    return f"corridor {self._t} key={self._key} branch={self._branch}"

  def _won(self) -> bool:
    return (self._key == self._task["key"]
            and (self.decisions == 1 or self._branch == self._task["branch"]))

  def _result(self, observation, reward, done, *, valid, label) -> StepResult:
    adm = () if done else self._admissible()
    return StepResult(observation if done else self._observation(), reward, done,
                      StepInfo(task=self._task_line(), admissible_actions=adm,
                               anchor=self._anchor(), won=done and self._won(),
                               action_valid=valid, oracle_label=label))

  def step(self, action: str) -> StepResult:
    if self._task is None or self._t >= self.length:
      raise RuntimeError("step() before reset() or after the episode ended")
    action = action.strip()
    kind, valid = self._kind(), action in self._admissible()
    label = 0.0
    if kind == "key":
      self._key = action[len("take "):-len(" key")] if valid else None
      label = 1.0 if self._key == self._task["key"] else -1.0
    elif kind == "fork":
      self._branch = action[len("go "):] if valid else None
      label = 1.0 if self._branch == self._task["branch"] else -1.0
    self._t += 1
    done = self._t >= self.length
    won = done and self._won()
    obs = ("The vault opens." if won else "The vault stays shut.") if done else ""
    return self._result(obs, 1.0 if won else 0.0, done, valid=valid, label=label)

  def oracle_action(self) -> str | None:
    """The right key in the key room, the safe branch at the fork; None on routine steps."""
    if self._task is None or self._t >= self.length:
      return None
    kind = self._kind()
    if kind == "key":
      return f"take {self._task['key']} key"
    return f"go {self._task['branch']}" if kind == "fork" else None

  def expert_action(self) -> str | None:
    if self._task is None or self._t >= self.length:
      return None
    kind, rng, adm = self._kind(), self._expert_rng, self._admissible()
    if kind == "walk":
      return rng.choice(adm) if rng.random() < self.routine_noise else "walk on"
    confused = rng.random() < self.expert_noise
    if kind == "key":
      return f"take {PARTNER[self._task['key']] if confused else self._task['key']} key"
    branch = self._task["branch"]
    return f"go {next(b for b in BRANCHES if b != branch) if confused else branch}"


class _TaskList:
  """The tasks of one split, made on demand from (split, index): the right key, the keys
  shown (in their order; the right key's partner always among them) and the fork's safe
  branch."""

  def __init__(self, split: str, size: int, num_keys: int):
    self.split, self.size, self.num_keys = split, size, num_keys

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index: int) -> dict:
    if not 0 <= index < self.size:
      raise IndexError(index)
    rng = random.Random(_seed("task", self.split, index, self.num_keys))
    key = rng.choice(COLOURS)
    others = [c for c in COLOURS if c not in (key, PARTNER[key])]
    keys = [key, PARTNER[key]] + rng.sample(others, self.num_keys - 2)
    rng.shuffle(keys)
    return {"split": self.split, "index": index, "keys": tuple(keys), "key": key,
            "branch": rng.choice(BRANCHES)}
