"""A missing test dependency stops the suite with one clear message (tests/conftest.py)."""

import os
import re
import subprocess
import sys

from tests.conftest import TEST_DEPENDENCIES, missing_dependencies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_dependency_is_installed_here():
  assert missing_dependencies() == []


def test_a_missing_dependency_fails_the_run_with_its_name():
  # sys.modules[name] = None makes `import name` fail, as if it were not installed.
  code = ("import sys; sys.modules['torch'] = None; sys.modules['hypothesis'] = None; "
          "import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
          "'tests/test_config.py']))")
  # Plugin autoload off: hypothesis's pytest plugin would be imported before conftest.
  env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, check=False, env=env)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 4, out  # pytest's usage error: nothing ran, nothing passed
  assert ("missing test dependencies: hypothesis, " + TEST_DEPENDENCIES["torch"]) in out
  assert "pip install -r requirements-test.txt" in out
  assert not re.search(r"\d+ (passed|skipped)", out), out
