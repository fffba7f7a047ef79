"""SFT stopped midway (SIGTERM, Ctrl-C) and continued: its progress, saved at a batch.

The SFT loop (trainer.Trainer._sft) saves, when asked to stop, its train state (parameters,
optimizer state, step) and how many batches it has run to `workdir/sft_progress`; a run
started again with `--resume` restores them and skips that many batches of the same
seeded order, so SFT ends where the uninterrupted run ends. The directory is removed once
the SFT loop finishes (its result then lives in `workdir/sft`).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from csa_jax import workdir as workdir_lib


def directory(workdir: str) -> str:
  return os.path.join(workdir, workdir_lib.SFT_PROGRESS)


def exists(workdir: str) -> bool:
  return workdir_lib.has_sft_progress(workdir)


def save(workdir: str, state: Any, meta: dict[str, Any]) -> str:
  """Saves (and waits for) the SFT state after `meta["batch"]` batches."""
  from csa_jax.run.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  ckpt = Checkpointer(directory(workdir), max_to_keep=1)
  try:
    ckpt.save(int(meta["batch"]), state, meta)
  finally:
    ckpt.close()
  return ckpt.directory


def restore(workdir: str, state_template: Any) -> tuple[Any, dict[str, Any]]:
  from csa_jax.run.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  ckpt = Checkpointer(directory(workdir), max_to_keep=1)
  try:
    return ckpt.restore(state_template)
  finally:
    ckpt.close()


def remove(workdir: str) -> None:
  shutil.rmtree(directory(workdir), ignore_errors=True)
