"""The XLA flags the suite compiles with, and the environment of a process a test starts.

Most of the suite's CPU time is XLA compiling hundreds of small programs (tiny models, one
program per shape), and most of a compile is LLVM optimising the generated code. The suite
compiles with LLVM's optimisation off (`--xla_backend_optimization_level=0`): XLA's own
passes (fusion, layout, buffer assignment, sharding) run unchanged, so a test sees the same
program and the same memory plan (tests/test_conftest.py compares the optimised HLO and the
memory analysis at both levels); only the machine code is less optimised, which the tiny
programs do not notice. Measured on 4 heavy files (reports/suite_time.md, part 6): compile
time 666 -> 387 s, the files' wall time 455 -> 325 s on 2 cores.

The results round differently, as they do on another CPU model: tests compare two paths
of one process, or with NumPy under the tolerances they had, so none of them notices; the
golden test keeps its bitwise records per CPU and per optimisation level
(tests/test_golden.py). Benchmarks and real runs keep XLA's default. A user's own
`--xla_backend_optimization_level` is kept
(`XLA_FLAGS=--xla_backend_optimization_level=3 make test` runs the suite at XLA's default).

The allocator. A compile also spends about a sixth of its CPU in glibc's malloc and free
(perf on a sampler test: `_int_malloc`, `malloc_consolidate`, `unlink_chunk`, `_int_free`;
MLIR and LLVM allocate and free many small objects). The suite's workers and every process
a test starts run on jemalloc where the machine has it (`make test` installs Debian's
libjemalloc2 when it can): one sampler test's CPU 43.0 -> 36.7 s. The allocator changes
where objects live, not what is computed: the bitwise tests (the golden run, lambda 0 equal
to GRPO, resume) pass under it unchanged. A user's own preloaded allocator is kept.
"""

from __future__ import annotations

import glob
import os

from csa_jax.distributed.multiprocess_local import with_device_count

OPT_LEVEL_FLAG = "--xla_backend_optimization_level"
SUITE_FLAGS = (f"{OPT_LEVEL_FLAG}=0",)
# Where Debian and Red Hat install jemalloc (the Makefile's sysdeps looks in the same places).
JEMALLOC_GLOBS = ("/usr/lib/*-linux-gnu/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2")
# A preloaded library whose name holds one of these is an allocator a user chose.
ALLOCATOR_NAMES = ("jemalloc", "tcmalloc", "mimalloc")


def with_suite_flags(flags: str) -> str:
  """`flags` (an XLA_FLAGS value) with the suite's flags added where it does not set them."""
  have = {f.split("=", 1)[0] for f in flags.split()}
  return " ".join([*flags.split(), *(f for f in SUITE_FLAGS if f.split("=", 1)[0] not in have)])


def opt_level(flags: str | None = None) -> str:
  """The backend optimisation level `flags` (default: this process's XLA_FLAGS) asks for;
  "default" when it does not set one."""
  flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
  levels = [f.split("=", 1)[1] for f in flags.split() if f.startswith(OPT_LEVEL_FLAG + "=")]
  return levels[-1] if levels else "default"


def env_with_devices(devices: int, base: dict[str, str] | None = None, **extra) -> dict[str, str]:
  """An environment for a process that simulates `devices` CPU devices: `base` (default
  os.environ) with its XLA flags kept, any device count replaced, and `extra` set."""
  env = dict(os.environ if base is None else base, **extra)
  env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
  return env


def jemalloc_path() -> str | None:
  """This machine's jemalloc shared library, or None."""
  found = sorted(p for pattern in JEMALLOC_GLOBS for p in glob.glob(pattern))
  return found[0] if found else None


def with_suite_allocator(preload: str, jemalloc: str | None) -> str:
  """An LD_PRELOAD value: `preload` with `jemalloc` first, unless `preload` already names
  an allocator (a user's choice) or there is no jemalloc."""
  if jemalloc is None or any(name in preload for name in ALLOCATOR_NAMES):
    return preload
  return " ".join([jemalloc, *preload.split()])
