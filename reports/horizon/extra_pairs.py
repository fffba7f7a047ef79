"""The verdict's paired differences that the report does not print (run from the project
root: `PYTHONPATH=. python reports/horizon/extra_pairs.py`), from the same run files and
with the report's own helpers (studies/runs.py, studies/stats.py): per family, each
estimator's decisive-step AUC and credit Spearman minus GRPO's; per family, the per-seed
difference a - b of sampled held-out success for each pair (a, b), in points; and the
gain-ratio clause (CSA's gain over SFT against 0.7x the best model-based baseline's).
Intervals: 95% t over the seeds both finished."""

import os

from studies.runs import Run, load_runs, run_scalars
from studies.stats import mean_ci, paired_deltas

CREDIT = ("csa", "csa_state", "gigpo", "csa_lam1", "dapo", "csa_dapo")
PAIRS = [("csa", "grpo"), ("csa_state", "grpo"), ("csa_state", "csa"), ("csa_lam1", "csa"),
         ("csa_dapo", "dapo"), ("dapo", "grpo"), ("gigpo", "grpo")]
MODEL_BASED = ("istar", "spa", "mtdpo")
RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs")


def by_method_seed(runs: list[Run]) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
  """family -> method -> seed -> the run's scalars (run_scalars)."""
  out: dict = {}
  for r in runs:
    out.setdefault(r.family, {}).setdefault(r.method, {})[r.seed] = run_scalars(r)
  return out


def deltas(fam: dict, a: str, b: str, key: str, scale: float = 1.0) -> list[float]:
  pick = lambda m: {s: scale * v[key] for s, v in fam.get(m, {}).items()}
  return paired_deltas(pick(a), pick(b))


def show(label: str, d: list[float], fmt: str) -> str:
  m, lo, hi = mean_ci(d)
  return (f"{label}: {m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}] over {len(d)} seeds; "
          f"positive on {sum(x > 0 for x in d)}, negative on {sum(x < 0 for x in d)}")


def main() -> None:
  runs, _ = load_runs(RUNS)
  families = by_method_seed(runs)
  for name, fam in families.items():
    for key in ("decisive_auc", "credit_spearman"):
      for m in CREDIT:
        d = deltas(fam, m, "grpo", key)
        if len(d) >= 2:
          print(show(f"{name} {key} {m} - grpo", d, "+.3f"))
  for name, fam in families.items():
    for a, b in PAIRS:
      d = deltas(fam, a, b, "sampled_success", 100.0)
      if d:
        print(show(f"{name} {a} - {b}", d, "+.1f"))
    gains = {m: mean_ci(deltas(fam, m, "sft", "sampled_success", 100.0))
             for m in ("csa",) + MODEL_BASED if fam.get(m)}
    based = {m: g for m, g in gains.items() if m in MODEL_BASED}
    if "csa" in gains and based:
      best = max(based, key=lambda m: based[m][0])
      c = gains["csa"]
      print(f"{name} gain over SFT: csa {c[0]:+.1f} [{c[1]:+.1f}, {c[2]:+.1f}]; best "
            f"model-based {best} {based[best][0]:+.1f}; 0.7 x that = {0.7 * based[best][0]:+.1f}")


if __name__ == "__main__":
  main()
