"""A study's registered tests and curve summaries (studies/confirm.py): the paired t-test's
p (against scipy's values, computed offline), Holm's adjustment (worked by hand), the
curve's area and the interactions to a target, and one page from synthetic runs."""

import json
import math

import pytest

from studies import confirm
from studies.runs import Episode, Run


def test_paired_t_p_matches_scipy():
  # scipy.stats.ttest_1samp(x, 0).pvalue, computed outside the project's environment.
  assert confirm.paired_t_p([1, 2, 3, 4, 5]) == pytest.approx(0.01323559956368269, rel=1e-9)
  assert confirm.paired_t_p([0.02, -0.01, 0.05, 0.03]) == pytest.approx(0.16967992890125827,
                                                                         rel=1e-9)
  assert math.isnan(confirm.paired_t_p([0.3]))
  assert confirm.paired_t_p([0.0, 0.0]) == 1.0


def test_holm_steps_down_and_stays_monotone():
  # Sorted p 0.01, 0.02, 0.04, 0.30 with m = 4: 0.04, 0.06, 0.08, 0.30.
  assert confirm.holm([0.04, 0.01, 0.30, 0.02]) == pytest.approx([0.08, 0.04, 0.30, 0.06])
  # A later (larger) p whose product is smaller cannot undercut an earlier adjusted one:
  # sorted 0.2, 0.25: 2 * 0.2 = 0.4, then max(0.4, 1 * 0.25) = 0.4.
  assert confirm.holm([0.25, 0.2]) == pytest.approx([0.4, 0.4])
  out = confirm.holm([float("nan"), 0.01])
  assert math.isnan(out[0]) and out[1] == pytest.approx(0.01)


def test_curve_mean_and_interactions_to_a_target():
  pts = [(0.0, 0.4), (100.0, 0.6), (300.0, 0.6)]
  # (100 * 0.5 + 200 * 0.6) / 300
  assert confirm.curve_mean(pts) == pytest.approx(170 / 300)
  assert confirm.to_reach(pts, 0.5) == pytest.approx(50.0)
  assert confirm.to_reach(pts, 0.4) == 0.0
  assert confirm.to_reach(pts, 0.7) == math.inf


def _run(method, seed, successes, steps_per_eval=100, oracle=None, auc=(0.5, 0.5),
         at=(0, 8, 16)):
  """An RL run evaluated at steps `at` on tasks 0-3 (sampled), final at the last; `auc`: the
  decisive-step AUC logged at the other two (and the Spearman, 0.5 below it)."""
  episodes, steps = {}, {}
  for i, (step, wins) in enumerate(zip(at, successes)):
    episodes[("eval_sampled", step)] = {("test", k): Episode(int(k < wins), 5, 0.0)
                                        for k in range(4)}
    steps[step] = {"perf/env_steps_total": float(i * steps_per_eval),
                   "eval_sampled/success": wins / 4}
  for step, a in zip(at[1:], auc):
    steps[step] |= {"credit/decisive_auc": a, "credit/spearman": a - 0.5}
  steps[at[-1]] |= {"eval_oracle/prob": oracle if oracle is not None else successes[-1] / 4,
                    "eval/success": 0.5}
  episodes[("eval", at[-1])] = {("test", k): Episode(int(k < 2), 5, 0.0) for k in range(4)}
  config = {"env": {"kwargs": {"horizon": 4}},
            "provenance": {"git_commit": "abc123def4567", "git_dirty": seed == 1}}
  return Run(f"{method}_seed{seed}", method, seed, config, steps, "fam", episodes)


def test_page_pairs_by_seed_and_flags_unclean_trees():
  runs = [_run("grpo", s, (1, 2, 2), auc=(0.7, 0.8)) for s in range(3)]
  runs += [_run("csa", s, (1, 2, 3 + (s == 2)), auc=(0.6, 0.6 + 0.1 * s))  # +1 or +2 tasks
           for s in range(3)]
  tests = {"families": [{"name": "main", "metric": "sampled_success",
                         "comparisons": [["csa", "grpo", 4]]}]}
  page = confirm.build(runs, tests)
  # Differences 0.25, 0.25, 0.5: mean 0.333; every seed positive.
  row = next(line for line in page.splitlines() if line.startswith("| csa - grpo"))
  assert "| 4 | 3 | +0.333 [" in row and "| 3:0 |" in row
  assert "| fam/csa_seed1 | abc123def456 | UNCLEAN |" in page
  assert "| fam/grpo_seed0 | abc123def456 | clean |" in page
  # The credit criterion: the decisive AUC (and Spearman) averaged over iterations, paired
  # with GRPO's (CSA 0.6, 0.65, 0.7 against 0.75: differences -0.15, -0.10, -0.05).
  table = [line for line in page.splitlines() if line.startswith("| horizon | method")][-1]
  csa = next(line for line in page.splitlines() if line.startswith("| 4 | csa | 3 |"))
  for name, mean in (("decisive_auc", "0.650 ["), ("credit_spearman", "0.150 [")):
    cell = csa.split(" | ")[table.split(" | ").index(name)]
    assert cell.startswith(mean) and "vs GRPO -0.100 [" in cell, (name, cell)


def test_a_study_beside_another_pairs_within_each_and_names_their_iterations(tmp_path):
  mine = [_run("grpo", s, (1, 2, 2)) for s in range(2)]
  mine += [_run("csa", s, (1, 2, 3)) for s in range(2)]  # +1 task each seed: +0.25
  # The other study's runs stop at iteration 8.
  theirs = [_run("grpo", s, (1, 1, 1), at=(0, 4, 8)) for s in range(3)]
  theirs += [_run("csa", s, (1, 1, 1 + s), at=(0, 4, 8)) for s in range(3)]  # 0, +.25, +.5
  spec = {"study": "other", "this": "matched", "that": "fixed", "metric": "sampled_success",
          "comparisons": [["csa", "grpo"]]}
  lines = confirm.beside_lines(mine, (spec, theirs))
  assert lines[0] == "## Beside `other`: matched and fixed (sampled_success)"
  head = next(line for line in lines if line.startswith("| comparison"))
  assert head.split(" | ")[2:6] == ["matched: seeds", "matched: iterations",
                                    "matched: difference", "matched: +:-"]
  row = next(line for line in lines if line.startswith("| csa - grpo | 4 |"))
  # Mine: +0.25 on both seeds. Theirs: 0, +0.25, +0.5, mean 0.25, SD 0.25, t(2) = 4.303:
  # half-width 4.303 * 0.25 / sqrt(3) = 0.621.
  assert row.split(" | ")[2:] == ["2", "16", "+0.250 [+0.250, +0.250]", "2:0", "3", "8",
                                  "+0.250 [-0.371, +0.871]", "2:0 |"]
  # A named study must exist; its file must say what it compares.
  study = tmp_path / "mine"
  study.mkdir()
  (study / confirm.BESIDE_FILE).write_text(json.dumps(spec))
  with pytest.raises(SystemExit, match="names the study 'other', whose runs"):
    confirm.read_beside(str(study))
  (study / confirm.BESIDE_FILE).write_text(json.dumps({"study": "other"}))
  with pytest.raises(SystemExit, match="missing comparisons, metric, that, this"):
    confirm.read_beside(str(study))
  assert confirm.read_beside(str(tmp_path)) is None


def test_interactions_to_the_target_count_the_seeds_that_never_reached_it():
  # Two seeds reached it (100 and 300 interactions), one never did, one has no curve. Mean
  # 200, SD 141.4, t(1) = 12.706: 200 -+ 1270.6, cut at 0 (interactions are not negative).
  assert confirm._reached_cell([100.0, math.inf, 300.0, math.nan]) == "200 [0, 1471] (2/3 reached)"
  assert confirm._reached_cell([math.inf, math.inf]) == "(0/2 reached)"
  assert confirm._reached_cell([math.nan]) == ""
