"""Credit-accuracy metrics (csa_jax/credit.py) against SciPy and plain loops, the training
log's credit metrics, and the study command (studies/credit.py) end to end on a tiny run."""

import json
import os

import numpy as np
import pytest
import scipy.stats
from flax import nnx

from csa_jax import credit
from studies import credit as study
from studies import credit_report
from tests import tiny_runs


def _tied(rng, n, levels):
  return rng.integers(0, levels, n).astype(np.float64)


@pytest.mark.parametrize("levels", [3, 20, 10_000])
def test_ranks_and_spearman_match_scipy(levels):
  rng = np.random.default_rng(levels)
  for _ in range(20):
    a, b = _tied(rng, 200, levels), _tied(rng, 200, 4) + 0.3 * rng.normal(size=200).round(0)
    np.testing.assert_allclose(credit.average_ranks(a) + 1, scipy.stats.rankdata(a), rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(credit.spearman(a, b), scipy.stats.spearmanr(a, b).statistic,
                               rtol=0, atol=1e-12)


def test_spearman_nan_when_constant_or_too_short():
  assert np.isnan(credit.spearman(np.ones(10), np.arange(10)))
  assert np.isnan(credit.spearman(np.arange(10), np.zeros(10)))
  assert np.isnan(credit.spearman(np.arange(2), np.arange(2)))


def test_auc_matches_mann_whitney_and_pair_count():
  rng = np.random.default_rng(0)
  for _ in range(20):
    s = _tied(rng, 150, 7)
    pos = rng.random(150) < 0.3
    u = scipy.stats.mannwhitneyu(s[pos], s[~pos]).statistic
    expect = u / (pos.sum() * (~pos).sum())
    pairs = np.mean([(x > y) + 0.5 * (x == y) for x in s[pos] for y in s[~pos]])
    assert credit.auc(s, pos) == pytest.approx(expect, abs=1e-12)
    assert credit.auc(s, pos) == pytest.approx(pairs, abs=1e-12)
  assert np.isnan(credit.auc(np.arange(5.0), np.zeros(5, bool)))


def _pair_auc(pos, neg):
  return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def test_decisive_and_progress_auc_rank_different_pairs():
  """decisive_auc: label > 0 against < 0, zero labels left out; progress_auc: > 0 against
  <= 0. Counted pair by pair (ties half); routine steps that score above the decisive
  ones pull the progress AUC down and leave the decisive AUC alone."""
  rng = np.random.default_rng(3)
  adv = rng.normal(size=60).round(1)
  label = rng.choice([-1.0, 0.0, 1.0], size=60)
  assert credit.decisive_auc(adv, label) == pytest.approx(
      _pair_auc(adv[label > 0], adv[label < 0]), abs=1e-12)
  assert credit.progress_auc(adv, label) == pytest.approx(
      _pair_auc(adv[label > 0], adv[label <= 0]), abs=1e-12)
  label, adv = np.array([1.0, -1.0, 0.0, 0.0]), np.array([0.5, 0.0, 1.0, 1.0])
  assert credit.decisive_auc(adv, label) == 1.0
  assert credit.progress_auc(adv, label) == pytest.approx(1 / 3)
  assert np.isnan(credit.decisive_auc(adv, np.array([1.0, 0.0, 0.0, 0.0])))


def _spearman_reference(a, o):
  """Spearman's rho by its definition with average ranks, with plain Python loops."""
  def ranks(x):
    out = []
    for v in x:
      less = sum(1 for w in x if w < v)
      equal = sum(1 for w in x if w == v)
      out.append(less + (equal - 1) / 2.0)
    return np.array(out)
  ra, ro = ranks(list(a)), ranks(list(o))
  ra, ro = ra - ra.mean(), ro - ro.mean()
  return float((ra * ro).sum() / np.sqrt((ra ** 2).sum() * (ro ** 2).sum()))


def test_credit_accuracy_matches_reference_with_ties_and_masks():
  """The training log's credit metrics over the labelled steps that exist: Spearman and
  the decisive AUC by their definitions, masked steps and unlabelled ones left out."""
  rng = np.random.default_rng(0)
  adv = rng.normal(size=(3, 4, 6)).round(1)  # rounding makes ties
  oracle = rng.choice([-1.0, 0.0, 1.0, np.nan], size=(3, 4, 6))
  oracle[0, 0, :] = np.nan
  mask = rng.random((3, 4, 6)) < 0.8
  got = credit.credit_accuracy(adv, oracle, mask)
  sel = mask & np.isfinite(oracle)
  assert got["credit/labelled_steps"] == sel.sum()
  assert got["credit/spearman"] == pytest.approx(_spearman_reference(adv[sel], oracle[sel]),
                                                 abs=1e-12)
  assert got["credit/decisive_auc"] == pytest.approx(
      _pair_auc(adv[sel & (oracle > 0)], adv[sel & (oracle < 0)]), abs=1e-12)


def test_credit_accuracy_nan_without_labels_or_spread():
  adv = np.ones((1, 2, 3))
  none = credit.credit_accuracy(adv, np.full((1, 2, 3), np.nan), np.ones((1, 2, 3)))
  assert np.isnan(none["credit/spearman"]) and np.isnan(none["credit/decisive_auc"])
  assert np.isnan(credit.credit_accuracy(adv, np.arange(6.).reshape(1, 2, 3),
                                         np.ones((1, 2, 3)))["credit/spearman"])
  assert np.isnan(credit.credit_accuracy(adv, np.zeros((1, 2, 3)),
                                         np.ones((1, 2, 3)))["credit/decisive_auc"])


def _arrays(rng, b=6, g=4, t=7):
  mask = np.zeros((b, g, t), bool)
  for i in range(b):
    for j in range(g):
      mask[i, j, :rng.integers(1, t + 1)] = True
  oracle = np.where(rng.random((b, g, t)) < 0.8, rng.integers(-1, 2, (b, g, t)), np.nan)
  oracle = np.where(mask, oracle, 7.0)  # junk past the end: must be ignored
  won = rng.random((b, g)) < 0.5
  adv = rng.normal(size=(b, g, t)) + np.nan_to_num(oracle) * 0.5
  return adv, oracle, mask, won


def test_labelled_steps_and_point_metrics_match_a_loop():
  rng = np.random.default_rng(1)
  adv, oracle, mask, won = _arrays(rng)
  rows = []  # (adv, label, won) for every step that exists and has a label
  for i in range(mask.shape[0]):
    for j in range(mask.shape[1]):
      for k in range(mask.shape[2]):
        if mask[i, j, k] and not np.isnan(oracle[i, j, k]):
          rows.append((adv[i, j, k], oracle[i, j, k], won[i, j]))
  a, y, w = map(np.array, zip(*rows))
  m = credit.metric_values(credit.labelled_steps(adv, oracle, mask, won))
  assert m["spearman"] == pytest.approx(scipy.stats.spearmanr(a, y).statistic, abs=1e-12)
  assert m["spearman_won"] == pytest.approx(scipy.stats.spearmanr(a[w], y[w]).statistic, abs=1e-12)
  assert m["spearman_failed"] == pytest.approx(scipy.stats.spearmanr(a[~w], y[~w]).statistic,
                                               abs=1e-12)
  u = scipy.stats.mannwhitneyu(a[y > 0], a[y <= 0]).statistic
  assert m["progress_auc"] == pytest.approx(u / ((y > 0).sum() * (y <= 0).sum()), abs=1e-12)


def test_bootstrap_resamples_whole_groups():
  rng = np.random.default_rng(2)
  adv, oracle, mask, won = _arrays(rng)
  steps = credit.labelled_steps(adv, oracle, mask, won)
  got = credit.bootstrap_groups(steps, mask.shape[0], credit.metric_values, 30, seed=5)
  draws = np.random.default_rng(5)
  for boot in got:
    pick = draws.integers(0, mask.shape[0], mask.shape[0])
    a = np.concatenate([adv[b][mask[b] & ~np.isnan(oracle[b])] for b in pick])
    y = np.concatenate([oracle[b][mask[b] & ~np.isnan(oracle[b])] for b in pick])
    assert boot["spearman"] == pytest.approx(scipy.stats.spearmanr(a, y).statistic, abs=1e-12)
  vals = [b["spearman"] for b in got]
  lo, hi = credit.percentile_ci(vals)
  assert (lo, hi) == pytest.approx(tuple(np.percentile(vals, [2.5, 97.5])), abs=1e-12)


def test_credit_table_pairs_estimators_with_grpo():
  rng = np.random.default_rng(3)
  adv, oracle, mask, won = _arrays(rng)
  rows = credit.credit_table({"grpo": adv, "same": adv.copy(), "perfect": np.nan_to_num(oracle)},
                             oracle, mask, won, num_resamples=50)
  by = {(r["estimator"], r["metric"]): r for r in rows}
  same = by[("same", "spearman")]
  assert same["delta_vs_grpo"] == 0 and same["delta_lo"] == 0 and same["delta_hi"] == 0
  assert by[("perfect", "spearman")]["value"] == pytest.approx(1.0)
  assert by[("perfect", "progress_auc")]["value"] == pytest.approx(1.0)
  assert by[("grpo", "spearman")]["lo"] <= by[("grpo", "spearman")]["value"] <= by[("grpo", "spearman")]["hi"]
  assert "delta_vs_grpo" not in by[("grpo", "progress_auc")]


def test_study_estimators_decompose():
  """csa_step is CSA's step term: csa(lam=1) - csa(lam=0.5) = csa_step / 2 on active steps;
  gigpo - gigpo_step is constant within an episode (its episode term)."""
  from csa_jax.rollout.groups import GroupArrays
  rng = np.random.default_rng(4)
  b, g, t = 5, 6, 8
  mask = np.zeros((b, g, t), bool)
  for i in range(b):
    for j in range(g):
      mask[i, j, :rng.integers(1, t + 1)] = True
  won = (rng.random((b, g)) < 0.5).astype(np.float32)
  step_r = np.zeros((b, g, t), np.float32)
  last = mask.sum(-1) - 1
  step_r[np.arange(b)[:, None], np.arange(g)[None], last] = won
  arrays = GroupArrays(won, (rng.normal(size=(b, g, t)) * mask).astype(np.float32), mask, step_r,
                       rng.integers(0, 3, (b, g, t)).astype(np.int32),
                       np.full((b, g, t), np.nan, np.float32), np.ones((b, g, t), np.int32),
                       np.zeros((b, g, t), bool))
  from csa_jax.config import AlgoConfig, RolloutConfig
  import dataclasses
  advs = study.estimator_advantages(arrays, dataclasses.asdict(AlgoConfig()),
                                    dataclasses.asdict(RolloutConfig(max_turns=t)))
  assert set(advs) == set(study.ESTIMATORS)
  np.testing.assert_allclose((advs["csa_lam1"] - advs["csa_lam0.5"])[mask],
                             0.5 * advs["csa_step"][mask], atol=1e-5)
  assert np.abs(advs["csa_step"][mask]).max() > 0
  ep = np.where(mask, advs["gigpo"] - advs["gigpo_step"], np.nan)
  np.testing.assert_allclose(np.nanmax(ep, -1), np.nanmin(ep, -1), atol=1e-5)
  assert not np.any(advs["csa_step"][~mask])


def test_credit_command_end_to_end(tmp_path):
  """A tiny SFT + 1 RL iteration run; the study on both checkpoints; re-analysis; report."""
  run, _ = tiny_runs.quickstart_run()  # read only: the study writes under --out
  outs = []
  for which in ("sft", "rl"):
    out = str(tmp_path / f"study_{which}")
    assert study.main(["--env", "quickstart_coin", "--checkpoint", run, "--which", which,
                       "--groups", "3", "--group-size", "4", "--num-envs", "12",
                       "--resamples", "20", "--out", out]) == 0
    outs.append(out)
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["which"] == ("sft" if which == "sft" else "rl iteration 1")
    rows = study.read_csv(os.path.join(out, "results.csv"))
    assert {r["G"] for r in rows} == {4.0}  # G = 8 and 16 exceed the 4 collected
    assert {r["estimator"] for r in rows} == set(study.ESTIMATORS)
    assert len(rows) == len(study.ESTIMATORS) * len(credit.METRICS)
  with np.load(os.path.join(outs[0], "rollouts.npz")) as z:
    assert z["mask_BxGxT"].shape[:2] == (3, 4)
  before = open(os.path.join(outs[0], "results.csv")).read()
  assert study.main(["--analyze", outs[0], "--resamples", "20"]) == 0
  assert open(os.path.join(outs[0], "results.csv")).read() == before  # deterministic
  with pytest.raises(ValueError, match="environment"):
    study.main(["--env", "alfworld", "--checkpoint", run, "--groups", "1", "--group-size", "2",
                "--out", str(tmp_path / "x")])
  path = credit_report.write_report(outs, "credit_test", reports_dir=str(tmp_path / "reports"))
  text = open(path).read()
  assert "study_sft" in text and "study_rl" in text and "csa_step" in text
  for f in ("summary.csv", "metrics_G8.png", "vs_G.png", "runs/study_rl/meta.json"):
    assert os.path.exists(tmp_path / "reports" / "credit_test" / f)
  _check_entropy_by_position(run)
  _check_invalid_credit(outs[0], tmp_path)


def _check_invalid_credit(out, tmp_path):
  """studies.invalid_credit on the collected rollouts: one row per estimator, the invalid
  steps counted from the saved arrays, GRPO's difference to itself exactly 0, each
  difference inside its bootstrap interval."""
  import csv

  from studies import invalid_credit
  assert invalid_credit.main([out, "--name", "inv", "--reports-dir", str(tmp_path)]) == 0
  with open(tmp_path / "inv" / "invalid_steps.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["estimator"] for r in rows] == [*study.ESTIMATORS, "csa_state", "csa_state_step"]
  with np.load(os.path.join(out, "rollouts.npz")) as z:
    sel = z["mask_BxGxT"] & z["invalid_BxGxT"]
    won = z["rewards_BxG"] > 0
  for r in rows:
    assert float(r["n_all"]) == sel.sum()
    assert float(r["n_failed"]) == (sel & ~won[..., None]).sum()
    if sel.any():
      assert float(r["diff_lo"]) - 1e-9 <= float(r["diff_vs_grpo"]) <= float(r["diff_hi"]) + 1e-9
  grpo = rows[0]
  assert (grpo["diff_vs_grpo"], grpo["diff_lo"], grpo["diff_hi"]) == ("0", "0", "0")


def _check_entropy_by_position(run):
  """studies.entropy_by_position on the same tiny run: its per-position entropies equal a
  NumPy computation from the model's logits, and it prints both policies' positions."""
  import contextlib
  import io

  from studies import entropy_by_position as ebp
  from studies.credit import load_run

  _, tok, graphdef, params, _, _ = load_run(run, "rl")
  prompt, action = tok.encode("You see a coin. > take"), tok.encode(" coin") + [tok.eos_id]
  logits = np.asarray(nnx.merge(graphdef, params)(np.asarray([prompt + action[:-1]]))[0],
                      np.float64)[len(prompt) - 1:]
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  np.testing.assert_allclose(ebp.position_entropies(graphdef, params, prompt, action),
                             -(np.exp(logp) * logp).sum(-1), rtol=1e-4, atol=1e-5)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    ebp.main([run, "--tasks", "2"])
  lines = out.getvalue().splitlines()
  assert "4 episodes" in lines[0]
  assert [ln.split()[0] for ln in lines[1:]] == ["sft", "rl"] and all("pos 0:" in ln for ln in lines[1:])


def test_invalid_step_credit_counts_the_rejected_steps_by_outcome():
  """Catches the invalid flag, the padding mask or the outcome split read wrongly: checked
  against a loop over the steps."""
  from csa_jax.credit import invalid_step_credit
  rng = np.random.default_rng(3)
  adv = rng.normal(size=(5, 4, 6))
  mask = rng.random((5, 4, 6)) < 0.8
  invalid = rng.random((5, 4, 6)) < 0.3
  won = rng.random((5, 4)) < 0.5
  got = invalid_step_credit(adv, invalid, mask, won)
  for name, keep in (("failed", lambda w: not w), ("won", lambda w: w), ("all", lambda w: True)):
    vals = [adv[b, g, t] for b in range(5) for g in range(4) for t in range(6)
            if mask[b, g, t] and invalid[b, g, t] and keep(won[b, g])]
    assert got[f"n_{name}"] == len(vals) > 0
    assert got[f"mean_{name}"] == pytest.approx(np.mean(vals), rel=1e-12)
    assert got[f"pos_{name}"] == np.mean([v > 0 for v in vals])
  empty = invalid_step_credit(adv, np.zeros_like(invalid), mask, won)
  assert empty["n_all"] == 0 and np.isnan(empty["mean_all"]) and np.isnan(empty["pos_all"])
