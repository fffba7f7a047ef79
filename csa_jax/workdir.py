"""A run's work directory: whether it can be written, and what it holds.

The layout (what `trainer.Trainer` writes): `checkpoints/` (RL steps), `sft/` (the SFT
weights, once the SFT stage finished), `sft_progress/` (an SFT stage stopped midway),
config.json, tokenizer.json, metrics.jsonl and eval/. The questions about checkpoints
(which RL steps, whether SFT finished, whether there is anything to resume) are answered
here, from the directory names alone: orbax writes a step under a temporary name and
renames it to its number once complete, so a numbered entry is a finished save.
"""

from __future__ import annotations

import errno
import os
import tempfile

CHECKPOINTS = "checkpoints"
SFT = "sft"
SFT_PROGRESS = "sft_progress"


def unwritable(path: str, flag: str = "--workdir") -> str | None:
  """Why `path` cannot be (created and) written as a directory, or None.

  Looks at the path itself when it exists (it must be a directory), else at its nearest
  existing ancestor (a directory, on a writable file system, in which this user may create
  entries). A temporary entry is made and removed there, so a read-only mount, missing
  permissions or a full disk are found now rather than by the first checkpoint; nothing
  is left behind.
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    return f"{flag} {path} is a file, not a directory"
  probe = path
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      break
    probe = parent
  if not os.path.isdir(probe):
    return f"{flag} {path}: {probe} is a file, not a directory"
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".csa_jax_write_check_", dir=probe))
  except OSError as e:
    why = ("a read-only file system" if e.errno == errno.EROFS
           else os.strerror(e.errno) if e.errno else str(e))
    where = "it" if probe == path else probe
    return f"{flag} {path}: cannot write in {where} ({why})"
  return None


def saved_steps(directory: str) -> list[int]:
  """The finished saves (numbered entries) of a checkpoint directory, oldest first."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def rl_steps(workdir: str) -> list[int]:
  """The RL checkpoints of a run, by iteration (0: saved right after the SFT stage)."""
  return saved_steps(os.path.join(workdir, CHECKPOINTS))


def has_sft_checkpoint(workdir: str) -> bool:
  """Whether the run's SFT stage finished (its weights are in `sft/`)."""
  return bool(saved_steps(os.path.join(workdir, SFT)))


def has_sft_progress(workdir: str) -> bool:
  """Whether an SFT stage stopped midway saved its progress (csa_jax/run/sft_progress.py)."""
  return bool(saved_steps(os.path.join(workdir, SFT_PROGRESS)))


def resumable(workdir: str) -> bool:
  """Whether `--resume` has something to continue: an RL checkpoint or SFT's progress."""
  return bool(rl_steps(workdir)) or has_sft_progress(workdir)

