"""How each estimator treats the actions the environment rejected, on collected rollouts
(`python -m studies.credit` writes them): the mean advantage of invalid steps and the
fraction with a positive advantage, in failed and in won episodes
(`csa_jax.credit.invalid_step_credit`).

    python -m studies.invalid_credit runs/invalid_credit/rollouts_seed2 --name invalid_credit

writes reports/NAME/invalid_steps.csv and prints the table. The estimators are the credit
study's (`studies.credit_table.ESTIMATORS`) with the run's own reward shaping, plus
csa_state at lambda 0.5 and its step term alone (csa_state_step, `STATE_COLUMNS`).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

from studies.credit_table import ADVANTAGE, STEP_TERM

FIELDS = ("n", "mean", "pos")
RESAMPLES = 2000
PARTS = ("failed", "won", "all")


# Beside the credit study's columns (studies/credit_table.py, the same form).
STATE_COLUMNS = {"csa_state": ("csa_state", ADVANTAGE, {"lam": 0.5}),
                 "csa_state_step": ("csa_state", STEP_TERM, {})}


def rows_for(out_dir: str) -> list[dict]:
  from csa_jax import credit
  from studies.credit import estimator_advantages, load_arrays

  arrays, meta = load_arrays(out_dir)
  advs = estimator_advantages(arrays, meta["algo"], meta["rollout"])
  advs.update(estimator_advantages(arrays, meta["algo"], meta["rollout"], STATE_COLUMNS))
  won = arrays.rewards_BxG > 0
  label = os.path.basename(os.path.normpath(out_dir))
  sel = arrays.mask_BxGxT & arrays.invalid_BxGxT
  rows = []
  for name, adv in advs.items():
    lo, hi = diff_ci(adv, advs["grpo"], sel)
    rows.append({"run": label, "estimator": name, "G": arrays.mask_BxGxT.shape[1],
                 "groups": arrays.mask_BxGxT.shape[0],
                 "success": float(arrays.rewards_BxG.mean()),
                 "invalid_frac": float(arrays.invalid_BxGxT[arrays.mask_BxGxT].mean()),
                 **credit.invalid_step_credit(adv, arrays.invalid_BxGxT, arrays.mask_BxGxT,
                                              won),
                 "diff_vs_grpo": _mean_diff(adv, advs["grpo"], sel), "diff_lo": lo, "diff_hi": hi})
  return rows


def _mean_diff(adv, ref, sel) -> float:
  return float((np.asarray(adv, np.float64) - np.asarray(ref, np.float64))[sel].mean())


def diff_ci(adv, ref, sel, level=0.95) -> tuple[float, float]:
  """Percentile bootstrap over task groups (a group's rollouts share a baseline) of the mean
  over invalid steps of (adv - ref)."""
  d = (np.asarray(adv, np.float64) - np.asarray(ref, np.float64)) * sel
  sums, counts = d.reshape(d.shape[0], -1).sum(1), sel.reshape(sel.shape[0], -1).sum(1)
  rng = np.random.default_rng(0)
  idx = rng.integers(0, len(sums), size=(RESAMPLES, len(sums)))
  means = sums[idx].sum(1) / np.maximum(counts[idx].sum(1), 1)
  return (float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2)))


def table(rows: list[dict]) -> str:
  head = ["run", "estimator"] + [f"{f}_{p}" for p in PARTS for f in FIELDS] + [
      "mean_all - grpo [95% CI]"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["run"], r["estimator"]]
    for p in PARTS:
      cells += [f"{int(r['n_' + p])}", f"{r['mean_' + p]:+.3f}", f"{r['pos_' + p]:.3f}"]
    cells.append(f"{r['diff_vs_grpo']:+.3f} [{r['diff_lo']:+.3f}, {r['diff_hi']:+.3f}]")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("dirs", nargs="+", help="directories written by `python -m studies.credit`")
  p.add_argument("--name", default="invalid_credit", help="reports/NAME/invalid_steps.csv")
  p.add_argument("--reports-dir", default="reports")
  a = p.parse_args(argv)
  rows = [r for d in a.dirs for r in rows_for(d)]
  out = os.path.join(a.reports_dir, a.name)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "invalid_steps.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
      w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
  print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
