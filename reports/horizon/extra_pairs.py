"""The verdict's paired differences that the report does not print (run from the project
root: `python reports/horizon/extra_pairs.py`): at each horizon, for each pair (a, b), the
per-seed difference a - b of sampled held-out success, in points, with a 95% t-interval
over the seeds both finished, and the gain-ratio clause (CSA's gain over SFT against 0.7x
the best model-based baseline's)."""

import csv
import json
import math
import os
import statistics

from scipy import stats

PAIRS = [("csa", "grpo"), ("csa_state", "grpo"), ("csa_state", "csa"), ("csa_lam1", "csa"),
         ("csa_dapo", "dapo"), ("dapo", "grpo"), ("gigpo", "grpo")]
MODEL_BASED = ("istar", "spa", "mtdpo")


def load(path=os.path.join(os.path.dirname(__file__), "per_run.csv")):
  rows = list(csv.DictReader(open(path)))
  return {(r["horizon"], r["method"], int(r["seed"])): 100 * float(r["sampled_success"])
          for r in rows}


def interval(d):
  m = statistics.mean(d)
  if len(d) < 2:
    return m, float("nan"), float("nan")
  h = stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / len(d) ** 0.5
  return m, m - h, m + h


def paired(s, horizon, a, b):
  seeds = sorted(k[2] for k in s if k[:2] == (horizon, a) and (horizon, b, k[2]) in s)
  return seeds, [s[(horizon, a, x)] - s[(horizon, b, x)] for x in seeds]


def run_mean(path, key):
  """A run's per-iteration metric `key` averaged over its iterations (NaN ones skipped)."""
  vals = [json.loads(line).get(key) for line in open(path)]
  vals = [v for v in vals if v is not None and not math.isnan(v)]
  return statistics.mean(vals) if vals else None


def credit_pairs(root=os.path.join(os.path.dirname(__file__), "runs")):
  """Per family, each estimator's decisive AUC and Spearman minus GRPO's, paired by seed."""
  for fam in sorted(os.listdir(root)):
    for key in ("credit/decisive_auc", "credit/spearman"):
      for m in ("csa", "csa_state", "gigpo", "csa_lam1", "dapo", "csa_dapo"):
        d = []
        for seed in range(16):
          a, b = (os.path.join(root, fam, f"{x}_seed{seed}", "metrics.jsonl") for x in (m, "grpo"))
          if os.path.exists(a) and os.path.exists(b):
            x, y = run_mean(a, key), run_mean(b, key)
            if x is not None and y is not None:
              d.append(x - y)
        if len(d) >= 2:
          mean, lo, hi = interval(d)
          print(f"{fam} {key} {m} - grpo: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] over {len(d)} seeds")


def main():
  credit_pairs()
  s = load()
  for horizon in sorted({k[0] for k in s}, key=int):
    for a, b in PAIRS:
      seeds, d = paired(s, horizon, a, b)
      if d:
        m, lo, hi = interval(d)
        print(f"H={horizon:>2} {a} - {b}: {m:+.1f} [{lo:+.1f}, {hi:+.1f}] over seeds {seeds}; "
              f"positive on {sum(x > 0 for x in d)}, negative on {sum(x < 0 for x in d)}")
    gains = {m: interval(paired(s, horizon, m, "sft")[1]) for m in ("csa",) + MODEL_BASED
             if paired(s, horizon, m, "sft")[1]}
    based = {m: g for m, g in gains.items() if m in MODEL_BASED}
    if "csa" in gains and based:
      best = max(based, key=lambda m: based[m][0])
      print(f"H={horizon:>2} gain over SFT: csa {gains['csa'][0]:+.1f} [{gains['csa'][1]:+.1f}, "
            f"{gains['csa'][2]:+.1f}]; best model-based {best} {based[best][0]:+.1f}; "
            f"0.7 x that = {0.7 * based[best][0]:+.1f}")


if __name__ == "__main__":
  main()
