"""Fault injection for testing and benchmarking `EnvPool` (not a task environment).

`make_env("faulty", inner="twx", inner_kwargs={...})` behaves exactly like the inner env,
except for three reserved actions: "__raise__" raises RuntimeError, "__hang__" blocks
for `hang_s` seconds or until close(), "__exit__" ends the hosting process at once (use
only with the pool's process backend: in a thread it would end the caller's process).
"""

from __future__ import annotations

import os
import threading

from environments.base import StepResult, TextEnv
from environments.registry import make_env, register_env

RAISE, HANG, EXIT = "__raise__", "__hang__", "__exit__"


@register_env("faulty")
class FaultyEnv(TextEnv):
  """Wraps a registered env; reserved actions raise, hang or kill the process."""

  def __init__(self, inner: str = "twx", inner_kwargs: dict | None = None,
               hang_s: float = 3600.0):
    self.inner = make_env(inner, **(inner_kwargs or {}))
    self.splits = self.inner.splits
    self.hang_s = hang_s
    self._closed = threading.Event()

  def num_tasks(self, split: str) -> int:
    return self.inner.num_tasks(split)

  def reset(self, split: str, index: int) -> StepResult:
    return self.inner.reset(split, index)

  def step(self, action: str) -> StepResult:
    if action == RAISE:
      raise RuntimeError("injected fault")
    if action == HANG:
      # close() (the pool's restart) ends the hang, so no thread outlives its test.
      if self._closed.wait(self.hang_s):
        raise RuntimeError("closed while hanging")
    if action == EXIT:
      os._exit(3)  # pylint: disable=protected-access
    return self.inner.step(action)

  def expert_action(self) -> str | None:
    return self.inner.expert_action()

  def close(self) -> None:
    self._closed.set()
    self.inner.close()
