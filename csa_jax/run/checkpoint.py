"""Orbax checkpoints of the whole training state, for resuming after a crash.

A checkpoint holds the train state (parameters, optimizer state, step counter) and a
JSON record of the host side (phase, RL iteration, env-step count, RNG states).
The tokenizer and the config are written once beside the checkpoints, so a checkpoint
directory alone is enough to reload the policy.

Integrity: orbax writes a step into a temporary directory and renames it when complete,
so a save killed midway leaves no step behind. A step damaged afterwards (a truncated or
deleted file) fails to restore; `restore` then falls back to the newest step that does,
with a warning, and moves the damaged ones aside to `<directory>.corrupt/` (kept for
inspection, and out of the way of the steps the resumed run will save again).

LoRA models (csa_jax/model/lora.py): of a parameter State with adapters only the adapters
are saved (`lora.strip`); the frozen base is what the run was started from (its
`model_path`, or the seed that initialised it, named in the meta), and a restore puts the
template's own base back beside the restored adapters (`lora.unstrip`).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import jax
import orbax.checkpoint as ocp

from csa_jax.model import lora


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
    if step in self._mgr.all_steps():
      # Orbax silently keeps the old step; the run's final record (phase "done") is
      # written at the step of its last periodic checkpoint, so replace it.
      self._mgr.wait_until_finished()
      self._mgr.delete(step)
    self._mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(lora.strip(state)), meta=ocp.args.JsonSave(meta)))

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._mgr.all_steps())

  def restore(self, state_template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores into the structure, shapes and shardings of `state_template`: the given
    step, or the newest one that restores (see the module docstring)."""
    if step is not None:
      return self._restore(state_template, step)
    steps = self.all_steps()[::-1]
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    failed: list[tuple[int, CheckpointError]] = []
    for s in steps:
      try:
        out = self._restore(state_template, s)
      except CheckpointError as e:
        failed.append((s, e))
        continue
      for bad, err in failed:
        aside = os.path.join(self.directory + ".corrupt", str(bad))
        print(f"warning: checkpoint {bad} in {self.directory} is damaged ({err.cause}); "
              f"resuming from step {s} instead, and moved it to {aside}", file=sys.stderr)
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        shutil.rmtree(aside, ignore_errors=True)
        shutil.move(os.path.join(self.directory, str(bad)), aside)
      if failed:
        self._mgr.reload()
      return out
    # Nothing restores: the likelier story is a different model, not damage everywhere.
    raise failed[0][1]

  def _restore(self, state_template: Any, step: int) -> tuple[Any, dict[str, Any]]:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, lora.strip(state_template))
    try:
      out = self._mgr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
      if out["meta"] is None:
        raise FileNotFoundError("its meta record is missing")
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many)
      cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      err = CheckpointError(f"checkpoint {step} in {self.directory} does not match the "
                            f"model or is damaged: {cause}")
      err.cause = cause
      raise err from None
    return lora.unstrip(out["state"], state_template), dict(out["meta"])

  def read(self, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The saved tree as it was written and its meta, every array on this process's first
    device (whatever mesh and process count wrote it); for inspection and tests, where
    the model that wrote it need not be built."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    saved = ocp.StandardCheckpointer().metadata(
        os.path.join(self.directory, str(step), "state")).item_metadata
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                            saved)
    out = self._mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"])

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """The meta record alone (the newest step's by default), arrays left on disk."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    out = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(out["meta"] or {})

  def wait(self) -> None:
    self._mgr.wait_until_finished()

  def close(self) -> None:
    self._mgr.wait_until_finished()
    self._mgr.close()
