"""One protocol for text environments (host side, never inside jit).

Every environment the trainer can use implements `TextEnv`: reset to a task by split and
index, then step with the action text the policy wrote. Both return a `StepResult`, whose
`StepInfo` carries what the trainer and the metrics need besides the observation: the task
description, the admissible actions, the anchor (what identifies the current state,
without history, for GiGPO's step groups), whether the task is won, whether the action was valid,
and an oracle step label where the environment can compute one soundly.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Sequence


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What an environment knows about the state after reset or step."""

  task: str
  admissible_actions: tuple[str, ...]
  # What identifies the current state, without history: equal anchors within a task group
  # are the "same state" for GiGPO's step groups. Each adapter documents its choice; it is
  # not the observation text, which can read the same in different states ("Nothing
  # happens."). `rollout.anchor="faithful"` uses the observation instead (verl-agent).
  anchor: str
  won: bool = False
  # False when the engine rejected or did not understand the action.
  action_valid: bool = True
  # Oracle step label of the step just taken (None after reset or where none exists);
  # each environment documents what its label means (e.g. decrease in distance to goal).
  oracle_label: float | None = None
  # True when the episode ended for a reason other than the task (step limit, error).
  truncated: bool = False
  error: str | None = None
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepResult:
  observation: str
  reward: float
  done: bool
  info: StepInfo


class TextEnv(abc.ABC):
  """A text environment with deterministic, indexed tasks."""

  # Splits this environment serves, e.g. ("train", "dev", "test").
  splits: tuple[str, ...] = ("train", "dev", "test")

  @abc.abstractmethod
  def num_tasks(self, split: str) -> int:
    """How many tasks `split` holds; reset takes an index below this."""

  @abc.abstractmethod
  def reset(self, split: str, index: int) -> StepResult:
    """Starts task `index` of `split`; the same (split, index) always gives the same task."""

  @abc.abstractmethod
  def step(self, action: str) -> StepResult:
    """Sends the action text as is; an invalid action is reported, never raised."""

  @abc.abstractmethod
  def expert_action(self) -> str | None:
    """The environment's expert's next action from the current state (None if unknown).

    At least valid along an expert trajectory started at reset; used for demonstrations.
    """

  def oracle_action(self) -> str | None:
    """The action whose oracle label is +1 from the current state, where the environment
    knows it exactly (a decisive step: KeyDoor's right key); None elsewhere."""
    return None

  def close(self) -> None:
    """Frees engine resources (JVMs, processes)."""

  def __enter__(self) -> TextEnv:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class TaskListEnv(TextEnv):
  """A TextEnv over fixed task lists: `_tasks(split)` gives a split's tasks in order and
  `reset_task(task)` starts one, so any task (held-out ones too) can be played by value."""

  @abc.abstractmethod
  def _tasks(self, split: str) -> Sequence[Any]:
    """The tasks of `split`, in index order (ValueError for an unknown split)."""

  @abc.abstractmethod
  def reset_task(self, task: Any) -> StepResult:
    """Starts `task`."""

  def num_tasks(self, split: str) -> int:
    return len(self._tasks(split))

  def task(self, split: str, index: int) -> Any:
    tasks = self._tasks(split)
    if not isinstance(index, int) or not 0 <= index < len(tasks):
      raise IndexError(f"index {index!r} out of range for split {split!r} with {len(tasks)} tasks")
    return tasks[index]

  def reset(self, split: str, index: int) -> StepResult:
    return self.reset_task(self.task(split, index))
