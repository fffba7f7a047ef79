"""The study report against an independent NumPy computation on a synthetic sweep."""

import csv
import json
import math
import os

import numpy as np
import pytest

from experiments import report as R

SEEDS = (0, 1, 2)
METHODS = ("csa_dapo", "grpo", "csa")  # out of order on purpose; one name with "_"
ITERS, EVAL_EVERY = 6, 2
T975 = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 30: 2.0422725}


def _write_run(runs_dir, name, cfg, lines, done=True):
  d = runs_dir / name
  d.mkdir(parents=True)
  (d / "config.json").write_text(json.dumps(cfg))
  # json.dumps writes NaN as the bare token NaN, as the trainer's writer does.
  (d / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  if done:
    (d / "DONE").write_text("")


def _eval(prefix, rng):
  return {f"{prefix}/success": float(rng.uniform(0.3, 0.9)),
          f"{prefix}/episode_len": float(rng.uniform(4, 9)),
          f"{prefix}/invalid_action_frac": float(rng.uniform(0, 0.2)),
          f"{prefix}/episodes": 50.0}


def _cfg(name, seed, estimator):
  return {"name": name, "seed": seed, "algo": {"estimator": estimator, "lam": 0.5},
          "rl_iterations": ITERS, "rollout": {"tasks_per_iter": 4, "group_size": 8},
          "eval": {"num_episodes": 50}, "env": {"name": "twx", "kwargs": {"game": "coin"}}}


def _rl_lines(rng, nan_at=None):
  """The trainer's layout: one line per iteration, evaluations on some of them, and the
  final evaluation as a second line with the last step."""
  lines, steps = [], 0
  for it in range(1, ITERS + 1):
    steps += int(rng.integers(200, 260))
    m = {"step": it, "perf/env_steps_total": float(steps),
         "perf/rollout_s": float(rng.uniform(2, 4)), "perf/adv_s": float(rng.uniform(0, 0.1)),
         "perf/update_s": float(rng.uniform(1, 2)), "rollout/success": float(rng.uniform(0, 1)),
         "rollout/episode_len": 5.0, "rollout/invalid_action_frac": 0.0,
         "rollout/episodes": 32.0, "adv/mean": 0.0, "loss/pg": 0.1,
         "credit/spearman": float("nan") if it == nan_at else float(rng.uniform(-1, 1))}
    if it % EVAL_EVERY == 0 and it < ITERS:
      m |= _eval("eval", rng) | _eval("eval_sampled", rng)
    lines.append(m)
  lines.append({"step": ITERS, "perf/env_steps_total": float(steps)} |
               _eval("eval", rng) | _eval("eval_sampled", rng))
  return lines


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  """reports/study/runs with SFT starts and 3 methods x 3 seeds, one unfinished run."""
  rng = np.random.default_rng(7)
  reports = tmp_path_factory.mktemp("r") / "reports"
  runs_dir = reports / "study" / "runs"
  lines = {}
  for s in SEEDS:
    lines[("sft", s)] = [{"step": 0, "sft/nll": 0.5, "sft/rows": 100.0},
                         {"step": 0, "perf/env_steps_total": 0.0} |
                         _eval("eval", rng) | _eval("eval_sampled", rng)]
    _write_run(runs_dir, f"sft_seed{s}", _cfg(f"sft_seed{s}", s, "sft"), lines[("sft", s)])
    for m in METHODS:
      lines[(m, s)] = _rl_lines(rng, nan_at=3 if (m, s) == ("csa", 1) else None)
      _write_run(runs_dir, f"{m}_seed{s}", _cfg(f"{m}_seed{s}", s, m), lines[(m, s)])
  # An unfinished run with an extreme success, so that counting it would show.
  bad = _rl_lines(rng)
  bad[-1]["eval_sampled/success"] = 1.0
  _write_run(runs_dir, "csa_seed3", _cfg("csa_seed3", 3, "csa"), bad, done=False)
  (reports / "study" / "commands.txt").write_text("python -m experiments.sweep --name study\n")
  (reports / "study" / "notes.md").write_text("CSA does not separate from GRPO here.\n")
  R.main(["--name", "study", "--reports-dir", str(reports)])
  with open(reports / "study" / "summary.csv") as f:
    rows = {r["method"]: r for r in csv.DictReader(f)}
  return reports, lines, rows


def _final(lines, key):
  out = {}
  for l in lines:
    out |= l if l["step"] == lines[-1]["step"] else {}
  return out[key]


def _ci(x):
  """mean +- t * sd / sqrt(n) with the tabulated t quantile."""
  x = np.asarray(x, np.float64)
  h = T975[len(x) - 1] * x.std(ddof=1) / math.sqrt(len(x))
  return x.mean(), x.mean() - h, x.mean() + h


def _check(row, prefix, x):
  m, lo, hi = _ci(x)
  assert float(row[f"{prefix}_mean"]) == pytest.approx(m, abs=1e-6)
  assert float(row[f"{prefix}_ci_low"]) == pytest.approx(lo, abs=1e-6)
  assert float(row[f"{prefix}_ci_high"]) == pytest.approx(hi, abs=1e-6)


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_known_values(df):
  assert R.t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-6)
  assert R.t_quantile(0.025, df) == pytest.approx(-T975[df], abs=1e-6)


def test_mean_ci_one_value_has_no_interval():
  m, lo, hi = R.mean_ci([0.4, float("nan")])
  assert m == 0.4 and math.isnan(lo) and math.isnan(hi)


def test_order_methods():
  assert R.order_methods({"zeta", "csa", "grpo", "alpha", "rloo", "sft"}) == \
      ["grpo", "rloo", "csa", "alpha", "zeta"]


def test_columns_and_row_order(study):
  reports, _, rows = study
  with open(reports / "study" / "summary.csv") as f:
    header = f.readline().strip().split(",")
  assert header[:11] == ["method", "seeds", "sampled_success_mean", "sampled_success_ci_low",
                         "sampled_success_ci_high", "delta_vs_sft_mean", "delta_vs_sft_ci_low",
                         "delta_vs_sft_ci_high", "delta_vs_grpo_mean", "delta_vs_grpo_ci_low",
                         "delta_vs_grpo_ci_high"]
  assert list(rows) == ["sft", "grpo", "csa", "csa_dapo"]


def test_success_and_paired_deltas(study):
  _, lines, rows = study
  final = {(m, s): _final(lines[(m, s)], "eval_sampled/success")
           for m in ("sft",) + METHODS for s in SEEDS}
  greedy = {(m, s): _final(lines[(m, s)], "eval/success")
            for m in ("sft",) + METHODS for s in SEEDS}
  _check(rows["sft"], "sampled_success", [final[("sft", s)] for s in SEEDS])
  assert rows["sft"]["delta_vs_sft_mean"] == "" and rows["sft"]["delta_vs_grpo_mean"] == ""
  for m in METHODS:
    assert rows[m]["seeds"] == "3"  # the unfinished csa_seed3 is not counted
    _check(rows[m], "sampled_success", [final[(m, s)] for s in SEEDS])
    _check(rows[m], "greedy_success", [greedy[(m, s)] for s in SEEDS])
    _check(rows[m], "delta_vs_sft", [final[(m, s)] - final[("sft", s)] for s in SEEDS])
    _check(rows[m], "greedy_delta_vs_sft", [greedy[(m, s)] - greedy[("sft", s)] for s in SEEDS])
    if m != "grpo":
      _check(rows[m], "delta_vs_grpo", [final[(m, s)] - final[("grpo", s)] for s in SEEDS])
    length = np.mean([_final(lines[(m, s)], "eval_sampled/episode_len") for s in SEEDS])
    assert float(rows[m]["sampled_episode_len_mean"]) == pytest.approx(length, abs=1e-6)
  assert [float(rows["grpo"][f"delta_vs_grpo_{k}"]) for k in ("mean", "ci_low", "ci_high")] \
      == [0.0, 0.0, 0.0]


def test_credit_and_wall_time(study):
  _, lines, rows = study
  for m in METHODS:
    its = {s: [l for l in lines[(m, s)] if "perf/rollout_s" in l] for s in SEEDS}
    # Per run: mean over the finite values (csa seed 1 has a NaN), then over seeds.
    _check(rows[m], "credit_spearman",
           [np.nanmean([l["credit/spearman"] for l in its[s]]) for s in SEEDS])
    tot = {s: np.array([l["perf/rollout_s"] + l["perf/adv_s"] + l["perf/update_s"]
                        for l in its[s]]) for s in SEEDS}
    adv = {s: np.array([l["perf/adv_s"] for l in its[s]]) for s in SEEDS}
    assert float(rows[m]["wall_s_per_iter_mean"]) == pytest.approx(
        np.mean([tot[s].mean() for s in SEEDS]), rel=1e-6)
    assert float(rows[m]["adv_share_mean"]) == pytest.approx(
        np.mean([adv[s].sum() / tot[s].sum() for s in SEEDS]), rel=1e-6)
  assert np.isfinite(float(rows["csa"]["credit_spearman_mean"]))


def test_learning_curve_aligns_iterations():
  """Evaluations at iterations 2, 4, 6 of two seeds: x is the mean env-step count."""
  def run(seed, xs, ys):
    steps = {i: {"perf/env_steps_total": x, "eval_sampled/success": y}
             for i, x, y in zip((2, 4, 6), xs, ys)}
    return R.Run(f"grpo_seed{seed}", "grpo", seed, {}, steps)
  x, m, lo, hi = R.learning_curve([run(0, (10, 20, 30), (0.5, 0.6, 0.7)),
                                   run(1, (12, 22, 34), (0.7, 0.6, 0.9))], {0: 0.4, 1: 0.6})
  np.testing.assert_allclose(x, [0, 11, 21, 32])
  np.testing.assert_allclose(m, [0.5, 0.6, 0.6, 0.8])
  np.testing.assert_allclose(hi - m, [T975[1] * 0.1, T975[1] * 0.1, 0.0, T975[1] * 0.1],
                             atol=1e-6)


def test_plots_and_markdown(study):
  reports, _, rows = study
  for png in R.PLOTS:
    path = reports / "study" / png
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  md = (reports / "study.md").read_text()
  assert "python -m experiments.sweep --name study" in md
  assert "## Verdict and notes\n\nCSA does not separate from GRPO here.\n" in md
  assert "Unfinished runs ignored: 1 (csa_seed3)." in md
  assert "![held-out success vs env interactions](study/learning_curves.png)" in md
  r = rows["csa"]
  cell = (f"{float(r['sampled_success_mean']):.3f} [{float(r['sampled_success_ci_low']):.2f}, "
          f"{float(r['sampled_success_ci_high']):.2f}]")
  assert f"| csa | 3 | {cell} |" in md
  assert "| grpo | 3 |" in md and "0.000 [0.00, 0.00]" in md
  assert str(reports) not in md  # relative paths only


def test_regenerating_gives_identical_files(study):
  reports, _, _ = study
  names = [os.path.join("study", p) for p in ("summary.csv",) + R.PLOTS] + ["study.md"]
  before = {n: (reports / n).read_bytes() for n in names}
  R.write_report(str(reports), "study")
  assert {n: (reports / n).read_bytes() for n in names} == before
