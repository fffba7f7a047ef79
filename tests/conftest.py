"""Suite-wide set-up: every test dependency must be installed.

A test whose dependency is missing is not skipped: the whole run stops at start-up with
one message naming what is missing, so a suite that passes has run every test (a skip
is easy to miss in a long run, and CI would go green without the parity tests).
"""

import importlib.util

import pytest

# Module name -> what provides it (requirements-test.txt and requirements.txt).
TEST_DEPENDENCIES = {
    "hypothesis": "hypothesis",
    "torch": "torch (PyTorch, the CPU build is enough)",
    "transformers": "transformers",
    "alfworld": "alfworld",
    "scienceworld": "scienceworld",
    "textworld_express": "textworld-express",
}


def missing_dependencies(names=tuple(TEST_DEPENDENCIES)) -> list[str]:
  """The modules in `names` that cannot be imported (checked without importing them)."""
  missing = []
  for name in names:
    try:
      found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[name] is None (blocked)
      found = False
    if not found:
      missing.append(name)
  return missing


def pytest_configure(config):
  del config
  missing = missing_dependencies()
  if missing:
    raise pytest.UsageError(
        "missing test dependencies: " + ", ".join(TEST_DEPENDENCIES[m] for m in missing)
        + "; install them with `pip install -r requirements-test.txt` (tests are not "
        "skipped for a missing dependency)")
