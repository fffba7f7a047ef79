"""Orbax checkpoints of the whole training state, for resuming after a crash.

A checkpoint holds the train state (parameters, optimizer state, step counter) and a
JSON record of the host side (phase, RL iteration, env-step count, numpy RNG state).
The tokenizer and the config are written once beside the checkpoints, so a checkpoint
directory alone is enough to reload the policy.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """No checkpoint where one is required, or one that does not match the model."""


class Checkpointer:
  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._mgr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_names=("state", "meta"))

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    self._mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def restore(self, state_template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores into the structure, shapes and shardings of `state_template`."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    try:
      out = self._mgr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError, FileNotFoundError) as e:
      raise CheckpointError(f"checkpoint {step} in {self.directory} does not match the "
                            f"model: {str(e).splitlines()[0]}") from None
    return out["state"], dict(out["meta"])

  def read(self, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The saved tree as it was written (no template: host arrays) and its meta; for
    inspection and tests, where the model that wrote it need not be built."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    out = self._mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"])

  def wait(self) -> None:
    self._mgr.wait_until_finished()

  def close(self) -> None:
    self._mgr.wait_until_finished()
    self._mgr.close()
