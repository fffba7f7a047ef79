"""What the credit study (studies/credit.py) and its report (studies/credit_report.py) share:
its columns (which registered estimators it compares, at which knobs), the environments it
knows and what their oracle labels mean, and its results.csv format."""

from __future__ import annotations

import csv

# A study column is a registered estimator (csa_jax/estimators/), whole (ADVANTAGE) or its
# step term alone (STEP_TERM), at the run's own knobs (algo config) with those given here
# set over them. Nothing is defined here: each column reads the registry.
ADVANTAGE, STEP_TERM = "advantage", "step term"
ESTIMATORS = {  # study column -> (registered estimator, part, knobs over the run's config)
    "grpo": ("grpo", ADVANTAGE, {}),
    "rloo": ("rloo", ADVANTAGE, {}),
    "dr_grpo": ("dr_grpo", ADVANTAGE, {}),
    "csa_lam0.25": ("csa", ADVANTAGE, {"lam": 0.25}),
    "csa_lam0.5": ("csa", ADVANTAGE, {"lam": 0.5}),
    "csa_lam1": ("csa", ADVANTAGE, {"lam": 1.0}),
    "csa_step": ("csa", STEP_TERM, {}),
    "gigpo": ("gigpo", ADVANTAGE, {}),
    "gigpo_step": ("gigpo", STEP_TERM, {}),
    "csa_gigpo": ("csa_gigpo", ADVANTAGE, {"lam": 0.5}),
}
ENV_FAMILIES = {"alfworld": "alfworld", "coin_doors": "twx", "twx_coin": "twx",
                "quickstart_coin": "twx", "scienceworld": "scienceworld",
                "quickstart": "keydoor", "keydoor": "keydoor"}
LABEL_MEANING = {
    "alfworld": ("exact: decrease of the shortest distance to the goal (+1 along a shortest "
                 "plan, 0 for a wasted step, -1 or less for a step that moves the goal away)"),
    "twx": ("coarse: +1 when the engine score rises (in coin only on 'take coin', the winning "
            "step), -1 when it falls or the task fails, else 0"),
    "keydoor": ("exact: +1 for the right key (or branch) at a decisive step, -1 for a wrong "
                "one, 0 on every routine step"),
}


COLUMNS = ("run", "env", "policy", "G", "groups", "success", "estimator", "metric", "value",
           "lo", "hi", "delta_vs_grpo", "delta_lo", "delta_hi", "steps", "steps_failed",
           "steps_won", "progress_steps")


def write_csv(rows: list[dict], path: str) -> None:
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})


def read_csv(path: str) -> list[dict]:
  with open(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    for k in COLUMNS[3:]:
      if k in r and k not in ("estimator", "metric"):
        r[k] = float(r[k]) if r[k] not in ("", None) else float("nan")
  return rows
