"""iStar, SPA-RL and multi-turn DPO end to end through `launch.py --exp twx_coin_<method>`
(real TextWorldExpress, tiny decoder, one shared SFT start), and `--resume` restoring the
auxiliary state (models and optimizer states) a checkpoint holds."""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

import launch
from csa_jax.algorithms import istar, mtdpo, spa
from csa_jax.rollout import metrics as M
from csa_jax.run.checkpoint import Checkpointer
from tests import tiny_runs

# The shared tiny TWX run (tests/tiny_runs.py), unpacked rows (one update shape a phase:
# nothing here is about packing), and a small SPA exploration.
TINY = [*tiny_runs.TWX_TINY, "optim.pack_rows=false", "algo.spa.explore_tasks=2",
        "algo.spa.explore_k=2", "algo.spa.epochs=1"]


def run(exp, workdir, *sets, resume=False):
  argv = ["--exp", exp, "--workdir", str(workdir)]
  for s in (*TINY, *sets):
    argv += ["--set", s]
  assert launch.main(argv + (["--resume"] if resume else [])) == 0


@pytest.fixture(scope="module")
def sft(twx_sft_start):
  """The session's tiny TWX SFT-only run (tests/conftest.py's twx_sft_start)."""
  return pathlib.Path(twx_sft_start[0])


def _read(directory, step=None):
  ck = Checkpointer(str(directory))
  tree, meta = ck.read(step)
  ck.close()
  return tree, meta


def _equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(la, lb))


@pytest.mark.parametrize("method, cls", [("istar", istar.IStar), ("spa", spa.SPA)])
def test_method_runs_and_resumes_with_its_aux_state(sft, tmp_path, monkeypatch, capsys,
                                                     method, cls):
  work = tmp_path / method
  run(f"twx_coin_{method}", work, f"sft.init_from={sft}", "rl_iterations=1")
  assert f"method {method}," in capsys.readouterr().out
  aux_key = "prm" if method == "istar" else "estimator"
  start, _ = _read(work / "checkpoints", 0)
  assert set(start) == {"train", "aux"}  # the aux state is in the checkpoint
  sft_params, _ = _read(sft / "sft")
  body = start["aux"][aux_key]["params"]
  assert _equal(body if method == "istar" else body["body"], sft_params)  # from SFT weights
  saved, _ = _read(work / "checkpoints", 1)

  seen = []
  real = cls.prepare

  def spy(self, ctx, it, batch, params, aux):
    seen.append(jax.tree.map(np.asarray, aux))
    return real(self, ctx, it, batch, params, aux)

  monkeypatch.setattr(cls, "prepare", spy)
  run(f"twx_coin_{method}", work, f"sft.init_from={sft}", "rl_iterations=2", resume=True)
  # Restored, not rebuilt: the aux model and its optimizer's step count as saved.
  assert _equal(seen[0][aux_key].params, saved["aux"][aux_key]["params"])
  assert int(seen[0][aux_key].step) == int(saved["aux"][aux_key]["step"])
  assert _equal(seen[0][aux_key].opt_state[1][0].mu,
                saved["aux"][aux_key]["opt_state"][1][0]["mu"])
  recs = M.read_jsonl(str(work / "metrics.jsonl"))
  its = [r for r in recs if "perf/aux_s" in r]
  assert [r["step"] for r in its] == [1, 2] and all(r["perf/aux_s"] > 0 for r in its)
  if method == "spa":
    assert int(saved["aux"]["ready"]) == 1
    # Explored once, in iteration 1; the resumed run did not explore again.
    assert [("spa/explore_episodes" in r) for r in its] == [True, False]
    assert its[0]["spa/explore_episodes"] == 4
  else:
    assert all("istar/pairs" in r for r in its)


def test_mtdpo_runs_end_to_end(sft, tmp_path, capsys, monkeypatch):
  """The tiny policy rarely wins, so rollout 0 of every group is relabelled a success
  (before pairs are picked): the DPO step surely runs inside the trainer."""
  real = mtdpo.MultiTurnDPO.prepare

  def relabel(self, ctx, it, batch, params, aux):
    won = np.zeros_like(batch.arrays.rewards_BxG)
    won[:, 0] = 1.0
    batch = dataclasses.replace(batch, arrays=dataclasses.replace(batch.arrays, rewards_BxG=won))
    return real(self, ctx, it, batch, params, aux)

  monkeypatch.setattr(mtdpo.MultiTurnDPO, "prepare", relabel)
  work = tmp_path / "mtdpo"
  # Batches of 16 rows hold both pairs (<= 2 x 4 steps each): one DPO step an iteration.
  run("twx_coin_mtdpo", work, f"sft.init_from={sft}", "rl_iterations=2",
      "algo.minibatch_size=16")
  out = capsys.readouterr().out
  line = next(l for l in out.splitlines() if l.startswith("experiment twx_coin_mtdpo"))
  assert "method mtdpo," in line and "estimator" not in line
  saved, _ = _read(work / "checkpoints")
  assert "params" in saved  # no aux state: the plain layout
  sft_params, _ = _read(sft / "sft")
  assert int(saved["step"]) == 2 and not _equal(saved["params"], sft_params)
  recs = [r for r in M.read_jsonl(str(work / "metrics.jsonl")) if "mtdpo/pairs" in r]
  assert [r["mtdpo/pairs"] for r in recs] == [2, 2]
  for r in recs:
    assert r["perf/update_skipped"] == 0 and r["perf/aux_s"] > 0
    assert np.isfinite(r["loss/dpo_loss"]) and r["loss/nonfinite_grad"] == 0
  # Iteration 1: policy == reference, so the margin is 0 and the loss log 2.
  assert recs[0]["loss/margin"] == 0 and abs(recs[0]["loss/dpo_loss"] - np.log(2)) < 1e-6


def test_spa_exploration_counts_inside_the_step_budget(tmp_path):
  """SPA's exploration steps count against rl_env_steps like the rollouts'
  (KeyDoor H = 4: every episode 5 steps; 6 episodes an iteration, 30 steps). Exploration
  stops at the chunk reaching explore_share x 100 = 25 steps (one chunk of 3 tasks x 2 =
  30 steps), so RL runs 3 iterations (60, 90, 120), not GRPO's 4, and the run ends within
  one iteration of the budget with the exploration included."""
  sets = ["sft.num_demos=6", "sft.epochs=2", "sft.batch_size=16", f"sft.demos_dir={tmp_path / 'd'}",
          "rollout.tasks_per_iter=2", "rollout.group_size=3", "rollout.num_envs=6",
          "algo.minibatch_size=8", "eval.num_episodes=3", "eval.greedy=false",
          "checkpoint_every=1", "algo.spa.explore_tasks=4", "algo.spa.explore_k=2",
          "algo.spa.epochs=1", "algo.spa.explore_share=0.25", "rl_env_steps=100",
          "rl_iterations=50", "optim.pack_rows=false"]
  argv = ["--exp", "keydoor_h4_spa", "--workdir", str(tmp_path / "run")]
  for s in sets:
    argv += ["--set", s]
  assert launch.main(argv) == 0
  recs = M.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  its = [r for r in recs if "rollout/env_steps" in r]
  explore = [r["spa/explore_steps"] for r in its if "spa/explore_steps" in r]
  assert explore == [30] and len(its) == 3
  total = recs[-1]["perf/env_steps_total"]
  assert total == sum(r["rollout/env_steps"] for r in its) + 30 == 120
  assert 100 <= total < 100 + 30
