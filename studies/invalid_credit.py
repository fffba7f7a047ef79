"""How each estimator treats the actions the environment rejected, on collected rollouts
(`python -m studies.credit` writes them): the mean advantage of invalid steps and the
fraction with a positive advantage, in failed and in won episodes
(`csa_jax.credit.invalid_step_credit`).

    python -m studies.invalid_credit runs/invalid_credit/rollouts_seed2 --name invalid_credit

writes reports/NAME/invalid_steps.csv and prints the table. The estimators are the credit
study's (`studies.credit_table.ESTIMATORS`) with the run's own reward shaping, plus
csa_state at lambda 0.5 and its step term alone (csa_state_step).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys

import numpy as np

FIELDS = ("n", "mean", "pos")
RESAMPLES = 2000
PARTS = ("failed", "won", "all")


def state_terms(arrays, algo_dict: dict, rollout_dict: dict) -> dict[str, np.ndarray]:
  """csa_state's total advantage (lambda 0.5) and its step term on the collected arrays."""
  import jax.numpy as jnp

  from csa_jax import advantages as adv_lib
  from csa_jax.algorithms import estimator as estimator_lib
  from csa_jax.config import AlgoConfig, RolloutConfig, from_dict

  algo = from_dict(AlgoConfig, algo_dict, source="meta.json")
  rollout = from_dict(RolloutConfig, rollout_dict, source="meta.json")
  rewards, _ = estimator_lib.shaped_rewards(arrays, algo, rollout)
  mask = arrays.mask_BxGxT
  _, a_s = adv_lib.csa_state_components(jnp.asarray(rewards), jnp.asarray(arrays.logp_BxGxT),
                                        jnp.asarray(mask), jnp.asarray(arrays.state_id_BxGxT),
                                        eps=algo.eps)
  total = estimator_lib.compute_advantages(
      arrays, dataclasses.replace(algo, estimator="csa_state", lam=0.5), rollout)
  return {"csa_state": np.asarray(total), "csa_state_step": np.where(mask, np.asarray(a_s), 0.0)}


def rows_for(out_dir: str) -> list[dict]:
  from csa_jax import credit
  from studies.credit import estimator_advantages, load_arrays

  arrays, meta = load_arrays(out_dir)
  advs = estimator_advantages(arrays, meta["algo"], meta["rollout"])
  advs.update(state_terms(arrays, meta["algo"], meta["rollout"]))
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
