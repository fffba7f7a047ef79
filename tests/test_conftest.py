"""A missing test dependency stops the suite with one clear message (tests/conftest.py);
the suite's XLA flags reach every process and change the machine code only, and its
allocator reaches the workers and the processes they start (tests/xla_env.py)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests import xla_env
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


def test_the_suite_compiles_at_level_0_and_keeps_a_users_flags():
  """Catches the suite's XLA flags lost on the way to a worker or a process a test starts
  (the suite would compile at XLA's default, about 1.4 times the CPU), a user's own level
  overridden, and a device count added twice or dropped."""
  assert xla_env.opt_level() == "0"  # this worker's, inherited from pytest's main process
  assert xla_env.with_suite_flags("") == "--xla_backend_optimization_level=0"
  assert xla_env.with_suite_flags("--xla_backend_optimization_level=3 --a=1") == (
      "--xla_backend_optimization_level=3 --a=1")
  assert xla_env.opt_level("--xla_backend_optimization_level=2") == "2"
  assert xla_env.opt_level("--a=1") == "default"
  env = xla_env.env_with_devices(8, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 "
                                                  "--xla_backend_optimization_level=0"}, X="y")
  assert env == {"X": "y", "XLA_FLAGS": "--xla_backend_optimization_level=0 "
                                        "--xla_force_host_platform_device_count=8"}
  # A process a test starts compiles at the suite's level.
  out = subprocess.run([sys.executable, "-c", "from tests import xla_env; "
                        "print(xla_env.opt_level())"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=xla_env.env_with_devices(4))
  assert out.stdout.strip() == "0", out.stderr


def test_the_workers_and_their_processes_allocate_with_jemalloc_where_the_machine_has_it():
  """Catches the suite's allocator lost on the way to a worker or a process a test starts
  (the compiles would take about a sixth more CPU), a user's own allocator replaced, and
  jemalloc named twice."""
  jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
  assert xla_env.with_suite_allocator("", jemalloc) == jemalloc
  assert xla_env.with_suite_allocator("", None) == ""
  assert xla_env.with_suite_allocator("/x/libfoo.so", jemalloc) == f"{jemalloc} /x/libfoo.so"
  assert xla_env.with_suite_allocator("/x/libtcmalloc.so.4", jemalloc) == "/x/libtcmalloc.so.4"
  assert xla_env.with_suite_allocator(jemalloc, jemalloc) == jemalloc
  # jemalloc where the machine has it, unless the user preloads another allocator (the rule
  # is idempotent, so this process's own LD_PRELOAD gives what pytest's main process set).
  want = "libjemalloc" in xla_env.with_suite_allocator(os.environ.get("LD_PRELOAD", ""),
                                                       xla_env.jemalloc_path())
  probe = "print(any('libjemalloc' in line for line in open('/proc/self/maps')))"
  out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.stdout.strip() == str(want), out.stderr
  if os.environ.get("PYTEST_XDIST_WORKER"):  # (with -n 0 the tests run in pytest's own process)
    with open("/proc/self/maps") as f:
      assert ("libjemalloc" in f.read()) == want


def _programs(level: str, *args: str, devices: int = 1) -> dict:
  env = xla_env.env_with_devices(devices)
  env["XLA_FLAGS"] = " ".join(
      [f for f in env["XLA_FLAGS"].split() if not f.startswith(xla_env.OPT_LEVEL_FLAG)]
      + ([f"{xla_env.OPT_LEVEL_FLAG}={level}"] if level != "default" else []))
  out = subprocess.run([sys.executable, "-m", "tests.xla_programs", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_suites_level_changes_the_machine_code_only():
  """Catches an XLA whose backend optimisation level reaches its HLO passes (the suite would
  then test other programs than a user runs): a small program's optimised HLO and memory
  analysis are the same at the suite's level and at XLA's default."""
  suite, default = _programs("0"), _programs("default")
  assert suite == default and suite


@pytest.mark.slow
def test_the_suites_level_leaves_the_dry_run_programs_and_plan_alone():
  """The same for the sampler, SFT step and RL step of a dry run on a 4x2 mesh (the SPMD
  partitioner, the buffer assignment): equal HLO and equal bytes (measured equal at
  179c732)."""
  suite = _programs("0", "--dry-run", devices=8)
  assert suite == _programs("default", "--dry-run", devices=8) and len(suite) == 3
