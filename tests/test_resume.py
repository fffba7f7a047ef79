"""Runs that survive: killed (SIGKILL) right after a checkpoint, stopped (SIGTERM) in the
middle of an iteration, or finished and then extended, a run resumed with `--resume` ends
bit for bit where the uninterrupted run ends: the same parameters and optimizer state, and
the same metrics at every iteration (all but wall-clock times).

The killed and stopped runs are real `launch.py` processes (a signal is what they test);
the uninterrupted reference and the extended run are `launch.main` in this process, so the
processes' results are also compared with an in-process run's. All are TextWorldExpress
with a tiny decoder, starting from the session's SFT run (`sft.init_from`, tests/conftest.py's
twx_sft_start) so that only the RL phase is repeated; the processes share the session's
JAX compilation cache (every compile kept) so that each compiles nothing after the first.
"""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import launch
from csa_jax import perf
from csa_jax.rollout import metrics as M
from csa_jax.run.checkpoint import Checkpointer
from tests import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [*tiny_runs.TWX_TINY, "sft.epochs=30"]
ITERATIONS = 3


def _argv(workdir, *sets, resume=False):
  args = ["--exp", "twx_coin_csa", "--workdir", str(workdir)]
  for s in [*TINY, *sets]:
    args += ["--set", s]
  return args + (["--resume"] if resume else [])


def _cmd(workdir, *sets, resume=False):
  return [sys.executable, "launch.py", *_argv(workdir, *sets, resume=resume)]


def _env(cache):
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


class Runs:
  """`sft`: a run directory to start from; None trains one here (a `launch.py` process
  with `rl_iterations=0`, as tests/test_lora_run.py's LoRA runs do)."""

  def __init__(self, root, sft=None):
    self.root = root
    # The session's cache where there is one (tests/conftest.py), so that the processes
    # find what this process compiled too.
    self.cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or root / "jax_cache"
    if sft is not None:
      self.sft = sft
      return
    self.sft = root / "sft"
    out = self.run(self.sft, "rl_iterations=0", f"sft.demos_dir={root / 'demos'}")
    assert out.returncode == 0, out.stderr[-3000:]

  def sets(self, iterations=ITERATIONS):
    return [f"sft.init_from={self.sft}", f"rl_iterations={iterations}"]

  def run(self, workdir, *sets, resume=False):
    return subprocess.run(_cmd(workdir, *sets, resume=resume), cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=_env(self.cache))

  def run_here(self, workdir, *sets, resume=False):
    """The same run in this process (`launch.main`): no interpreter, imports or
    compiles to pay again, where a real process is not what is tested."""
    assert launch.main(_argv(workdir, *sets, resume=resume)) == 0

  def start(self, workdir, *sets):
    # A session of its own: a signal can go to its whole process group, as Ctrl-C does.
    return subprocess.Popen(_cmd(workdir, *sets), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(self.cache),
                            start_new_session=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, twx_sft_start):
  runs = Runs(tmp_path_factory.mktemp("resume"), sft=twx_sft_start[0])
  runs.reference = runs.root / "reference"
  runs.run_here(runs.reference, *runs.sets())
  return runs


def _wait_for(predicate, proc, what, timeout=300):
  t0 = time.monotonic()
  while not predicate():
    if proc.poll() is not None:
      pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: "
                  f"{proc.stderr.read()[-2000:]}")
    if time.monotonic() - t0 > timeout:
      proc.kill()
      pytest.fail(f"timed out waiting for {what}")
    time.sleep(0.05)


def _final_state(workdir):
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  tree, meta = ckpt.read()
  ckpt.close()
  return tree, meta


def _metrics(workdir):
  """Every metrics line, wall-clock times and their shares (perf/frac_*) left out."""
  return [{k: v for k, v in r.items() if not perf.is_wall_clock(k)}
          for r in M.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def assert_same_run(workdir, reference):
  got, got_meta = _final_state(workdir)
  want, want_meta = _final_state(reference)
  assert got_meta["phase"] == want_meta["phase"] == "done"
  assert got_meta["iteration"] == want_meta["iteration"] == ITERATIONS
  for k in ("env_steps", "rollout_key", "np_rng", "summary"):
    assert got_meta[k] == want_meta[k], k
  leaves_got, leaves_want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(leaves_got) == len(leaves_want) > 0
  for a, b in zip(leaves_got, leaves_want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise, optimizer too
  assert _metrics(workdir) == _metrics(reference)


def test_the_reference_run_learns_something_to_compare(runs):
  """Guards the tests below against comparing two runs that did nothing."""
  recs = _metrics(runs.reference)
  assert [r["step"] for r in recs if "rollout/success" in r] == [1, 2, 3]
  assert any(r.get("loss/grad_norm", 0) > 0 for r in recs)


def test_sigkill_right_after_a_checkpoint_resumes_bitwise(runs):
  work = runs.root / "killed"
  proc = runs.start(work, *runs.sets())
  first = work / "checkpoints" / "1"
  _wait_for(first.exists, proc, "the first RL checkpoint")
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  proc.stderr.close()
  assert proc.returncode == -signal.SIGKILL
  assert not (work / "checkpoints" / str(ITERATIONS)).exists()
  out = runs.run(work, *runs.sets(), resume=True)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from" in out.stdout
  assert_same_run(work, runs.reference)


@pytest.mark.parametrize("how", [
    "sigterm",  # a scheduler's preemption notice, to the process
    pytest.param("ctrl-c", marks=pytest.mark.slow),  # SIGINT to the whole process group:
    # the environment engines (JVMs) must survive it until the iteration is done
])
def test_sigterm_mid_iteration_saves_exits_and_resumes_bitwise(runs, how):
  work = runs.root / how
  proc = runs.start(work, *runs.sets())
  metrics = work / "metrics.jsonl"

  def second_iteration_running():  # iteration 1 is logged and saved, iteration 2 runs
    return (work / "checkpoints" / "1").exists() and any(
        r["step"] == 1 for r in M.read_jsonl(str(metrics), tolerate_partial_last=True))

  _wait_for(second_iteration_running, proc, "the end of RL iteration 1")
  sig = signal.SIGTERM if how == "sigterm" else signal.SIGINT
  if how == "sigterm":
    proc.send_signal(sig)
  else:
    os.killpg(proc.pid, sig)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 128 + sig, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith(f"launch.py: stopped by {sig.name} after RL iteration "), last
  assert "checkpoint saved in" in last and last.endswith("--resume"), last
  stopped_at = int(last.split("after RL iteration ")[1].split(";")[0])
  # It finished the iteration it was in (2, or 1 if the signal beat iteration 1's last
  # bookkeeping) and stopped before the last one.
  assert 1 <= stopped_at < ITERATIONS
  assert (work / "checkpoints" / str(stopped_at)).exists()
  out = runs.run(work, *runs.sets(), resume=True)
  assert out.returncode == 0, out.stderr[-3000:]
  assert_same_run(work, runs.reference)


def test_a_finished_run_extended_to_more_iterations_equals_the_longer_run(runs):
  work = runs.root / "extended"
  runs.run_here(work, *runs.sets(ITERATIONS - 1))
  runs.run_here(work, *runs.sets(ITERATIONS), resume=True)
  # The shorter run's final evaluation (its own line at its last step) stays in its log.
  got = _metrics(work)
  shorter_eval = [r for r in got if r["step"] == ITERATIONS - 1 and "rollout/success" not in r]
  assert len(shorter_eval) == 1
  got.remove(shorter_eval[0])
  got_state, _ = _final_state(work)
  want_state, _ = _final_state(runs.reference)
  for a, b in zip(jax.tree.leaves(got_state), jax.tree.leaves(want_state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert got == _metrics(runs.reference)
