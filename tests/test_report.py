"""The study report against an independent NumPy computation on a synthetic sweep."""

import csv
import json
import math
import os

import numpy as np
import pytest

from studies import confirm, plots, report, runs
from tests.test_stats import sign_p_ref, wilson_ref

SEEDS = (0, 1, 2)
METHODS = ("csa_dapo", "grpo", "csa")  # out of order on purpose; one name with "_"
ITERS, EVAL_EVERY = 6, 2
T975 = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 15: 2.1314495456,
        30: 2.0422725}


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
  (reports / "study" / "commands.txt").write_text("python -m studies.sweep --name study\n")
  (reports / "study" / "notes.md").write_text("CSA does not separate from GRPO here.\n")
  report.main(["--name", "study", "--reports-dir", str(reports)])
  with open(reports / "study" / "summary.csv") as f:
    rows = {r["method"]: r for r in csv.DictReader(f)}
  return reports, lines, rows


def _final(lines, key):
  out = {}
  for l in lines:
    out |= l if l["step"] == lines[-1]["step"] else {}
  return out[key]


RATE, DIFF = (0.0, 1.0), (-1.0, 1.0)


def _ci(x, bounds):
  """mean +- t * sd / sqrt(n) with the tabulated t quantile, cut to the parameter space."""
  x = np.asarray(x, np.float64)
  h = T975[len(x) - 1] * x.std(ddof=1) / math.sqrt(len(x))
  return x.mean(), max(x.mean() - h, bounds[0]), min(x.mean() + h, bounds[1])


def _check(row, prefix, x, bounds):
  m, lo, hi = _ci(x, bounds)
  assert float(row[f"{prefix}_mean"]) == pytest.approx(m, abs=1e-6)
  assert float(row[f"{prefix}_ci_low"]) == pytest.approx(lo, abs=1e-6)
  assert float(row[f"{prefix}_ci_high"]) == pytest.approx(hi, abs=1e-6)


def test_order_methods():
  assert runs.order_methods({"zeta", "csa", "grpo", "alpha", "rloo", "sft"}) == \
      ["grpo", "rloo", "csa", "alpha", "zeta"]


def test_columns_and_row_order(study):
  reports, _, rows = study
  with open(reports / "study" / "summary.csv") as f:
    header = f.readline().strip().split(",")
  assert header[:12] == ["method", "horizon", "seeds", "sampled_success_mean",
                         "sampled_success_ci_low",
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
  _check(rows["sft"], "sampled_success", [final[("sft", s)] for s in SEEDS], RATE)
  assert rows["sft"]["delta_vs_sft_mean"] == "" and rows["sft"]["delta_vs_grpo_mean"] == ""
  for m in METHODS:
    assert rows[m]["seeds"] == "3"  # the unfinished csa_seed3 is not counted
    _check(rows[m], "sampled_success", [final[(m, s)] for s in SEEDS], RATE)
    _check(rows[m], "greedy_success", [greedy[(m, s)] for s in SEEDS], RATE)
    _check(rows[m], "delta_vs_sft", [final[(m, s)] - final[("sft", s)] for s in SEEDS], DIFF)
    _check(rows[m], "greedy_delta_vs_sft",
           [greedy[(m, s)] - greedy[("sft", s)] for s in SEEDS], DIFF)
    if m != "grpo":
      _check(rows[m], "delta_vs_grpo", [final[(m, s)] - final[("grpo", s)] for s in SEEDS],
             DIFF)
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
           [np.nanmean([l["credit/spearman"] for l in its[s]]) for s in SEEDS], DIFF)
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
    return runs.Run(f"grpo_seed{seed}", "grpo", seed, {}, steps)
  x, m, lo, hi = plots.learning_curve([run(0, (10, 20, 30), (0.5, 0.6, 0.7)),
                                       run(1, (12, 22, 34), (0.7, 0.6, 0.9))], {0: 0.4, 1: 0.6})
  np.testing.assert_allclose(x, [0, 11, 21, 32])
  np.testing.assert_allclose(m, [0.5, 0.6, 0.6, 0.8])
  half = np.array([T975[1] * 0.1, T975[1] * 0.1, 0.0, T975[1] * 0.1])
  # The band is cut to [0, 1], where a success rate lives.
  np.testing.assert_allclose(hi, np.minimum(m + half, 1.0), atol=1e-6)
  np.testing.assert_allclose(lo, np.maximum(m - half, 0.0), atol=1e-6)


def test_plots_and_markdown(study):
  reports, _, rows = study
  for png in plots.PLOTS:
    path = reports / "study" / png
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  md = (reports / "study.md").read_text()
  assert "python -m studies.sweep --name study" in md
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
  names = [os.path.join("study", p) for p in ("summary.csv",) + plots.PLOTS] + ["study.md"]
  before = {n: (reports / n).read_bytes() for n in names}
  report.write_report(str(reports), "study")
  assert {n: (reports / n).read_bytes() for n in names} == before



def test_committed_quickstart_upper_bound_stays_at_1():
  """The committed quickstart's CSA row once read 1.004; any committed summary is now in
  its parameter space."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports")
  for name in ("quickstart", "coin_doors", "coin_doors_algos"):
    with open(os.path.join(root, name, "summary.csv")) as f:
      for row in csv.DictReader(f):
        for col, v in row.items():
          if v and col.startswith(("sampled_success_", "greedy_success_")):
            assert 0.0 <= float(v) <= 1.0, (name, row["method"], col, v)
          if v and col.startswith(("delta_", "greedy_delta_", "task_delta_")) and \
              not col.endswith(("_seeds", "_tasks", "_wins", "_losses", "_sign_p")):
            assert -1.0 <= float(v) <= 1.0, (name, row["method"], col, v)


# ----------------------------------------------------------------------------- episodes


def _ep(step, policy, index, success, split="test", length=5, ret=None):
  return {"step": step, "policy": policy, "split": split, "index": index, "success": success,
          "length": length, "return": float(success) if ret is None else ret}


def test_parse_episodes_keys_and_conflicts():
  lines = [_ep(0, "eval_sampled", 0, 1), _ep(0, "eval_sampled", 1, 0), _ep(3, "eval", 0, 0)]
  ev = runs.parse_episodes(lines + [lines[0]])  # a resumed run's repeat is the same outcome
  assert sorted(ev) == [("eval", 3), ("eval_sampled", 0)]
  assert ev[("eval_sampled", 0)][("test", 0)] == runs.Episode(1, 5, 1.0)
  with pytest.raises(ValueError, match="two different outcomes"):
    runs.parse_episodes(lines + [_ep(0, "eval_sampled", 0, 0)])
  with pytest.raises(ValueError, match="0 or 1"):
    runs.parse_episodes([_ep(0, "eval", 0, 2)])
  with pytest.raises(ValueError, match="needs step, policy"):
    runs.parse_episodes([{"step": 0, "policy": "eval", "index": 0, "success": 1}])


def test_pairing_needs_the_same_tasks(tmp_path):
  a = runs.parse_episodes([_ep(5, "eval_sampled", i, 1) for i in range(4)]
                       + [_ep(0, "eval_sampled", i, 0) for i in range(4)])
  b = runs.parse_episodes([_ep(5, "eval_sampled", i, 0) for i in range(1, 5)])
  with pytest.raises(ValueError, match=r"different tasks \(4 and 4; 1 only in the first, e.g. "
                                       r"\[\('test', 0\)\], 1 only in the second"):
    runs.pair_outcomes(a[("eval_sampled", 5)], b[("eval_sampled", 5)], "csa_seed0 vs grpo_seed0")
  # Same indices on another split are other tasks.
  c = runs.parse_episodes([_ep(5, "eval_sampled", i, 0, split="dev") for i in range(4)])
  with pytest.raises(ValueError, match="different tasks"):
    runs.pair_outcomes(a[("eval_sampled", 5)], c[("eval_sampled", 5)], "x")
  # The loading helper: an RL run's final step against its own step 0.
  for name, lines in (("a", [_ep(5, "eval_sampled", i, int(i < 3)) for i in range(4)]
                       + [_ep(0, "eval_sampled", i, int(i == 0)) for i in range(4)]),
                      ("b", [_ep(5, "eval_sampled", i, 0) for i in range(1, 5)])):
    (tmp_path / name / "eval").mkdir(parents=True)
    (tmp_path / name / runs.EPISODES_FILE).write_text("".join(json.dumps(l) + "\n" for l in lines))
  assert runs.load_pair(str(tmp_path / "a"), 5, str(tmp_path / "a"), 0) == [
      (("test", 0), 1, 1), (("test", 1), 1, 0), (("test", 2), 1, 0), (("test", 3), 0, 0)]
  with pytest.raises(ValueError, match="different tasks"):
    runs.load_pair(str(tmp_path / "a"), 5, str(tmp_path / "b"), 5)
  with pytest.raises(ValueError, match="no eval_sampled evaluation at step 3"):
    runs.load_pair(str(tmp_path / "a"), 3, str(tmp_path / "a"), 0)
  assert runs.load_episodes(str(tmp_path / "none")) is None


def _task_ref(seeds):
  """NumPy: a seeds x tasks matrix of differences (NaN where a seed did not run a task),
  its per-task nanmean, the mean and t-interval over tasks (cut to [-1, 1]), and the
  discordant pairs."""
  tasks = sorted({t for pairs in seeds for t, _, _ in pairs})
  d = np.full((len(seeds), len(tasks)), np.nan)
  for i, pairs in enumerate(seeds):
    for t, a, b in pairs:
      d[i, tasks.index(t)] = a - b
  m, lo, hi = _ci(np.nanmean(d, 0), DIFF)
  return len(tasks), m, lo, hi, int(np.sum(d == 1)), int(np.sum(d == -1))


def test_task_paired_against_numpy():
  rng = np.random.default_rng(3)
  seeds = []
  for first in (0, 0, 6):  # two seeds on tasks 0-9, one on 6-15: 16 tasks, 4 shared by 3
    a, b = rng.integers(0, 2, 10), rng.integers(0, 2, 10)
    seeds.append([(("test", first + i), int(a[i]), int(b[i])) for i in range(10)])
  out = runs.task_paired(seeds)
  n, m, lo, hi, wins, losses = _task_ref(seeds)
  assert (out["seeds"], out["tasks"], out["wins"], out["losses"]) == (3, n, wins, losses)
  assert (out["mean"], out["ci_low"], out["ci_high"]) == pytest.approx((m, lo, hi), abs=1e-9)
  assert out["sign_p"] == pytest.approx(sign_p_ref(wins, losses), rel=1e-12)
  # One seed, every task the same outcome: a zero-width interval and p = 1.
  same = runs.task_paired([[(("test", i), 1, 1) for i in range(5)]])
  assert (same["mean"], same["ci_low"], same["ci_high"], same["sign_p"]) == (0, 0, 0, 1.0)


def test_episodes_must_agree_with_metrics():
  eps = runs.parse_episodes([_ep(0, "eval_sampled", i, int(i < 1)) for i in range(4)])
  run = runs.Run("sft_seed0", "sft", 0, {}, {0: {"eval_sampled/success": 0.5}}, "", eps)
  with pytest.raises(ValueError, match="success 0.5 in metrics.jsonl but 1 of 4"):
    runs.final_rate(run, "eval_sampled")
  run.steps[0]["eval_sampled/success"] = 0.25
  assert runs.final_rate(run, "eval_sampled") == (0.25, 4.0, "episodes")


def test_without_episodes_the_report_uses_metrics(study):
  reports, lines, rows = study
  with open(reports / "study" / "per_run.csv") as f:
    per_run = {r["run"]: r for r in csv.DictReader(f)}
  assert list(per_run)[:4] == ["sft_seed0", "sft_seed1", "sft_seed2", "grpo_seed0"]
  r = per_run["csa_seed1"]
  assert r["source"] == "metrics" and r["sampled_episodes"] == "50"
  p = _final(lines[("csa", 1)], "eval_sampled/success")
  ref = wilson_ref(p * 50, 50)
  assert float(r["sampled_success"]) == pytest.approx(p, abs=1e-8)
  assert (float(r["sampled_wilson_low"]), float(r["sampled_wilson_high"])) == \
      pytest.approx(ref, abs=1e-7)
  for m in METHODS:
    assert rows[m]["task_delta_vs_sft_mean"] == "" and rows[m]["horizon"] == ""
  assert not (reports / "study" / plots.HORIZON_PLOT).exists()
  assert "per task" not in (reports / "study.md").read_text()


# ----------------------------------------------------------------------------- horizon study


HZ = {"keydoor_h4": 4, "keydoor_h16": 16}  # family -> horizon
HZ_METHODS = ("csa_state", "grpo")
HZ_SEEDS = (0, 1)
N_TASKS = 12


def _hz_tasks(seed):
  """Seed 1's held-out tasks start later: tasks 4-11 are run by both seeds."""
  return [("test", 4 * seed + i) for i in range(N_TASKS)]


def _hz_episodes(rng, seed, p):
  return {t: (int(rng.random() < p), int(rng.integers(3, 30)), float(rng.normal()))
          for t in _hz_tasks(seed)}


def _hz_eval(prefix, eps):
  return {f"{prefix}/success": float(np.mean([e[0] for e in eps.values()])),
          f"{prefix}/episodes": float(len(eps)),
          f"{prefix}/episode_len": float(np.mean([e[1] for e in eps.values()])),
          f"{prefix}/invalid_action_frac": 0.05}


def _hz_rl_lines(rng, evals, auc=(0.95, 1.0)):
  """Iterations 1-4 with an evaluation at 2, and the final evaluation's second line."""
  lines, steps = [], 0
  for it in range(1, 5):
    steps += int(rng.integers(150, 250))
    m = {"step": it, "perf/env_steps_total": float(steps),
         "perf/rollout_s": float(rng.uniform(1, 2)), "perf/adv_s": float(rng.uniform(0, 0.2)),
         "perf/update_s": float(rng.uniform(1, 2)), "perf/batch_s": 0.1,
         "perf/iteration_s": float(rng.uniform(3, 6)),
         "rollout/success": float(rng.uniform(0, 1)),
         "rollout/episode_len": float(rng.uniform(4, 40)),
         "credit/spearman": float(rng.uniform(-1, 1)),
         # NaN once (an iteration without a -1 step), as the trainer writes it.
         "credit/decisive_auc": float("nan") if it == 3 else float(rng.uniform(*auc))}
    if it in evals and it < 4:
      m |= _hz_eval("eval", evals[it]["eval"]) | _hz_eval("eval_sampled",
                                                          evals[it]["eval_sampled"])
    lines.append(m)
  lines.append({"step": 4, "perf/env_steps_total": float(steps)}
               | _hz_eval("eval", evals[4]["eval"])
               | _hz_eval("eval_sampled", evals[4]["eval_sampled"]))
  return lines


def _hz_write(d, cfg, lines, evals, done=True):
  _write_run(d.parent, d.name, cfg, lines, done)
  (d / "eval").mkdir()
  with open(d / runs.EPISODES_FILE, "w") as f:
    for step, by_policy in sorted(evals.items()):
      for policy, eps in by_policy.items():
        for (split, index), (s, l, r) in eps.items():
          f.write(json.dumps({"step": step, "policy": policy, "split": split, "index": index,
                              "success": s, "length": l, "return": r}) + "\n")


@pytest.fixture(scope="module")
def horizon_study(tmp_path_factory):
  """reports/hz/runs/FAMILY/RUN: two horizons x (SFT, grpo, csa_state) x two seeds, every
  run with its episodes (an RL run's file also holds its SFT start's step-0 lines)."""
  rng = np.random.default_rng(11)
  reports = tmp_path_factory.mktemp("h") / "reports"
  data = {}
  for family, h in HZ.items():
    for s in HZ_SEEDS:
      cfg = lambda name: {"name": name, "seed": s, "rl_iterations": 4, "rl_env_steps": 800,
                          "rollout": {"tasks_per_iter": 4, "group_size": 8},
                          "eval": {"num_episodes": N_TASKS, "first_task": 4 * s},
                          "env": {"name": "keydoor", "kwargs": {"horizon": h}}}
      sft = {0: {p: _hz_episodes(rng, s, 0.4) for p in ("eval", "eval_sampled")}}
      sft_lines = [{"step": 0, "sft/nll": 0.5},
                   {"step": 0, "perf/env_steps_total": 0.0} | _hz_eval("eval", sft[0]["eval"])
                   | _hz_eval("eval_sampled", sft[0]["eval_sampled"])]
      _hz_write(reports / "hz" / "runs" / family / f"sft_seed{s}", cfg(f"sft_seed{s}"),
                sft_lines, sft)
      data[(family, "sft", s)] = (sft_lines, sft)
      for m, p in zip(HZ_METHODS, (0.7, 0.55)):
        evals = {0: sft[0]} | {it: {q: _hz_episodes(rng, s, p) for q in ("eval", "eval_sampled")}
                               for it in (2, 4)}
        # Seeds far apart: two seeds' t-interval on the AUC reaches past 0 and 1.
        lines = _hz_rl_lines(rng, evals, auc=(0.95, 1.0) if s == 0 else (0.55, 0.6))
        _hz_write(reports / "hz" / "runs" / family / f"{m}_seed{s}", cfg(f"{m}_seed{s}"),
                  lines, evals)
        data[(family, m, s)] = (lines, evals)
  # An unfinished run with a perfect score, so that counting it would show.
  bad = {it: {q: {t: (1, 3, 1.0) for t in _hz_tasks(2)} for q in ("eval", "eval_sampled")}
         for it in (0, 2, 4)}
  _hz_write(reports / "hz" / "runs" / "keydoor_h16" / "csa_state_seed2",
            {"env": {"kwargs": {"horizon": 16}}}, _hz_rl_lines(rng, bad), bad, done=False)
  (reports / "hz" / "notes.md").write_text("Predictions first.\n")
  report.main(["--name", "hz", "--reports-dir", str(reports)])
  with open(reports / "hz" / "summary.csv") as f:
    rows = list(csv.DictReader(f))
  return reports, data, rows


def _hz_rate(evals, step, policy="eval_sampled"):
  return np.mean([e[0] for e in evals[step][policy].values()])


def _hz_pairs(a, b):
  """One seed's (task, a, b) from two {task: (success, ...)} dicts with the same tasks."""
  assert set(a) == set(b)
  return [(t, a[t][0], b[t][0]) for t in sorted(a)]


def test_horizon_summary_shape(horizon_study):
  reports, _, rows = horizon_study
  with open(reports / "hz" / "summary.csv") as f:
    header = next(csv.reader(f))
  assert header == list(report.CSV_COLUMNS)
  for col in ("horizon", "task_delta_vs_sft_mean", "task_delta_vs_grpo_sign_p",
              "decisive_auc_ci_high", "iteration_s_mean", "adv_frac_of_iteration_mean",
              "rollout_episode_len_mean", "delta_vs_grpo_ci_high"):
    assert col in header
  assert [(r["method"], r["horizon"], r["family"], r["seeds"]) for r in rows] == [
      (m, h, f, "2") for f, h in (("keydoor_h4", "4"), ("keydoor_h16", "16"))
      for m in ("sft", "grpo", "csa_state")]  # the unfinished csa_state_seed2 not counted


def test_horizon_paired_deltas_within_a_horizon(horizon_study):
  _, data, rows = horizon_study
  by = {(r["method"], r["horizon"]): r for r in rows}
  for family, h in HZ.items():
    rate = {(m, s): _hz_rate(data[(family, m, s)][1], 0 if m == "sft" else 4)
            for m in ("sft",) + HZ_METHODS for s in HZ_SEEDS}
    for m in HZ_METHODS:
      row = by[(m, str(h))]
      _check(row, "sampled_success", [rate[(m, s)] for s in HZ_SEEDS], RATE)
      _check(row, "delta_vs_sft", [rate[(m, s)] - rate[("sft", s)] for s in HZ_SEEDS], DIFF)
      _check(row, "delta_vs_grpo", [rate[(m, s)] - rate[("grpo", s)] for s in HZ_SEEDS], DIFF)
      greedy = [_hz_rate(data[(family, m, s)][1], 4, "eval")
                - _hz_rate(data[(family, "sft", s)][1], 0, "eval") for s in HZ_SEEDS]
      _check(row, "greedy_delta_vs_sft", greedy, DIFF)
      # Per task: against the run's own step 0, and against GRPO of the same seed.
      for ref, pairs in (
          ("sft", [_hz_pairs(data[(family, m, s)][1][4]["eval_sampled"],
                             data[(family, m, s)][1][0]["eval_sampled"]) for s in HZ_SEEDS]),
          ("grpo", [_hz_pairs(data[(family, m, s)][1][4]["eval_sampled"],
                              data[(family, "grpo", s)][1][4]["eval_sampled"])
                    for s in HZ_SEEDS])):
        n, mean, lo, hi, wins, losses = _task_ref(pairs)
        k = f"task_delta_vs_{ref}"
        assert (row[f"{k}_seeds"], row[f"{k}_tasks"], row[f"{k}_wins"], row[f"{k}_losses"]) \
            == ("2", str(n), str(wins), str(losses))
        assert n == 16  # seed 0 ran tasks 0-11, seed 1 tasks 4-15
        assert [float(row[f"{k}_{c}"]) for c in ("mean", "ci_low", "ci_high")] == \
            pytest.approx([mean, lo, hi], abs=1e-7)
        assert float(row[f"{k}_sign_p"]) == pytest.approx(sign_p_ref(wins, losses), rel=1e-7)
    assert by[("grpo", str(h))]["task_delta_vs_grpo_mean"] == "0"


def test_horizon_credit_length_and_cost(horizon_study):
  _, data, rows = horizon_study
  by = {(r["method"], r["horizon"]): r for r in rows}
  for family, h in HZ.items():
    for m in HZ_METHODS:
      row = by[(m, str(h))]
      its = {s: [l for l in data[(family, m, s)][0] if "perf/iteration_s" in l] for s in HZ_SEEDS}
      auc = [np.nanmean([l["credit/decisive_auc"] for l in its[s]]) for s in HZ_SEEDS]
      m_, lo, hi = _ci(auc, RATE)
      assert (lo, hi) == (0.0, 1.0)  # the t-interval reaches past both ends: cut there
      assert [float(row[f"decisive_auc_{c}"]) for c in ("mean", "ci_low", "ci_high")] == \
          pytest.approx([m_, lo, hi], abs=1e-7)
      it_s = np.mean([np.mean([l["perf/iteration_s"] for l in its[s]]) for s in HZ_SEEDS])
      share = np.mean([sum(l["perf/adv_s"] for l in its[s])
                       / sum(l["perf/iteration_s"] for l in its[s]) for s in HZ_SEEDS])
      length = np.mean([np.mean([l["rollout/episode_len"] for l in its[s]]) for s in HZ_SEEDS])
      assert float(row["iteration_s_mean"]) == pytest.approx(it_s, rel=1e-7)
      assert float(row["adv_frac_of_iteration_mean"]) == pytest.approx(share, rel=1e-7)
      assert float(row["rollout_episode_len_mean"]) == pytest.approx(length, rel=1e-7)


def test_horizon_per_run_wilson(horizon_study):
  reports, data, _ = horizon_study
  with open(reports / "hz" / "per_run.csv") as f:
    per_run = list(csv.DictReader(f))
  assert [r["run"] for r in per_run[:3]] == ["keydoor_h4/sft_seed0", "keydoor_h4/sft_seed1",
                                             "keydoor_h4/grpo_seed0"]
  for r in per_run:
    evals = data[(r["family"], r["method"], int(r["seed"]))][1]
    eps = evals[max(evals)]["eval_sampled"]
    k = sum(e[0] for e in eps.values())
    assert r["source"] == "episodes" and r["sampled_episodes"] == str(N_TASKS)
    assert r["horizon"] == str(HZ[r["family"]])
    assert (float(r["sampled_wilson_low"]), float(r["sampled_wilson_high"])) == \
        pytest.approx(wilson_ref(k, N_TASKS), abs=1e-7)


def test_horizon_page_and_plots(horizon_study):
  reports, _, _ = horizon_study
  md = (reports / "hz.md").read_text()
  assert "| group | run | finished seeds |" in md and "| horizon 16 | csa_state | 0, 1 |" in md
  assert "Unfinished runs ignored: 1 (keydoor_h16/csa_state_seed2)." in md
  assert "| method | horizon | seeds |" in md and "vs GRPO per task" in md
  assert "decisive AUC" in md and "- RL environment-step budget (rl_env_steps): 800" in md
  assert "- per-episode outcomes (eval/episodes.jsonl): 12 of 12 runs" in md
  assert f"![difference to GRPO against the horizon](hz/{plots.HORIZON_PLOT})" in md
  for png in plots.PLOTS + (plots.HORIZON_PLOT,):
    assert (reports / "hz" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert str(reports) not in md


def test_horizon_regeneration_is_byte_for_byte(horizon_study, tmp_path):
  """Regenerating in place, or from a copy elsewhere, writes the same bytes."""
  import shutil
  reports, _, _ = horizon_study
  names = [os.path.join("hz", p) for p in ("summary.csv", "per_run.csv") + plots.PLOTS
           + (plots.HORIZON_PLOT,)] + ["hz.md"]
  before = {n: (reports / n).read_bytes() for n in names}
  report.write_report(str(reports), "hz")
  assert {n: (reports / n).read_bytes() for n in names} == before
  copy = tmp_path / "elsewhere"
  shutil.copytree(reports, copy)
  for n in names:
    (copy / n).unlink()
  report.write_report(str(copy), "hz")
  assert {n: (copy / n).read_bytes() for n in names} == before


def test_a_study_beside_itself_shows_the_same_differences_twice(horizon_study, tmp_path):
  import shutil
  reports, _, _ = horizon_study
  copy = tmp_path / "r"
  shutil.copytree(reports, copy)
  (copy / "hz" / confirm.TESTS_FILE).write_text(json.dumps({"families": []}))
  (copy / "hz" / confirm.BESIDE_FILE).write_text(json.dumps(
      {"study": "hz", "this": "here", "that": "there", "metric": "sampled_success",
       "comparisons": [["csa_state", "grpo"]]}))
  report.write_report(str(copy), "hz")
  md = (copy / "hz.md").read_text()
  assert "### Beside `hz`: here and there (sampled_success)" in md
  rows = [l.split(" | ") for l in md.splitlines() if l.startswith("| csa_state - grpo | ")]
  assert [r[1] for r in rows] == ["4", "16"]
  for r in rows:
    assert r[2:6] == r[6:9] + [r[9].removesuffix(" |")] and r[2] != "0"
  assert (copy / "hz" / plots.BESIDE_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert f"({'hz'}/{plots.BESIDE_PLOT})" in md


def test_a_run_whose_start_ran_other_tasks_is_an_error(horizon_study, tmp_path):
  import shutil
  reports, _, _ = horizon_study
  copy = tmp_path / "r"
  shutil.copytree(reports, copy)
  path = copy / "hz" / "runs" / "keydoor_h4" / "grpo_seed0" / runs.EPISODES_FILE
  lines = [json.loads(l) for l in path.read_text().splitlines()]
  for l in lines:
    if l["step"] == 0:
      l["index"] += 100  # a start evaluated on other tasks
  path.write_text("".join(json.dumps(l) + "\n" for l in lines))
  with pytest.raises(ValueError, match="keydoor_h4/grpo_seed0 vs its SFT start: the two "
                                       "evaluations ran different tasks"):
    report.write_report(str(copy), "hz")


def test_one_family_layout_gives_the_same_rows(horizon_study, tmp_path):
  """The horizon-4 family's runs moved to runs/RUN/ (a single-family study with episodes,
  as the quickstart on the new testbed will be) give that horizon's rows, family blank."""
  import shutil
  reports, _, rows = horizon_study
  src = reports / "hz" / "runs" / "keydoor_h4"
  shutil.copytree(src, tmp_path / "reports" / "one" / "runs")
  report.write_report(str(tmp_path / "reports"), "one")
  with open(tmp_path / "reports" / "one" / "summary.csv") as f:
    one = list(csv.DictReader(f))
  expected = [r | {"family": ""} for r in rows if r["family"] == "keydoor_h4"]
  assert one == expected
  assert (tmp_path / "reports" / "one" / plots.HORIZON_PLOT).exists()  # one horizon, one tick


# ----------------------------------------------------------------------------- prompted row


def test_prompted_row_is_a_reference_against_the_sft_start(tmp_path):
  """prompted_seed<k> (launch.py --prompted: one step-0 evaluation) leads the table, before
  the SFT start; its "vs SFT" pairs it with its seed's SFT start, by seed and per task; it
  has no GRPO delta and its config (no RL settings) does not enter the budget lines."""
  rng = np.random.default_rng(5)
  reports = tmp_path / "reports"
  root = reports / "pr" / "runs"
  cfg = lambda name, s, its: {"name": name, "seed": s, "rl_iterations": its,
                              "rollout": {"tasks_per_iter": 4, "group_size": 8},
                              "eval": {"num_episodes": N_TASKS, "first_task": 0},
                              "env": {"name": "keydoor", "kwargs": {"horizon": 4}}}
  evals = {}
  for s in HZ_SEEDS:
    for m, p in (("prompted", 0.1), ("sft", 0.4)):
      ev = {0: {q: _hz_episodes(rng, 0, p) for q in ("eval", "eval_sampled")}}
      lines = [{"step": 0, "perf/env_steps_total": 0.0} | _hz_eval("eval", ev[0]["eval"])
               | _hz_eval("eval_sampled", ev[0]["eval_sampled"])]
      _hz_write(root / f"{m}_seed{s}", cfg(f"{m}_seed{s}", s, 1000 if m == "prompted" else 0),
                lines, ev)
      evals[(m, s)] = ev
    ev = {0: evals[("sft", s)][0]} | {it: {q: _hz_episodes(rng, 0, 0.6)
                                          for q in ("eval", "eval_sampled")} for it in (2, 4)}
    _hz_write(root / f"grpo_seed{s}", cfg(f"grpo_seed{s}", s, 4), _hz_rl_lines(rng, ev), ev)
  report.main(["--name", "pr", "--reports-dir", str(reports)])
  with open(reports / "pr" / "summary.csv") as f:
    rows = {r["method"]: r for r in csv.DictReader(f)}
  assert list(rows) == ["prompted", "sft", "grpo"]
  pr = rows["prompted"]
  deltas = [_hz_rate(evals[("prompted", s)], 0) - _hz_rate(evals[("sft", s)], 0)
            for s in HZ_SEEDS]
  _check(pr, "delta_vs_sft", deltas, (-1, 1))
  pairs = [_hz_pairs(evals[("prompted", s)][0]["eval_sampled"],
                     evals[("sft", s)][0]["eval_sampled"]) for s in HZ_SEEDS]
  per_task = np.mean([[a - b for _, a, b in p] for p in pairs], 0)  # the same 12 tasks
  assert int(pr["task_delta_vs_sft_tasks"]) == len(per_task)
  assert float(pr["task_delta_vs_sft_mean"]) == pytest.approx(per_task.mean(), abs=1e-7)
  wins, losses = (sum(a > b for p in pairs for _, a, b in p),
                  sum(a < b for p in pairs for _, a, b in p))
  assert (int(pr["task_delta_vs_sft_wins"]), int(pr["task_delta_vs_sft_losses"])) == \
      (wins, losses)
  assert pr["delta_vs_grpo_mean"] == "" and pr["credit_spearman_mean"] == ""
  page = (reports / "pr.md").read_text()
  assert report.PROMPTED_TEXT in page
  assert "RL iterations per run: 4," in page  # the prompted runs' 1000 left out
  inventory = page[page.index("## Runs"):page.index("## Results")]
  assert inventory.index("| prompted |") < inventory.index("| sft |") < inventory.index("| grpo |")
