"""What produced a run: the code's git commit and the versions of the packages it ran on
(recorded in the run's config.json under "provenance")."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain",
            "tensorflow-datasets", "tokenizers", "safetensors", "numpy", "textworld-express",
            "alfworld", "scienceworld", "tensorboardX", "transformers", "torch")


def _git(*args: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                         timeout=10, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def record() -> dict[str, Any]:
  """{"git_commit", "git_dirty", "python", "platform", "packages": {name: version}};
  None for what cannot be found (no git checkout, a package not installed)."""
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
  packages = {}
  for name in PACKAGES:
    try:
      packages[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None,
          "python": sys.version.split()[0], "platform": platform.platform(),
          "argv": list(sys.argv), "packages": packages}


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
  """The hex sha256 of a file's bytes."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk), b""):
      h.update(block)
  return h.hexdigest()
