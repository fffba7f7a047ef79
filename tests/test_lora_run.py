"""A tiny LoRA run of the quickstart's task through `launch.py` on CPU: SFT and RL train the
adapters alone, checkpoints hold the adapters (the base is named in their meta), the KL
term reads the SFT adapters, and a LoRA run killed (SIGKILL) right after a checkpoint
resumes bit for bit where the uninterrupted run ends (as tests/test_resume.py does for
full-parameter runs)."""

import os
import signal

import jax
import numpy as np
import pytest

from csa_jax.run.checkpoint import Checkpointer
from tests.test_resume import Runs, _metrics, _wait_for

# The tiny SFT start wins no episode, so every advantage is 0; the entropy bonus gives each
# RL update a gradient through the adapters all the same (and the KL one from the second).
LORA = ["model.lora.rank=8", "model.lora.alpha=16", "algo.entropy_coef=0.01"]
ITERATIONS = 2


class LoRARuns(Runs):
  def run(self, workdir, *sets, resume=False):
    return super().run(workdir, *LORA, *sets, resume=resume)

  def start(self, workdir, *sets):
    return super().start(workdir, *LORA, *sets)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  runs = LoRARuns(tmp_path_factory.mktemp("lora"))  # its SFT stage: rl_iterations=0
  runs.reference = runs.root / "reference"
  out = runs.run(runs.reference, *runs.sets(ITERATIONS))
  assert out.returncode == 0, out.stderr[-3000:]
  return runs


def _read(workdir, name="checkpoints"):
  ckpt = Checkpointer(os.path.join(workdir, name))
  tree, meta = ckpt.read()
  ckpt.close()
  return tree, meta


def _adapter_paths(params):
  return sorted(jax.tree_util.keystr(p) for p, _ in
                jax.tree_util.tree_flatten_with_path(params)[0])


@pytest.mark.slow
def test_a_tiny_lora_run_trains_sft_and_rl_and_saves_adapters_only(runs):
  sft, sft_meta = _read(runs.sft, "sft")
  paths = _adapter_paths(sft)
  assert paths and all(("lora_a" in p or "lora_b" in p) for p in paths), paths
  assert any(np.abs(np.asarray(x)).max() > 0 for p, x in
             jax.tree_util.tree_flatten_with_path(sft)[0] if "lora_b" in jax.tree_util.keystr(p))
  tree, meta = _read(runs.reference)
  assert meta["lora_base"] == "from scratch, seed 0"
  assert _adapter_paths(tree["params"]) == paths  # the policy: adapters, no base
  # Optimizer moments for the adapters alone: AdamW's mu and nu, one per adapter array.
  assert len(jax.tree.leaves(tree["opt_state"])) == 2 * len(paths) + 1
  # The SFT stage's summary line (the per-batch loss-curve lines carry sft/batch).
  sft_line = next(r for r in _metrics(runs.sft) if "sft/nll" in r and "sft/batch" not in r)
  assert np.isfinite(sft_line["sft/nll"]) and sft_line["sft/grad_norm"] > 0
  rl = [r for r in _metrics(runs.reference) if "rollout/success" in r]
  assert [r["step"] for r in rl] == list(range(1, ITERATIONS + 1))
  assert all(np.isfinite(r["loss/kl_ref"]) and r["loss/grad_norm"] > 0 for r in rl)


@pytest.mark.slow
def test_a_lora_run_killed_after_a_checkpoint_resumes_bitwise(runs):
  work = runs.root / "killed"
  proc = runs.start(work, *runs.sets(ITERATIONS))
  _wait_for((work / "checkpoints" / "1").exists, proc, "the first RL checkpoint")
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  proc.stderr.close()
  assert not (work / "checkpoints" / str(ITERATIONS)).exists()
  out = runs.run(work, *runs.sets(ITERATIONS), resume=True)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from" in out.stdout
  got, got_meta = _read(work)
  want, want_meta = _read(runs.reference)
  assert got_meta["phase"] == want_meta["phase"] == "done"
  for k in ("env_steps", "rollout_key", "np_rng", "summary", "iteration"):
    assert got_meta[k] == want_meta[k], k
  leaves_got, leaves_want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(leaves_got) == len(leaves_want) > 0
  for a, b in zip(leaves_got, leaves_want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # adapters, optimizer
  assert _metrics(work) == _metrics(runs.reference)
