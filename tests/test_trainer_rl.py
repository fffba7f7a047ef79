"""The RL loop's contract, on the real stack (TextWorldExpress, tiny decoder): a shared SFT
start (`sft.init_from`), CSA at lambda 0 equal to GRPO bit for bit, the KL anchor after a
resume, no update from all-zero advantages, and DAPO's dynamic sampling."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from csa_jax.algorithms import estimator as estimator_lib
from csa_jax.config import ConfigError
from csa_jax.rollout import groups
from csa_jax.rollout import metrics as M
from csa_jax.run import trainer as trainer_lib
from csa_jax.run.checkpoint import Checkpointer
from csa_jax.run.trainer import Trainer
from csa_jax.update import guard as guard_lib
from tests import tiny_runs
from tests.factories import episode, step


def tiny_cfg(exp, iterations, demos_dir, *extra):
  """The shared tiny TWX run (tests/tiny_runs.py), unpacked rows (one update shape a
  phase: these tests are not about packing; test_perf_metrics_in_every_rl_line_with_overlap
  and the slow packed-rows test turn packing back on)."""
  return tiny_runs.twx_cfg(exp, iterations, demos_dir, "optim.pack_rows=false", *extra)


@pytest.fixture(scope="module")
def sft_run(twx_sft_start):
  """An SFT-only run (rl_iterations=0): the shared start of the tests below, trained once
  per session (tests/conftest.py's twx_sft_start)."""
  return twx_sft_start


PEN = "algo.invalid_penalty=0.1"


@pytest.fixture(scope="module")
def pen_runs(sft_run, tmp_path_factory):
  """GRPO, CSA at lambda 0 and CSA at lambda 0.5, 2 iterations each from the shared SFT
  start with the invalid-action penalty (the tiny policy rarely wins; the penalty makes
  returns differ inside groups, so advantages are non-zero and the updates are real):
  name -> (workdir, summary, final checkpoint). Read by the tests below, never written
  (the KL-after-resume test extends a copy of the GRPO run)."""
  src, _ = sft_run
  root = tmp_path_factory.mktemp("pen_runs")
  out = {}
  for name, exp in (("grpo", "twx_coin_grpo"), ("csa0", "twx_coin_csa_lam0"),
                    ("csa", "twx_coin_csa")):
    work = str(root / name)
    # No demonstrations directory: with sft.init_from none is read (checked below).
    cfg = tiny_cfg(exp, 2, root / "no_demos", f"sft.init_from={src}", PEN)
    summary = Trainer(cfg, work).run()
    out[name] = work, summary, _params(os.path.join(work, "checkpoints"))
  assert not os.path.exists(root / "no_demos")
  return out


def _params(directory, step=None):
  ckpt = Checkpointer(directory)
  tree, _ = ckpt.read(step)
  ckpt.close()
  return tree


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _equal(a, b):
  la, lb = _leaves(a), _leaves(b)
  return len(la) == len(lb) and all(x.shape == y.shape and (x == y).all() for x, y in zip(la, lb))


def test_sft_only_run_writes_the_shared_start(sft_run):
  work, summary = sft_run
  assert set(summary) == {"sft"}  # no RL, no second evaluation
  assert summary["sft"]["eval_sampled/episodes"] == 3
  assert os.path.isdir(os.path.join(work, "sft"))
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  assert [r["step"] for r in recs if "eval_sampled/success" in r] == [0]


def test_init_from_starts_every_method_from_the_same_weights(sft_run, pen_runs):
  """The CSA run of `pen_runs` (from sft.init_from, no demonstrations directory)."""
  src, summary = sft_run
  work, out, _ = pen_runs["csa"]
  assert out["sft"] == summary["sft"]  # SFT evaluation carried over, not redone
  assert not os.path.exists(os.path.join(os.path.dirname(work), "no_demos"))  # none read
  with open(os.path.join(src, "tokenizer.json")) as a, open(os.path.join(work, "tokenizer.json")) as b:
    assert a.read() == b.read()
  assert _equal(_params(os.path.join(src, "sft")), _params(os.path.join(work, "sft")))
  assert "rl" in out and out["rl"]["eval_sampled/episodes"] == 3


def test_init_from_without_sft_checkpoint_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="holds no SFT checkpoint"):
    tiny_cfg("twx_coin_csa", 1, tmp_path, f"sft.init_from={tmp_path}")


def _run_and_params(exp, src, work, iterations=2, *extra):
  cfg = tiny_cfg(exp, iterations, os.path.dirname(work), f"sft.init_from={src}", *extra)
  trainer = Trainer(cfg, work)
  trainer.run()
  return trainer, _params(os.path.join(work, "checkpoints"))


def test_csa_lam0_equals_grpo_bitwise(sft_run, pen_runs):
  """The proposal: lambda = 0 is exactly GRPO. Same seed, same SFT start: the same
  rollouts, advantages, updates and final parameters, bit for bit."""
  src, _ = sft_run
  p_grpo, p_csa0, p_csa = (pen_runs[k][2] for k in ("grpo", "csa0", "csa"))
  assert not _equal(p_grpo["params"], _params(os.path.join(src, "sft")))
  assert _equal(p_grpo["params"], p_csa0["params"])
  keys = ("rollout/success", "rollout/env_steps", "adv/mean", "adv/std", "loss/pg_loss",
          "loss/grad_norm")
  recs = [[r for r in M.read_jsonl(os.path.join(pen_runs[d][0], "metrics.jsonl")) if "adv/std" in r]
          for d in ("grpo", "csa0")]
  assert len(recs[0]) == len(recs[1]) > 0
  for a, b in zip(*recs):
    assert [a.get(k) for k in keys] == [b.get(k) for k in keys]
  # And lambda > 0 is not GRPO (the test can tell them apart).
  assert not _equal(p_grpo["params"], p_csa["params"])


def test_kl_reference_is_the_sft_policy_after_resume(sft_run, pen_runs, tmp_path):
  """The GRPO run of `pen_runs` (2 iterations, algo.kl_coef at its default 0.05), copied
  and resumed to a third iteration."""
  src, _ = sft_run
  work = str(tmp_path / "kl")
  shutil.copytree(pen_runs["grpo"][0], work)
  kl = ("algo.kl_coef=0.05", PEN)
  cfg = tiny_cfg("twx_coin_grpo", 3, tmp_path, f"sft.init_from={src}", *kl)
  with open(os.path.join(work, "config.json")) as f:  # the first 2 iterations' KL anchor
    assert json.load(f)["algo"]["kl_coef"] == cfg.algo.kl_coef == 0.05
  resumed = Trainer(cfg, work, resume=True)
  resumed.run()
  sft = _params(os.path.join(src, "sft"))
  assert _equal(resumed.ref_params, sft)
  rl = _params(os.path.join(work, "checkpoints"))["params"]
  assert not _equal(rl, sft)  # the RL weights moved, so the check can fail
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  assert [r["step"] for r in recs if "loss/pg_loss" in r] == [1, 2, 3]
  assert all(np.isfinite(r["loss/kl_ref"]) for r in recs if "loss/pg_loss" in r)


def test_all_zero_advantages_make_no_update(sft_run, tmp_path, monkeypatch):
  """Iteration 1 learns (Adam's moments become non-zero); iteration 2's advantages are all
  0: its parameters must equal iteration 1's. An update with zero gradients would still
  move them by Adam's momentum."""
  src, _ = sft_run
  real = estimator_lib.compute_advantages
  calls = []

  def first_real_then_zero(arrays, algo, rollout):
    calls.append(1)
    adv = real(arrays, algo, rollout)
    if len(calls) == 1:
      adv = adv + np.where(arrays.mask_BxGxT, 0.5, 0.0).astype(np.float32)  # surely non-zero
      return adv
    return np.zeros_like(adv)

  monkeypatch.setattr(estimator_lib, "compute_advantages", first_real_then_zero)
  work = str(tmp_path / "zero")
  _run_and_params("twx_coin_grpo", src, work, 2, "algo.kl_coef=0")  # KL alone would move
  p1, p2 = (_params(os.path.join(work, "checkpoints"), s)["params"] for s in (1, 2))
  assert _equal(p1, p2)
  assert not _equal(p1, _params(os.path.join(src, "sft")))
  recs = [r for r in M.read_jsonl(os.path.join(work, "metrics.jsonl")) if "perf/update_skipped" in r]
  assert [r["perf/update_skipped"] for r in recs] == [0.0, 1.0]


@pytest.mark.parametrize("rounds", [1, 3])
def test_dynamic_sampling_inside_the_trainer(tmp_path, monkeypatch, rounds):
  """Uniform groups are dropped; at most `dynamic_sampling_rounds` rounds; the batch never
  exceeds tasks_per_iter groups; dropped episodes still count as environment steps."""
  cfg = tiny_cfg("twx_coin_dapo", 1, tmp_path, f"algo.dynamic_sampling_rounds={rounds}",
                 "rollout.tasks_per_iter=2", "rollout.group_size=3")
  # Round k: group outcomes. Round 0: one mixed group; round 1: two mixed; round 2: mixed.
  script = [[(1, 1, 1), (0, 1, 0)], [(1, 0, 0), (0, 0, 1)], [(1, 0, 1), (0, 0, 0)]]
  played_rounds = []

  def fake_run_episodes(pool, policy, tok, tasks, rcfg, rng, fmt=None, **kw):
    k = len(played_rounds)
    played_rounds.append(k)
    assert len(tasks) == 6
    return [episode([step((3, 4), (5, 1), (-0.5, -0.1)) for _ in range(2 + k)], won=bool(w))
            for g in script[k] for w in g]

  monkeypatch.setattr(trainer_lib.rollout_lib, "run_episodes", fake_run_episodes)
  batch, played = groups.collect(None, None, None, cfg, np.random.default_rng(0), fmt=None)
  trajs, arrays = batch.trajs, batch.arrays
  if rounds == 1:
    assert len(played_rounds) == 1 and played == 6 * 2
    assert arrays.rewards_BxG.tolist() == [[0, 1, 0]]  # the uniform group was dropped
  else:  # round 0 keeps 1 group, round 1 fills the batch: stop after 2 of 3 rounds
    assert len(played_rounds) == 2 and played == 6 * 2 + 6 * 3
    assert arrays.rewards_BxG.tolist() == [[0, 1, 0], [1, 0, 0]]  # capped at B = 2
  assert len(trajs) == arrays.rewards_BxG.size <= 2 * 3


def test_dynamic_sampling_all_uniform_makes_no_update(tmp_path, monkeypatch):
  cfg = tiny_cfg("twx_coin_dapo", 1, tmp_path, "algo.dynamic_sampling_rounds=2",
                 "algo.kl_coef=0")
  monkeypatch.setattr(trainer_lib.rollout_lib, "run_episodes",
                      lambda pool, policy, tok, tasks, *a, **k: [
                          episode([step((3, 4), (5, 1), (-0.5, -0.1)) for _ in range(2)], won=True)
                          for _ in tasks])
  t = Trainer(cfg, str(tmp_path / "w"))
  t.tok, t.fmt = None, None

  def no_step(*a):
    raise AssertionError("an all-uniform round must not update")

  state, m = t._rl_iteration(0, None, None, no_step, "state", None)
  assert state == "state" and m["perf/update_skipped"] == 1.0
  assert m["perf/env_steps_total"] == 2 * 6 * 2  # both rounds' episodes counted


def test_init_from_a_run_still_in_sft_is_a_config_error(tmp_path):
  """A run's sft/ directory exists from its first second; only a saved step counts."""
  (tmp_path / "sft").mkdir()
  with pytest.raises(ConfigError, match="holds no SFT checkpoint"):
    tiny_cfg("twx_coin_csa", 1, tmp_path, f"sft.init_from={tmp_path}")


def test_non_finite_guard_counts_resets_and_stops():
  guard = guard_lib.NonFiniteGuard(limit=3)
  ok, bad_loss = {"nonfinite_loss": 0.0, "nonfinite_grad": 0.0}, {"nonfinite_loss": 1.0,
                                                                  "nonfinite_grad": 1.0}
  bad_grad = {"nonfinite_loss": 0.0, "nonfinite_grad": 1.0}
  assert [guard.observe(m, "x") for m in (bad_grad, bad_loss, ok, bad_grad, bad_grad)] == \
      [True, True, False, True, True]
  assert guard.state() == {"in_a_row": 2, "total": 4}
  with pytest.raises(guard_lib.NonFiniteError,
                     match=r"^RL iteration 7: 3 updates in a row skipped because the gradient "
                           r"was not finite \(optim.max_nonfinite_in_a_row=3\)"):
    guard.observe(bad_grad, "RL iteration 7")
  never = guard_lib.NonFiniteGuard(limit=0)
  assert all(never.observe(bad_loss, "x") for _ in range(50))


def test_non_finite_advantages_skip_updates_then_stop_the_run(sft_run, tmp_path, monkeypatch):
  """NaN advantages (a non-finite loss) in the real loop: with no limit every update is
  skipped and counted and the parameters stay the SFT ones; with a limit the run stops
  with a message naming the iteration, after saving nothing past its last checkpoint."""
  src, _ = sft_run
  monkeypatch.setattr(estimator_lib, "compute_advantages",
                      lambda arrays, algo, rollout: np.full(arrays.mask_BxGxT.shape, np.nan,
                                                            np.float32))
  work = str(tmp_path / "nan")
  _run_and_params("twx_coin_grpo", src, work, 1, "optim.max_nonfinite_in_a_row=0",
                  "algo.kl_coef=0")
  assert _equal(_params(os.path.join(work, "checkpoints"), 1)["params"],
                _params(os.path.join(src, "sft")))
  (rec,) = [r for r in M.read_jsonl(os.path.join(work, "metrics.jsonl")) if "adv/std" in r]
  assert rec["loss/nonfinite_skipped"] == rec["loss/nonfinite_total"] >= 1
  cfg = tiny_cfg("twx_coin_grpo", 3, tmp_path, f"sft.init_from={src}",
                 "optim.max_nonfinite_in_a_row=1", "algo.kl_coef=0")
  with pytest.raises(guard_lib.NonFiniteError,
                     match=r"^RL iteration 1: 1 updates in a row skipped because the loss"):
    Trainer(cfg, str(tmp_path / "stop")).run()
  assert Checkpointer(str(tmp_path / "stop" / "checkpoints")).all_steps() == [0]


PHASE_KEYS = [f"perf/{p}_s" for p in ("env", "prompt", "sample", "adv", "batch", "update",
                                      "eval", "checkpoint", "iteration")]


def _check_perf_lines(recs) -> None:
  """Every RL line carries the perf/ timings, shares that add up to 1 and the padding
  fractions."""
  assert recs
  for r in recs:
    assert all(r[k] >= 0 for k in PHASE_KEYS)
    assert r["perf/env_s"] > 0 and r["perf/sample_s"] > 0 and r["perf/update_s"] > 0
    fracs = [v for k, v in r.items() if k.startswith("perf/frac_")]
    assert len(fracs) == 9 and sum(fracs) == pytest.approx(1.0)
    for k in ("sampler_prompt", "sampler_gen", "train"):
      assert 0 <= r[f"perf/{k}_pad_frac"] < 1
    assert r["perf/gen_tokens_per_s"] > 0 and r["perf/env_steps_per_s"] > 0


def _perf_lines(workdir):
  return [r for r in M.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "perf/iteration_s" in r]


def test_perf_metrics_in_every_rl_line_with_overlap(sft_run, tmp_path):
  """Two RL iterations with rollout.overlap (the sampler dispatched asynchronously) and
  packed rows (the defaults otherwise): both lines carry every perf/ key."""
  src, _ = sft_run
  _run_and_params("twx_coin_csa", src, str(tmp_path / "overlap"), 2,
                  PEN, "rollout.overlap=true", "optim.pack_rows=true")
  recs = _perf_lines(tmp_path / "overlap")
  assert len(recs) == 2
  _check_perf_lines(recs)


# Slow (two more RL runs, about 1 min): tests/test_train_step.py checks the packed loss,
# log-probs and gradients against the unpacked ones in the default suite.
@pytest.mark.slow
def test_packed_rows_update_like_unpacked_rows(sft_run, tmp_path):
  """optim.pack_rows on and off: one RL iteration from the same SFT start plays the same
  episodes and ends at the same parameters to float32 rounding (the packed loss is the
  unpacked one), with no more training-row padding."""
  src, _ = sft_run
  pen = "algo.invalid_penalty=0.1"
  _, packed = _run_and_params("twx_coin_csa", src, str(tmp_path / "packed"), 1, pen,
                              "optim.pack_rows=true")
  _, plain = _run_and_params("twx_coin_csa", src, str(tmp_path / "plain"), 1, pen,
                             "optim.pack_rows=false")
  assert not _equal(packed["params"], _params(os.path.join(src, "sft")))
  for a, b in zip(_leaves(packed["params"]), _leaves(plain["params"]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  lines = {d: _perf_lines(tmp_path / d) for d in ("packed", "plain")}
  assert lines["packed"][0]["rollout/env_steps"] == lines["plain"][0]["rollout/env_steps"]
  # (Rows of this tiny budget fill most of it, so packing may save nothing here;
  # tests/test_data.py shows the saving.)
  assert (lines["packed"][0]["perf/train_pad_frac"]
          <= lines["plain"][0]["perf/train_pad_frac"] < 1)
  for recs in lines.values():
    _check_perf_lines(recs)
