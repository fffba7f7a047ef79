"""A study's pre-registered tests and its learning-curve summaries, beside its report.

    python -m studies.confirm --name NAME [--reports-dir reports]

Reads `reports/NAME/runs/` (as `studies.report` does) and `reports/NAME/tests.json`, the
study's registered families of paired comparisons, committed with its predictions:

    {"families": [{"name": "...", "metric": "sampled_success",
                   "comparisons": [["csa", "grpo", 4], ...]}]}

(method A, method B, horizon; `null` for a study without horizons). Writes
`reports/NAME/confirm.md` (`python -m studies.report` writes it too, with the study's page,
which shows the same tables but the last):

- per family, each comparison A - B paired by seed (the same SFT start): the mean with its
  95% Student-t interval over seeds, the seeds of each sign, the two-sided paired t-test's
  p and its Holm-adjusted p within the family (familywise error 0.05);
- per (horizon, method), seed-level intervals of the exploratory summaries: the final
  sampled and greedy success, the right-key probability (`eval_oracle/prob`, where runs
  computed it), the sample-efficiency summary (the area under the held-out sampled curve
  over the tasks every evaluation shares, divided by the interactions it spans: the run's
  average held-out success) and the interactions to reach its SFT start + 10 points, the credit criterion (the means over
  iterations of the training rollouts' `credit/decisive_auc` and `credit/spearman`), the
  train-step means of the decisive and routine rows (`rows/`, where logged), and the same
  paired against GRPO;
- every run's code commit and whether its tree was unclean;
- where the study names another one in `reports/NAME/beside.json` (the same comparisons run
  under another protocol), each of its comparisons at every horizon both studies ran,
  paired by seed within each study, the two studies side by side with their RL iterations:

    {"study": "horizon", "this": "matched updates", "that": "fixed interactions",
     "metric": "sampled_success", "comparisons": [["grpo", "sft"], ["csa", "grpo"]]}

Metrics a comparison can name: `sampled_success`, `greedy_success` (final evaluation),
`right_prob`, `curve_mean`, `decisive_auc`, `credit_spearman`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from studies.runs import (SAMPLED, SFT, Run, final_rate, load_runs, order_methods,
                          over_iterations, run_commit)
from studies.stats import DIFF, NAN, RATE, mean_ci, paired_deltas, t_cdf

TESTS_FILE = "tests.json"
BESIDE_FILE = "beside.json"
CONFIRM_FILE = "confirm.md"
GAIN = 0.10  # "interactions to reach the SFT start + 10 points"
ROW_KEYS = ("decisive_pg_grad_norm", "routine_pg_grad_norm", "decisive_entropy",
            "routine_entropy", "decisive_abs_adv", "routine_abs_adv")


# ----------------------------------------------------------------------------- statistics


def paired_t_p(diffs: Sequence[float]) -> float:
  """Two-sided p of the one-sample t-test of mean 0 (NaN below 2 values; 0 differences
  of zero spread: p = 1 at mean 0, else 0)."""
  x = np.asarray([d for d in diffs if np.isfinite(d)], np.float64)
  if len(x) < 2:
    return NAN
  sd = float(x.std(ddof=1))
  if sd == 0:
    return 1.0 if float(x.mean()) == 0 else 0.0
  t = float(x.mean()) / (sd / math.sqrt(len(x)))
  return min(1.0, 2 * (1 - t_cdf(abs(t), len(x) - 1)))


def holm(p: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values (NaN stays NaN and does not count)."""
  idx = sorted((i for i, v in enumerate(p) if np.isfinite(v)), key=lambda i: p[i])
  m, out, running = len(idx), [NAN] * len(p), 0.0
  for rank, i in enumerate(idx):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out


# ----------------------------------------------------------------------------- per run


def curve_by_step(run: Run, sft: Run | None) -> dict[int, tuple[float, float]]:
  """Step -> (interactions, held-out sampled success) at every evaluation, over the tasks
  every evaluation of the run ran, the SFT start at step 0 and 0 interactions (from the
  run's episodes file, else its SFT run's); empty without episodes."""
  if run.episodes is None:
    return {}
  evals = {step: ep for (policy, step), ep in run.episodes.items() if policy == SAMPLED}
  if 0 not in evals and sft is not None and sft.episodes is not None:
    evals[0] = sft.episodes.get((SAMPLED, 0), {})
  tasks = set.intersection(*(set(e) for e in evals.values())) if evals else set()
  out = {}
  for step in sorted(evals):
    x = 0.0 if step == 0 else run.steps.get(step, {}).get("perf/env_steps_total", NAN)
    if tasks and np.isfinite(x):
      out[step] = (float(x), float(np.mean([evals[step][k].success for k in tasks])))
  return out


def curve(run: Run, sft: Run | None) -> list[tuple[float, float]]:
  """`curve_by_step`'s points in order."""
  return list(curve_by_step(run, sft).values())


def curve_mean(points: list[tuple[float, float]]) -> float:
  """Area under the curve (trapezoids) over the interactions it spans."""
  if len(points) < 2:
    return NAN
  x, y = np.array(points).T
  return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def to_reach(points: list[tuple[float, float]], target: float) -> float:
  """Interactions where the curve first reaches `target` (linear between evaluations);
  inf when it never does."""
  for (x0, y0), (x1, y1) in zip(points, points[1:]):
    if y1 >= target:
      return x0 if y0 >= target else x0 + (target - y0) / (y1 - y0) * (x1 - x0)
  return math.inf


def run_values(run: Run, sft: Run | None) -> dict[str, float]:
  pts = curve(run, sft)
  start = pts[0][1] if pts else NAN
  its = [m for s, m in run.steps.items() if s > 0]
  out = {"sampled_success": final_rate(run, SAMPLED)[0],
         "greedy_success": final_rate(run, "eval")[0],
         "right_prob": run.final.get("eval_oracle/prob", NAN),
         "curve_mean": curve_mean(pts),
         "to_sft_plus_10": to_reach(pts, start + GAIN) if len(pts) > 1 else NAN,
         "decisive_auc": over_iterations(run, "credit/decisive_auc"),
         "credit_spearman": over_iterations(run, "credit/spearman")}
  for k in ROW_KEYS:
    vals = [m[f"rows/{k}"] for m in its if f"rows/{k}" in m]
    out[k] = float(np.mean(vals)) if vals else NAN
  return out


# ----------------------------------------------------------------------------- the page


# In [0, 1]
RATES = ("sampled_success", "greedy_success", "right_prob", "curve_mean", "decisive_auc")
POSITIVE = (0.0, math.inf)  # interactions, norms, entropies, |advantage|


def _bounds(metric: str, difference: bool) -> tuple[float, float] | None:
  """Where the metric (or a difference of it) can lie, to cut its interval to."""
  if metric in RATES:
    return DIFF if difference else RATE
  if metric == "credit_spearman":
    return None if difference else (-1.0, 1.0)
  return None if difference else POSITIVE


def _ci(values: Sequence[float], digits: int = 3, signed: bool = True,
        bounds: tuple[float, float] | None = None) -> str:
  """`mean [low, high]` over the finite values; a sign on differences only."""
  m, lo, hi = mean_ci([v for v in values if np.isfinite(v)], bounds=bounds)
  if not np.isfinite(m):
    return ""
  f = f"{'+' if signed else ''}.{digits}f"
  return f"{m:{f}} [{lo:{f}}, {hi:{f}}]" if np.isfinite(lo) else f"{m:{f}}"


def _p(p: float) -> str:
  return "" if not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
          *["| " + " | ".join(r) + " |" for r in rows]]


def _values(runs: list[Run]) -> tuple[dict, dict]:
  """Runs and `run_values` by (horizon, method) and seed."""
  by: dict[tuple[Any, str], dict[int, Run]] = {}
  for r in runs:
    by.setdefault((r.horizon, r.method), {})[r.seed] = r
  values = {k: {s: run_values(r, by.get((k[0], SFT), {}).get(s)) for s, r in rs.items()}
            for k, rs in by.items()}
  return by, values


INTRO = ("Paired by seed (each pair shares its SFT start). Headline: mean difference over "
         "seeds with its 95% Student-t interval; p: two-sided paired t-test over seeds; "
         "Holm: adjusted within the family (familywise error 0.05).")
EXPLORATORY = ("greedy_success: the final held-out success with greedy actions; "
               "curve_mean: the area under the held-out sampled curve (the tasks every "
               "evaluation ran, the SFT start at 0) over the interactions it spans; "
               "to_sft_plus_10: interactions until the curve first reaches its start + 10 "
               "points (inf: never; its interval is over the seeds that reached it); "
               "decisive_auc, credit_spearman: the training rollouts' decisive-step AUC and "
               "the rank correlation of step advantages with the oracle labels (the credit "
               "criterion), means over iterations; rows: "
               "the train-step means over iterations of the decisive and routine rows. "
               "Intervals are cut to the values a quantity can take.")


def family_lines(values: dict, fam: dict[str, Any], heading: str = "##") -> list[str]:
  """One registered family: each comparison paired by seed, its p and Holm-adjusted p."""
  rows, ps = [], []
  for a, b, h in fam["comparisons"]:
    va = {s: v[fam["metric"]] for s, v in values.get((h, a), {}).items()}
    vb = {s: v[fam["metric"]] for s, v in values.get((h, b), {}).items()}
    d = paired_deltas(va, vb)
    ps.append(paired_t_p(d))
    rows.append([f"{a} - {b}", "" if h is None else str(h), str(len(d)),
                 _ci(d, bounds=_bounds(fam["metric"], True)),
                 f"{sum(x > 0 for x in d)}:{sum(x < 0 for x in d)}"])
  for r, p, adj in zip(rows, ps, holm(ps)):
    r += [_p(p), _p(adj)]
  return [f"{heading} {fam['name']} ({fam['metric']})", "",
          *_table(["comparison", "horizon", "seeds", "difference", "+:-", "p", "Holm p"],
                  rows), ""]


def _reached_cell(values: list[float]) -> str:
  """Interactions to the target over the seeds that reached it, and how many did (of the
  seeds with a curve: inf is a seed that never reached it, NaN one without a curve)."""
  got = [v for v in values if not math.isnan(v)]
  reached = sum(v != math.inf for v in got)
  cell = _ci([v for v in got if v != math.inf], 0, signed=False, bounds=POSITIVE)
  return f"{cell} ({reached}/{len(got)} reached)".lstrip() if got else ""


def exploratory_lines(by: dict, values: dict, heading: str = "##") -> list[str]:
  """Per (horizon, method) the exploratory summaries with seed-level intervals, and each
  method's paired difference to GRPO."""
  metrics = ("sampled_success", "greedy_success", "right_prob", "curve_mean", "to_sft_plus_10",
             "decisive_auc", "credit_spearman", *ROW_KEYS)
  lines = [f"{heading} Exploratory: per method, and paired against GRPO", "", EXPLORATORY, ""]
  rows = []
  for h in sorted({k[0] for k in by}, key=lambda v: (v is not None, v or 0)):
    methods = [m for m in [SFT] + order_methods({k[1] for k in by if k[0] == h})
               if (h, m) in values]
    for m in methods:
      v = values[(h, m)]
      cells = []
      for k in metrics:
        if k == "to_sft_plus_10":
          cells.append(_reached_cell([x[k] for x in v.values()]))
          continue
        cell = _ci([x[k] for x in v.values() if np.isfinite(x[k])], signed=False,
                   bounds=_bounds(k, False))
        g = values.get((h, "grpo"))
        if g and m not in ("grpo", SFT):
          d = paired_deltas({s: x[k] for s, x in v.items()}, {s: x[k] for s, x in g.items()})
          cell += f"; vs GRPO {_ci(d, bounds=_bounds(k, True))}" if d else ""
        cells.append(cell)
      rows.append(["" if h is None else str(h), m, str(len(v))] + cells)
  return lines + _table(["horizon", "method", "seeds", *metrics], rows) + [""]


def _iterations(runs: dict[int, Run]) -> str:
  """The RL iterations of a set of runs: one number, or their range."""
  its = sorted({max(r.steps) for r in runs.values() if r.steps})
  return "" if not its else str(its[0]) if len(its) == 1 else f"{its[0]}-{its[-1]}"


Beside = tuple[dict[str, Any], list[Run]]  # beside.json and the named study's runs


def beside_deltas(runs: list[Run], beside: Beside
                  ) -> list[tuple[str, str, Any, list[tuple[list[float], dict[int, Run]]]]]:
  """Per comparison A - B of `beside.json` and horizon both studies ran: (A, B, horizon,
  [this study's, the other's (paired differences by seed, A's runs by seed)])."""
  spec, other = beside
  metric = spec["metric"]
  studies = [_values(runs), _values(other)]
  horizons = set.intersection(*({k[0] for k in by} for by, _ in studies))
  out = []
  for a, b in spec["comparisons"]:
    for h in sorted(horizons, key=lambda v: (v is not None, v or 0)):
      out.append((a, b, h, [
          (paired_deltas({s: v[metric] for s, v in values.get((h, a), {}).items()},
                         {s: v[metric] for s, v in values.get((h, b), {}).items()}),
           by.get((h, a), {})) for by, values in studies]))
  return out


def beside_lines(runs: list[Run], beside: Beside, heading: str = "##") -> list[str]:
  """`beside.json`'s comparisons in this study and in the one it names, side by side: per
  horizon both ran, each paired by seed within its own study."""
  spec = beside[0]
  rows = []
  for a, b, h, studies in beside_deltas(runs, beside):
    row = [f"{a} - {b}", "" if h is None else str(h)]
    for d, a_runs in studies:
      row += [str(len(d)), _iterations(a_runs), _ci(d, bounds=_bounds(spec["metric"], True)),
              f"{sum(x > 0 for x in d)}:{sum(x < 0 for x in d)}"]
    rows.append(row)
  this, that = spec["this"], f"{spec['that']} (`{spec['study']}`)"
  head = ["comparison", "horizon"] + [f"{study}: {col}" for study in (this, that)
                                      for col in ("seeds", "iterations", "difference", "+:-")]
  return [f"{heading} Beside `{spec['study']}`: {this} and {spec['that']} ({spec['metric']})",
          "", "Each difference is paired by seed within its own study (the two studies' starts "
          "differ); intervals are 95% Student-t over seeds, per comparison: exploratory.", "",
          *_table(head, rows), ""]


def commit_lines(runs: list[Run]) -> list[str]:
  prov = [[r.label, *run_commit(r)]
          for r in sorted(runs, key=lambda r: (r.family, r.method, r.seed))]
  return ["## Code commit of every run", "", *_table(["run", "commit", "tree"], prov)]


def summary_lines(runs: list[Run], tests: dict[str, Any], heading: str = "###",
                  beside: Beside | None = None) -> list[str]:
  """The registered families, the exploratory summaries and, where the study names one,
  the study beside it, for the study's page."""
  by, values = _values(runs)
  return [INTRO, "", *[l for fam in tests["families"] for l in family_lines(values, fam, heading)],
          *exploratory_lines(by, values, heading),
          *([] if beside is None else beside_lines(runs, beside, heading))]


def build(runs: list[Run], tests: dict[str, Any], beside: Beside | None = None) -> str:
  lines = ["# Registered tests and learning-curve summaries", "",
           "Generated by `python -m studies.confirm`; regenerate it rather than edit it.",
           *summary_lines(runs, tests, "##", beside), *commit_lines(runs)]
  return "\n".join(lines) + "\n"


def read_tests(study_dir: str) -> dict[str, Any] | None:
  """The study's registered families (`tests.json`); None where it registers none."""
  path = os.path.join(study_dir, TESTS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_beside(study_dir: str) -> Beside | None:
  """The study named in `beside.json` and its finished runs; None where none is named."""
  path = os.path.join(study_dir, BESIDE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    spec = json.load(f)
  missing = {"study", "this", "that", "metric", "comparisons"} - set(spec)
  if missing:
    raise SystemExit(f"{path}: missing {', '.join(sorted(missing))}")
  other = os.path.join(os.path.dirname(os.path.normpath(study_dir)), spec["study"], "runs")
  if not os.path.isdir(other):
    raise SystemExit(f"{path} names the study {spec['study']!r}, whose runs ({other}) are "
                     "absent")
  return spec, load_runs(other)[0]


def page(reports_dir: str, name: str) -> str:
  """confirm.md's text for the study `reports_dir/name`."""
  study = os.path.join(reports_dir, name)
  tests = read_tests(study)
  if tests is None:
    raise SystemExit(f"confirm: {os.path.join(study, TESTS_FILE)} is absent (the study's "
                     "registered tests)")
  runs, _ = load_runs(os.path.join(study, "runs"))
  return build(runs, tests, read_beside(study))


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--name", required=True)
  p.add_argument("--reports-dir", default="reports")
  a = p.parse_args(argv)
  text = page(a.reports_dir, a.name)
  out = os.path.join(a.reports_dir, a.name, CONFIRM_FILE)
  with open(out, "w") as f:
    f.write(text)
  print(out)


if __name__ == "__main__":
  main()
