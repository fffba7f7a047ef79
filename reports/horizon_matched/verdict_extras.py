"""The numbers the notes' results and verdict quote that the page and confirm.md do not print
(run from the project root: `PYTHONPATH=. python reports/horizon_matched/verdict_extras.py`),
from the same run files with the report's helpers (studies/runs.py, studies/stats.py):

- per horizon, each registered pair's per-seed differences of final sampled success (points),
  their mean, 95% t-interval and SD over seeds, and the seeds a two-sided paired t-test at
  alpha 0.05 needs for 80% power at 5 and 10 points with that SD (the power plan's rule:
  "if the measured H = 48 SD exceeds 10, the verdict names the seeds needed"), and beside it
  the SD over seeds of the same pair's final right-key probability (prediction 5);
- prediction 2 at H = 48: CSA's training-rollout invalid-action fraction at the last RL
  iteration against GRPO's, per seed (and csa_state's), beside the held-out sampled one;
- the credit criterion at every horizon (the registered rule: "falsified if CSA's decisive
  AUC is significantly below GRPO's"): CSA's and csa_state's decisive-step AUC and credit
  Spearman minus GRPO's, paired by seed, to four decimals with the paired t-test's p (the
  page rounds to three, where an interval's bound can read -0.000);
- the two-study comparisons at H = 4 (exploratory): Welch's t-test of this study's per-seed
  CSA - GRPO against the horizon study's, sampled and greedy (the two studies' starts
  differ, so the arms are independent samples)."""

import math
import os

import numpy as np
from scipy import stats

from studies.runs import Run, load_runs, run_scalars
from studies.confirm import paired_t_p
from studies.stats import mean_ci, paired_deltas

HERE = os.path.dirname(os.path.abspath(__file__))
HORIZON_RUNS = os.path.join(os.path.dirname(HERE), "horizon", "runs")
PAIRS = [("grpo", "sft"), ("csa", "grpo"), ("csa_state", "grpo"), ("csa_state", "csa")]
INVALID = "rollout/invalid_action_frac"


def by_horizon(runs: list[Run]) -> dict[int, dict[str, dict[int, dict[str, float]]]]:
  """horizon -> method -> seed -> the run's scalars (run_scalars, read once), with its last
  RL iteration's rollout invalid-action fraction and its final right-key probability."""
  out: dict = {}
  for r in runs:
    v = dict(run_scalars(r), last_rollout_invalid=r.steps[max(r.steps)].get(INVALID, math.nan),
             right_prob=r.final.get("eval_oracle/prob", math.nan))
    out.setdefault(r.horizon, {}).setdefault(r.method, {})[r.seed] = v
  return out


def deltas(runs: dict[str, dict[int, dict[str, float]]], a: str, b: str, key: str
           ) -> dict[int, float]:
  """Per seed, 100 x (a's `key` - b's), over the seeds both finished."""
  va, vb = runs.get(a, {}), runs.get(b, {})
  return {s: 100.0 * (va[s][key] - vb[s][key]) for s in sorted(set(va) & set(vb))}


def power(n: int, effect: float, sd: float) -> float:
  """Power of a two-sided paired t-test at alpha 0.05 with n pairs, for a true mean
  difference `effect` at SD `sd`: the noncentral t's mass past the critical values."""
  crit, nc = stats.t.ppf(0.975, n - 1), effect / sd * math.sqrt(n)
  return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def seeds_needed(effect: float, sd: float, target: float = 0.8, most: int = 200) -> int:
  """The fewest pairs whose power for `effect` at `sd` reaches `target` (most + 1: more)."""
  return next((n for n in range(3, most + 1) if power(n, effect, sd) >= target), most + 1)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
  """(t, Welch-Satterthwaite df, two-sided p) of mean(a) - mean(b)."""
  r = stats.ttest_ind(a, b, equal_var=False)
  return float(r.statistic), float(r.df), float(r.pvalue)


def pair_lines(study: dict[int, dict[str, dict[int, Run]]]) -> None:
  for h in sorted(study):
    for a, b in PAIRS:
      d = deltas(study[h], a, b, "sampled_success")
      if len(d) < 2:
        continue
      m, lo, hi = mean_ci(list(d.values()))
      sd = float(np.std(list(d.values()), ddof=1))
      need = ", ".join(f"{e} points: {seeds_needed(e, sd)} seeds" for e in (5, 10))
      sd_right = float(np.std(list(deltas(study[h], a, b, "right_prob").values()), ddof=1))
      print(f"H = {h} {a} - {b}: {m:+.1f} [{lo:+.1f}, {hi:+.1f}], SD {sd:.1f} over "
            f"{len(d)} seeds ({' '.join(f'{s}:{v:+.1f}' for s, v in d.items())}); "
            f"80% power at {need}; SD of the right-key probability's difference {sd_right:.1f}")


def credit_lines(study: dict[int, dict[str, dict[int, dict[str, float]]]]) -> None:
  for h in sorted(study):
    for m in ("csa", "csa_state"):
      for key in ("decisive_auc", "credit_spearman"):
        d = paired_deltas(*({s: v[key] for s, v in study[h].get(x, {}).items()}
                            for x in (m, "grpo")))
        if len(d) < 2:
          continue
        mean, lo, hi = mean_ci(d)
        p = paired_t_p(d)
        print(f"H = {h} {m} - grpo, {key}: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}], paired t "
              f"p = {p:.3g} over {len(d)} seeds")


def invalid_lines(runs: dict[str, dict[int, dict[str, float]]]) -> None:
  show = lambda m, key: " ".join(f"{s}:{100 * v[key]:.2f}" for s, v in sorted(runs[m].items()))
  for m in ("grpo", "csa", "csa_state"):
    if m in runs:
      print(f"  {m}: last iteration's rollout invalid fraction (%) "
            f"{show(m, 'last_rollout_invalid')}; held-out sampled (%) "
            f"{show(m, 'sampled_invalid_action_frac')}")
  for m in ("csa", "csa_state"):
    d = list(deltas(runs, m, "grpo", "last_rollout_invalid").values())
    if d:
      print(f"  {m} above GRPO on {sum(x > 0 for x in d)} of {len(d)} seeds (rollout, last "
            "iteration)")


def main() -> None:
  study = by_horizon(load_runs(os.path.join(HERE, "runs"))[0])
  pair_lines(study)
  credit_lines(study)
  if 48 in study:
    print("H = 48, invalid actions:")
    invalid_lines(study[48])
  horizon = by_horizon(load_runs(HORIZON_RUNS)[0])
  for key in ("sampled_success", "greedy_success"):
    here = list(deltas(study[4], "csa", "grpo", key).values())
    there = list(deltas(horizon[4], "csa", "grpo", key).values())
    t, df, p = welch(here, there)
    print(f"H = 4 csa - grpo, {key}: this study {np.mean(here):+.1f} ({len(here)} seeds), "
          f"horizon {np.mean(there):+.1f} ({len(there)}); Welch t = {t:.2f}, df = {df:.1f}, "
          f"p = {p:.3f} (exploratory)")


if __name__ == "__main__":
  main()
