"""This machine made to import only what the nvidia-h200 device image will have.

The image's Python distributions are listed in benchmarks/gpu_image_packages.txt and the
wheels benchmarks/gpu_check.py carries there in benchmarks/gpu_wheels.txt. `install()`
wraps the finders of `sys.meta_path` so that they do not see any top-level module which
this machine's installed distributions provide but neither list names (the standard
library and modules of no distribution, such as this project's, pass); the image's own
packages bring what they require, the carried wheels only what the list names. tests/test_gpu_check.py
runs the check's `--tiny` mode under it, in every process it starts, through a
`sitecustomize.py` that `write_sitecustomize` writes:

  python -c "import benchmarks.gpu_image as g; g.write_sitecustomize('/tmp/block')"
  PYTHONPATH=/tmp/block python benchmarks/gpu_check.py --tiny

What it cannot see: versions (the image has jax 0.11.2 and transformers 5.17, this
venv its own) and modules imported before `sitecustomize` runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGE_LIST = os.path.join(HERE, "gpu_image_packages.txt")
WHEEL_LIST = os.path.join(HERE, "gpu_wheels.txt")
BLOCKED_LOG_ENV = "GPU_IMAGE_BLOCKED_LOG"  # a file every refusal is appended to


def normalize(name: str) -> str:
  """A distribution name as PEP 503 compares them."""
  return re.sub(r"[-_.]+", "-", name).lower()


def _names(path: str) -> list[str]:
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.split("#", 1)[0].strip()
      if line:
        out.append(line.split()[-1].split("==")[0])
  return out


def image_packages() -> set[str]:
  """The image's distributions and, as installed here, everything they require: the
  image comes with the needs of its own versions (this venv's huggingface-hub needs a
  package the image's older one does not, for one)."""
  todo = [normalize(n) for n in _names(IMAGE_LIST)]
  seen = set(todo)
  while todo:
    try:
      requires = importlib.metadata.requires(todo.pop()) or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for req in requires:
      if "extra ==" in req:
        continue
      dep = normalize(re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0])
      if dep not in seen:
        seen.add(dep)
        todo.append(dep)
  return seen


def carried_packages() -> set[str]:
  """The carried wheels alone (installed with --no-deps: each need is a line of its own)."""
  return {normalize(n) for n in _names(WHEEL_LIST)}


def blocked_modules(allowed: set[str]) -> set[str]:
  """Top-level modules installed here whose distributions are all outside `allowed`."""
  blocked = set()
  for module, dists in importlib.metadata.packages_distributions().items():
    if module in sys.stdlib_module_names:
      continue
    if not any(normalize(d) in allowed for d in dists):
      blocked.add(module)
  return blocked


class Blocker(importlib.abc.MetaPathFinder):
  """One of `sys.meta_path`'s finders that does not see `names`: their imports fail and
  `importlib.util.find_spec` answers None, as if they were not installed."""

  def __init__(self, finder, names: set[str], log_path: str | None = None):
    self.finder, self.names, self.log_path = finder, names, log_path

  def find_spec(self, fullname, path=None, target=None):
    if fullname.partition(".")[0] in self.names:
      if self.log_path:
        with open(self.log_path, "a", encoding="utf-8") as f:
          f.write(f"{os.getpid()} {fullname}\n")
      return None
    return self.finder.find_spec(fullname, path, target)

  def find_distributions(self, *args, **kwargs):
    """The metadata of what stays visible (importlib.metadata asks every finder)."""
    find = getattr(self.finder, "find_distributions", None)
    for dist in (find(*args, **kwargs) if find else ()):
      top = (dist.read_text("top_level.txt") or "").split()
      if not top or not set(top) <= self.names:
        yield dist

  def invalidate_caches(self):
    if hasattr(self.finder, "invalidate_caches"):
      self.finder.invalidate_caches()


def install(with_wheels: bool = True) -> set[str]:
  """Wraps every finder of `sys.meta_path` in a `Blocker`; returns the blocked names."""
  allowed = image_packages() | (carried_packages() if with_wheels else set())
  names = blocked_modules(allowed)
  log_path = os.environ.get(BLOCKED_LOG_ENV)
  sys.meta_path[:] = [Blocker(f, names, log_path) for f in sys.meta_path]
  return names


def write_sitecustomize(directory: str, with_wheels: bool = True) -> str:
  """A sitecustomize.py in `directory` that installs the blocker (put `directory` on
  PYTHONPATH); returns its path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "sitecustomize.py")
  with open(path, "w", encoding="utf-8") as f:
    f.write("import sys\n"
            f"sys.path.insert(0, {HERE!r})\n"
            "import gpu_image\n"
            f"gpu_image.install(with_wheels={with_wheels!r})\n"
            "sys.path.remove(" + repr(HERE) + ")\n"
            "del sys.modules['gpu_image']\n")
  return path
