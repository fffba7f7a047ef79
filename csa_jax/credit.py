"""Step-level credit accuracy (CSA proposal, "Metrics"): how well an estimator's per-step
advantages rank the environment's oracle step labels (never used for training), on the
training rollouts (`credit_accuracy`, logged every iteration) and as a study over fixed
rollouts (`credit_table`, studies/credit.py). The one home of the credit metrics:

- spearman: rank correlation over all labelled steps;
- spearman_failed / spearman_won: the same within failed / won episodes only, the
  proposal's claim that step credit tells useful actions in failed rollouts and harmful ones
  in won rollouts apart (an episode-level estimator is constant within an episode, so only
  differences between episodes can move these);
- two AUCs, the probability that a step of one class gets a higher advantage than a step of
  the other, ties counting 1/2, which differ in what they rank:
  - `decisive_auc`: steps labelled > 0 against steps labelled < 0, steps labelled 0 left
    out. Where only decisive steps carry a non-zero label (KeyDoor: right key +1, wrong
    -1, routine 0) it is the decisive step's credit accuracy; the training log's
    `credit/decisive_auc` and the study pages of studies/report.py use it;
  - `progress_auc`: steps labelled > 0 (progress) against all others, labelled <= 0 (no
    progress or a regression); the credit study (reports/credit.md) uses it.
  With routine steps (label 0) present the two are not comparable.
All rank on one function, `average_ranks`.

Confidence intervals are percentile bootstraps over groups (tasks): a group's G rollouts
share a task and a baseline, so groups, not steps, are the independent units. Host NumPy.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

METRICS = ("spearman", "spearman_failed", "spearman_won", "progress_auc")


def average_ranks(x: np.ndarray) -> np.ndarray:
  """0-based ranks; tied values share the mean of their ranks (vectorised)."""
  _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
  first = np.cumsum(counts) - counts  # 0-based rank of each distinct value's first copy
  return (first + (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  """Spearman's rho (Pearson on average ranks); NaN with < 3 values or a constant side."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
    return float("nan")
  return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
  """Mann-Whitney AUC of `scores` separating positive from negative items: P(x > y) +
  P(x == y) / 2 for x a positive's score, y a negative's; NaN if a class is empty."""
  scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
  n_pos, n_neg = int(positive.sum()), int((~positive).sum())
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  ranks = average_ranks(scores)
  return float((ranks[positive].sum() - n_pos * (n_pos - 1) / 2.0) / (n_pos * n_neg))


def decisive_auc(adv: np.ndarray, label: np.ndarray) -> float:
  """AUC of the advantages of steps labelled > 0 against steps labelled < 0; steps
  labelled 0 (routine) take no part."""
  adv, label = np.asarray(adv), np.asarray(label)
  rated = label != 0
  return auc(adv[rated], label[rated] > 0)


def progress_auc(adv: np.ndarray, label: np.ndarray) -> float:
  """AUC of the advantages of steps labelled > 0 (progress) against every other step
  (label <= 0: no progress or a regression)."""
  return auc(adv, np.asarray(label) > 0)


def credit_accuracy(adv_BxGxT: np.ndarray, oracle_BxGxT: np.ndarray,
                    mask_BxGxT: np.ndarray) -> dict[str, float]:
  """The training log's credit metrics over an iteration's labelled steps: how many there
  are, the Spearman correlation of advantages with labels and the decisive AUC. Spearman
  is NaN where fewer than 3 labelled steps exist or either side is constant; the AUC is
  NaN where either class has no step."""
  sel = mask_BxGxT.astype(bool) & np.isfinite(oracle_BxGxT)
  a, o = np.asarray(adv_BxGxT, np.float64)[sel], np.asarray(oracle_BxGxT, np.float64)[sel]
  return {"credit/labelled_steps": float(sel.sum()), "credit/spearman": spearman(a, o),
          "credit/decisive_auc": decisive_auc(a, o)}


def labelled_steps(adv_BxGxT: np.ndarray, oracle_BxGxT: np.ndarray, mask_BxGxT: np.ndarray,
                   won_BxG: np.ndarray) -> dict[str, np.ndarray]:
  """Flat arrays over the labelled steps: advantage, label, group index, episode won."""
  sel = np.asarray(mask_BxGxT, bool) & np.isfinite(oracle_BxGxT)
  b, g, _ = np.nonzero(sel)
  return {"adv": np.asarray(adv_BxGxT, np.float64)[sel],
          "label": np.asarray(oracle_BxGxT, np.float64)[sel],
          "group": b, "won": np.asarray(won_BxG, bool)[b, g]}


def metric_values(steps: dict[str, np.ndarray]) -> dict[str, float]:
  a, y, won = steps["adv"], steps["label"], steps["won"]
  return {"spearman": spearman(a, y),
          "spearman_failed": spearman(a[~won], y[~won]),
          "spearman_won": spearman(a[won], y[won]),
          "progress_auc": progress_auc(a, y)}


def bootstrap_groups(steps: dict[str, np.ndarray], num_groups: int,
                     fn: Callable[[dict[str, np.ndarray]], dict[str, float]],
                     num_resamples: int, seed: int) -> list[dict[str, float]]:
  """`fn` on `num_resamples` resamples of the groups (with replacement, as many as there
  are); a group drawn k times contributes its steps k times."""
  rng = np.random.default_rng(seed)
  by_group = [np.nonzero(steps["group"] == b)[0] for b in range(num_groups)]
  out = []
  for _ in range(num_resamples):
    pick = rng.integers(0, num_groups, num_groups)
    idx = np.concatenate([by_group[b] for b in pick]) if num_groups else np.zeros(0, int)
    out.append(fn({k: v[idx] for k, v in steps.items()}))
  return out


def percentile_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
  """Percentile interval over the finite bootstrap values (NaN if fewer than half are)."""
  v = np.asarray([x for x in values if np.isfinite(x)], np.float64)
  if len(v) < max(1, len(values) // 2):
    return float("nan"), float("nan")
  lo, hi = np.quantile(v, [(1 - level) / 2, (1 + level) / 2])
  return float(lo), float(hi)


def credit_table(advs: dict[str, np.ndarray], oracle_BxGxT: np.ndarray,
                 mask_BxGxT: np.ndarray, won_BxG: np.ndarray, *, num_resamples: int = 400,
                 seed: int = 0) -> list[dict]:
  """One row per (estimator, metric): value on all groups, bootstrap 95% CI, step counts.

  Every estimator is resampled with the same group draws (same seed), so their intervals
  are paired; `delta_vs_grpo` rows give the paired difference to GRPO where it is present.
  """
  num_groups = mask_BxGxT.shape[0]
  rows, boots = [], {}
  for name, adv in advs.items():
    steps = labelled_steps(adv, oracle_BxGxT, mask_BxGxT, won_BxG)
    point = metric_values(steps)
    boots[name] = bootstrap_groups(steps, num_groups, metric_values, num_resamples, seed)
    counts = {"steps": len(steps["label"]), "steps_failed": int((~steps["won"]).sum()),
              "steps_won": int(steps["won"].sum()), "progress_steps": int((steps["label"] > 0).sum())}
    for m in METRICS:
      lo, hi = percentile_ci([b[m] for b in boots[name]])
      rows.append({"estimator": name, "metric": m, "value": point[m], "lo": lo, "hi": hi,
                   **counts})
  if "grpo" in advs:
    point_ref = {r["metric"]: r["value"] for r in rows if r["estimator"] == "grpo"}
    for row in list(rows):
      if row["estimator"] == "grpo":
        continue
      diffs = [b[row["metric"]] - r[row["metric"]]
               for b, r in zip(boots[row["estimator"]], boots["grpo"])]
      lo, hi = percentile_ci(diffs)
      row.update(delta_vs_grpo=row["value"] - point_ref[row["metric"]], delta_lo=lo, delta_hi=hi)
  return rows


def invalid_step_credit(adv_BxGxT: np.ndarray, invalid_BxGxT: np.ndarray,
                        mask_BxGxT: np.ndarray, won_BxG: np.ndarray) -> dict[str, float]:
  """How an estimator treats the steps the environment rejected, by the episode's outcome:
  for "failed", "won" and "all" episodes, the number of invalid steps (`n_*`), their mean
  advantage (`mean_*`, NaN when there are none) and the fraction with a positive advantage
  (`pos_*`). An estimator that raises the probability of rejected actions shows it here,
  whatever its accuracy on the labelled steps."""
  adv = np.asarray(adv_BxGxT, np.float64)
  sel = np.asarray(mask_BxGxT, bool) & np.asarray(invalid_BxGxT, bool)
  won = np.broadcast_to(np.asarray(won_BxG, bool)[..., None], sel.shape)
  out = {}
  for name, part in (("failed", sel & ~won), ("won", sel & won), ("all", sel)):
    a = adv[part]
    out[f"n_{name}"] = float(a.size)
    out[f"mean_{name}"] = float(a.mean()) if a.size else float("nan")
    out[f"pos_{name}"] = float((a > 0).mean()) if a.size else float("nan")
  return out
