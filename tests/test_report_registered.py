"""A study report with registered tests, intermediate evaluations and run provenance
(studies/report.py with studies/confirm.py), on a synthetic study the test writes: the
code commit and unclean-tree flag of every run, the evaluation schedule, the Holm-corrected
family and the area under the held-out curve against NumPy on the written episodes, and
byte-for-byte regeneration of every text file."""

import csv
import json

import numpy as np
import pytest

from studies import confirm, plots, report, runs

SEEDS = (0, 1, 2)
ITERS, EVERY = 20, 8
N_TASKS, N_EVERY = 16, 8  # the final and start evaluations, the intermediate ones
STEPS_PER_ITER = 160
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FAMILY = "km_h4"
TESTS = {"families": [{"name": "Family 1", "metric": "sampled_success",
                       "comparisons": [["csa", "grpo", 4], ["grpo", "sft", 4]]}]}


def _episodes(rng, p, n):
  return {i: int(rng.random() < p) for i in range(n)}


def _rate(eps):
  return float(np.mean(list(eps.values())))


def _write(d, cfg, lines, evals):
  d.mkdir(parents=True)
  (d / "config.json").write_text(json.dumps(cfg))
  (d / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  (d / "eval").mkdir()
  with open(d / runs.EPISODES_FILE, "w") as f:
    for (policy, step), eps in sorted(evals.items()):
      for i, s in eps.items():
        f.write(json.dumps({"step": step, "policy": policy, "split": "test", "index": i,
                            "success": s, "length": 5, "return": float(s)}) + "\n")
  (d / "DONE").write_text("")


def _cfg(name, seed, provenance):
  cfg = {"name": name, "seed": seed, "rl_iterations": ITERS,
         "rollout": {"tasks_per_iter": 4, "group_size": 8},
         "eval": {"num_episodes": N_TASKS, "every": EVERY, "every_episodes": N_EVERY},
         "env": {"name": "keydoor", "kwargs": {"horizon": 4}}}
  return cfg | ({"provenance": provenance} if provenance else {})


def _eval_line(step, evals, policy):
  return {"step": step, f"{policy}/success": _rate(evals[(policy, step)]),
          f"{policy}/episodes": float(len(evals[(policy, step)])),
          f"{policy}/episode_len": 5.0, f"{policy}/invalid_action_frac": 0.0}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  """reports/reg/runs/km_h4/: SFT starts without provenance, GRPO and CSA runs at one
  commit, CSA seed 2 from an unclean tree; evaluations at 0 (16 tasks), 8 and 16 (the
  first 8 tasks, sampled) and 20 (16 tasks, sampled and greedy)."""
  rng = np.random.default_rng(5)
  reports = tmp_path_factory.mktemp("reg") / "reports"
  base = reports / "reg" / "runs" / FAMILY
  written = {}
  for s in SEEDS:
    start = {(p, 0): _episodes(rng, 0.4, N_TASKS) for p in ("eval", "eval_sampled")}
    lines = [{"step": 0, "perf/env_steps_total": 0.0} | _eval_line(0, start, "eval")
             | _eval_line(0, start, "eval_sampled")]
    _write(base / f"sft_seed{s}", _cfg(f"sft_seed{s}", s, None), lines, start)
    written[("sft", s)] = start
    for method, p in (("grpo", 0.5), ("csa", 0.6 + 0.1 * s)):
      evals = dict(start)
      lines = []
      for it in range(1, ITERS + 1):
        m = {"step": it, "perf/env_steps_total": float(it * STEPS_PER_ITER),
             "rollout/success": 0.5, "eval_oracle/prob": p}
        if it % EVERY == 0:
          evals[("eval_sampled", it)] = _episodes(rng, p, N_EVERY)
          m |= _eval_line(it, evals, "eval_sampled")
        lines.append(m)
      for policy in ("eval", "eval_sampled"):
        evals[(policy, ITERS)] = _episodes(rng, p, N_TASKS)
      lines.append({"step": ITERS, "perf/env_steps_total": float(ITERS * STEPS_PER_ITER)}
                   | _eval_line(ITERS, evals, "eval") | _eval_line(ITERS, evals, "eval_sampled"))
      prov = {"git_commit": COMMIT, "git_dirty": method == "csa" and s == 2}
      _write(base / f"{method}_seed{s}", _cfg(f"{method}_seed{s}", s, prov), lines, evals)
      written[(method, s)] = evals
  (reports / "reg" / "tests.json").write_text(json.dumps(TESTS))
  (reports / "reg" / "notes.md").write_text("Predictions first.\n")
  paths = report.write_report(str(reports), "reg")
  return reports, written, paths


def _page(reports):
  return (reports / "reg.md").read_text()


def test_every_run_names_its_commit_and_unclean_trees_are_flagged(study):
  reports, _, _ = study
  with open(reports / "reg" / "per_run.csv") as f:
    rows = {r["run"]: r for r in csv.DictReader(f)}
  assert (rows[f"{FAMILY}/sft_seed0"]["commit"], rows[f"{FAMILY}/sft_seed0"]["tree"]) == (
      "", "unknown")
  assert rows[f"{FAMILY}/grpo_seed1"]["commit"] == COMMIT[:12]
  assert [r for r, v in rows.items() if v["tree"] == "UNCLEAN"] == [f"{FAMILY}/csa_seed2"]
  assert ("- code commit (each run's in `per_run.csv`): `0123456789ab` (6 runs); not recorded "
          "by 3 runs (written before runs recorded it); **from an unclean tree: "
          f"{FAMILY}/csa seed 2 (1 run)**") in _page(reports)


def test_the_evaluation_schedule_is_on_the_page(study):
  reports, _, _ = study
  # Evaluations at 0, 8, 16 and 20: the longest stretch is 8 iterations.
  assert ("- held-out evaluations during RL: every 8 iterations, 8 episodes each; the most "
          "iterations between two evaluations of a run: 8; the held-out curves are over the tasks "
          "every evaluation of a run ran") in _page(reports)
  run = runs.Run("x_seed0", "x", 0, {}, {0: {"eval/success": 0.1}, 3: {"eval/success": 0.2},
                                         5: {}, 10: {"eval_sampled/success": 0.3}, 12: {}})
  assert report.eval_gap(run) == 7


def test_registered_family_is_holm_corrected_on_the_page(study):
  reports, written, _ = study
  final = lambda m, s: _rate(written[(m, s)][("eval_sampled", ITERS if m != "sft" else 0)])
  d1 = [final("csa", s) - final("grpo", s) for s in SEEDS]
  d2 = [final("grpo", s) - final("sft", s) for s in SEEDS]
  p1, p2 = confirm.paired_t_p(d1), confirm.paired_t_p(d2)
  lo, hi = sorted((p1, p2))  # Holm with two tests: 2 * the smaller, then max(that, larger)
  adj = {lo: min(1.0, 2 * lo), hi: max(min(1.0, 2 * lo), hi)}
  page = _page(reports)
  assert "## Registered tests and sample efficiency" in page
  assert "### Family 1 (sampled_success)" in page
  row = next(l for l in page.splitlines() if l.startswith("| csa - grpo | 4 | 3 |"))
  assert row.endswith(f"| {confirm._p(p1)} | {confirm._p(adj[p1])} |")
  assert f"{np.mean(d1):+.3f} [" in row
  assert "this study registered none" not in page
  assert "Holm-corrected under \"Registered tests\"" in page


def test_area_under_the_held_out_curve_against_numpy(study):
  reports, written, _ = study
  areas = []
  for s in SEEDS:
    ev = written[("csa", s)]
    xs = [0, 8, 16, 20]
    # The tasks every evaluation ran (the first 8), the SFT start at 0 interactions.
    ys = [np.mean([ev[("eval_sampled", x)][i] for i in range(N_EVERY)]) for x in xs]
    xi = np.array(xs, np.float64) * STEPS_PER_ITER
    areas.append(np.trapezoid(ys, xi) / (xi[-1] - xi[0]))
  page = _page(reports)
  row = next(l for l in page.splitlines() if l.startswith("| 4 | csa | 3 |"))
  assert f"| {np.mean(areas):.3f} [" in row  # the curve_mean cell, after the right-key cell
  assert " reached) |" in row


def test_confirm_page_is_written_with_the_report_and_regenerates(study, tmp_path):
  reports, _, paths = study
  out = reports / "reg" / confirm.CONFIRM_FILE
  assert str(out) in paths
  assert out.read_text() == confirm.page(str(reports), "reg")
  assert f"| {FAMILY}/csa_seed2 | {COMMIT[:12]} | UNCLEAN |" in out.read_text()
  before = {p: open(p, "rb").read() for p in paths}
  assert report.write_report(str(reports), "reg") == paths
  assert {p: open(p, "rb").read() for p in paths} == before


def test_per_task_tests_are_labelled_secondary(study):
  page = _page(study[0])
  assert "Secondary: they count (seed, task) pairs as independent" in page
  assert "| vs SFT per task |" in page


def test_learning_curve_is_over_the_tasks_every_evaluation_ran(study):
  reports, written, _ = study
  loaded, _ = runs.load_runs(str(reports / "reg" / "runs"))
  by = lambda m: [r for r in loaded if r.method == m]
  sft = {r.seed: 0.0 for r in by("sft")}  # unused where the task sets vary
  x, y, _, _ = plots.learning_curve(by("csa"), sft, sft_runs={r.seed: r for r in by("sft")})
  steps = (0, 8, 16, 20)
  want = np.mean([[np.mean([written[("csa", s)][("eval_sampled", t)][i] for i in range(N_EVERY)])
                   for t in steps] for s in SEEDS], axis=0)
  np.testing.assert_allclose(x, np.array(steps, np.float64) * STEPS_PER_ITER)
  np.testing.assert_allclose(y, want)
