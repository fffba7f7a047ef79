"""What the tiny TextWorldExpress runs of several test files share (the suite's time went
to compiles and to runs repeated file by file).

- `demos_dir()`: one demonstrations directory per pytest session. The expert's episodes
  are keyed by environment config and task count inside it (environments/demos.py), so
  runs with the same environment settings build them once, and `build_demos`'s file lock
  makes concurrent builds (two xdist workers) safe.
- `sft_start()`: one SFT-only run of the tiny TWX policy per session, the start
  (`sft.init_from`) of tests/test_trainer_rl.py, tests/test_algorithm_runs.py and
  tests/test_resume.py, which each trained the same policy from their own demonstrations
  before.
- `quickstart_run()`: one tiny quickstart_coin run (SFT + 1 RL iteration) per session,
  what tests/test_after_training.py's commands and tests/test_credit.py's study read.

`pytest_configure` (tests/conftest.py) makes the session's folder in the main process and
names it in CSA_TEST_SHARED_DIR, so the xdist workers find the same folder; the first
worker that needs a thing builds it under a file lock, the others wait and read it.
"""

import contextlib
import fcntl
import json
import os
import shutil

ENV_VAR = "CSA_TEST_SHARED_DIR"

# The tiny TWX coin run of the RL-loop tests: 6 envs, groups of 3, 4 turns, a 512-token
# vocabulary and a 128-token window.
TWX_TINY = [
    "sft.num_demos=6", "sft.epochs=1", "sft.batch_size=16",
    "rollout.tasks_per_iter=2", "rollout.group_size=3", "rollout.num_envs=6",
    "rollout.max_turns=4", "rollout.max_prompt_tokens=112", "rollout.max_action_tokens=6",
    "algo.minibatch_size=8", "eval.num_episodes=3", "eval.greedy=false",
    "checkpoint_every=1", "tokenizer.vocab_size=512", "model.vocab_size=512",
    "model.max_seq_len=128", "env.kwargs.step_limit=4"]

# The shared SFT start: TWX_TINY with enough epochs that the policy sometimes writes a
# valid action (mixed groups), SFT only (rl_iterations=0), default packing.
SFT_EXP = "twx_coin_grpo"
SFT_SETS = ["sft.epochs=30"]


def shared_dir() -> str:
  path = os.environ.get(ENV_VAR)
  if not path:
    raise RuntimeError(f"{ENV_VAR} is unset: tests/conftest.py's pytest_configure sets it")
  return path


def demos_dir() -> str:
  """The session's demonstrations directory."""
  return os.path.join(shared_dir(), "demos")


def twx_cfg(exp: str, iterations: int, demos: str, *extra: str):
  import experiments
  from csa_jax.config import apply_overrides
  return apply_overrides(experiments.get_experiment(exp),
                         [f"sft.demos_dir={demos}", *TWX_TINY, f"rl_iterations={iterations}",
                          *extra])


@contextlib.contextmanager
def _lock(path: str):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def sft_start() -> tuple[str, dict]:
  """(run directory, summary) of the session's SFT-only tiny TWX run, trained here the
  first time any process of the session asks for it. Tests read it, never write it: a
  test that resumes or extends a run copies it first."""
  return _shared_run("twx_sft", lambda: twx_cfg(SFT_EXP, 0, demos_dir(), *SFT_SETS))


# The session's tiny quickstart_coin run, SFT (3 epochs: a curve of several batches) and one
# RL iteration: what the after-training commands (tests/test_after_training.py) and the
# credit study (tests/test_credit.py) read, which each trained the same run before.
# TWX_TINY with its greedy held-out evaluation kept, and larger minibatches.
QUICKSTART_SETS = ["sft.epochs=3", "algo.minibatch_size=16", "eval.num_episodes=4",
                   "eval.greedy=true", "log_every=1"]


def quickstart_cfg(iterations: int = 1):
  return twx_cfg("quickstart_coin", iterations, demos_dir(), *QUICKSTART_SETS)


def quickstart_run() -> tuple[str, dict]:
  """(run directory, summary) of the session's tiny quickstart_coin run (SFT + 1 RL
  iteration), trained the first time any process asks. Read, never written: a test whose
  command writes into a run (`--eval` writes eval/step_N.json) works on a copy."""
  return _shared_run("quickstart_coin", quickstart_cfg)


def _shared_run(name: str, make_cfg) -> tuple[str, dict]:
  """Trains `make_cfg()` in the session's folder under `name` once per session (the first
  process to ask, under a file lock; the others wait and read)."""
  work = os.path.join(shared_dir(), name)
  summary_file = work + ".summary.json"
  with _lock(work + ".lock"):
    if not os.path.exists(summary_file):
      from csa_jax.run.trainer import Trainer
      shutil.rmtree(work, ignore_errors=True)  # a build that failed half-way
      summary = Trainer(make_cfg(), work).run()
      with open(summary_file + ".tmp", "w") as f:
        json.dump(summary, f, default=float)
      os.replace(summary_file + ".tmp", summary_file)
    with open(summary_file) as f:
      return work, json.load(f)
