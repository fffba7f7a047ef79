"""Study report: one table, three plots and a Markdown page for a sweep of methods x seeds.

    python -m experiments.report --name NAME [--reports-dir reports]

Reads `reports/NAME/runs/`, one directory per run with `config.json` and `metrics.jsonl`:
`sft_seed<k>` is the shared SFT start of seed k (its step-0 line holds the held-out
evaluation), `<method>_seed<k>` an RL run from that start. Only finished runs (those with
a `DONE` file) count; the page says how many others were ignored. Writes

- `reports/NAME/summary.csv`: per method, the final held-out success with actions sampled
  (the policy RL optimises) and greedy, its change from the SFT start and from GRPO paired
  by seed, episode length, invalid actions, credit accuracy (Spearman) and seconds per
  iteration. Means over seeds with 95% Student-t intervals; an empty cell is a value that
  does not exist (a delta of the SFT row, an interval from one seed);
- `learning_curves.png`, `training_curves.png`, `final_success.png` in `reports/NAME/`;
- `reports/NAME.md`: the reproduce commands (`reports/NAME/commands.txt`), the run
  inventory and budget, the table, the plots and the verdict (`reports/NAME/notes.md`),
  both copied verbatim.

Nothing in the output depends on the time or machine, so regenerating an unchanged study
rewrites identical files.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import re
from typing import Any, Sequence

import numpy as np

from csa_jax.metrics import read_jsonl

NAN = float("nan")
# Baselines first (GRPO, the reference of every delta, leads; then the model-based ones,
# iStar, SPA-RL, multi-turn DPO), then CSA, its combinations
# and its lambda ablations; methods not listed follow alphabetically.
METHOD_ORDER = ("grpo", "dr_grpo", "rloo", "dapo", "gigpo", "istar", "spa", "mtdpo",
                "csa", "csa_dapo", "csa_gigpo", "csa_lam0", "csa_lam1")
SFT = "sft"
CSV_COLUMNS = (
    "method", "seeds",
    "sampled_success_mean", "sampled_success_ci_low", "sampled_success_ci_high",
    "delta_vs_sft_mean", "delta_vs_sft_ci_low", "delta_vs_sft_ci_high",
    "delta_vs_grpo_mean", "delta_vs_grpo_ci_low", "delta_vs_grpo_ci_high",
    "greedy_success_mean", "greedy_success_ci_low", "greedy_success_ci_high",
    "greedy_delta_vs_sft_mean", "greedy_delta_vs_sft_ci_low", "greedy_delta_vs_sft_ci_high",
    "sampled_episode_len_mean", "sampled_invalid_action_frac_mean",
    "credit_spearman_mean", "credit_spearman_ci_low", "credit_spearman_ci_high",
    "wall_s_per_iter_mean", "adv_share_mean", "env_steps_total_mean",
)
PLOTS = ("learning_curves.png", "training_curves.png", "final_success.png")
SMOOTH_ITERS = 5  # moving-average window of the training curves, in iterations
_RUN_NAME = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)$")


# ----------------------------------------------------------------------------- statistics


def t_cdf(t: float, df: int) -> float:
  """Student-t CDF for an integer number of degrees of freedom.

  The closed-form finite series of Abramowitz & Stegun 26.7.3-4 for P(|T| < t): exact for
  integer df, which is all a CI over seeds (df = n - 1) needs, and no scipy.
  """
  if df < 1 or int(df) != df:
    raise ValueError(f"df must be a positive integer, got {df}")
  theta = math.atan(abs(t) / math.sqrt(df))
  c2 = math.cos(theta) ** 2
  if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
    term, total = 1.0, 1.0 if df > 1 else 0.0
    for k in range(1, (df - 1) // 2):
      term *= c2 * (2 * k) / (2 * k + 1)
      total += term
    a = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
  else:  # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
      term *= c2 * (2 * k - 1) / (2 * k)
      total += term
    a = math.sin(theta) * total
  return 0.5 + math.copysign(0.5 * a, t)


def t_quantile(p: float, df: int) -> float:
  """Inverse of `t_cdf` by bisection (the CDF is monotone; 200 halvings reach float64)."""
  if not 0 < p < 1:
    raise ValueError(f"p must be in (0, 1), got {p}")
  if p < 0.5:
    return -t_quantile(1 - p, df)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < p:
    lo, hi = hi, 2 * hi
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
  return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
  """Mean and Student-t interval over the finite values (seeds); NaN bounds for one value."""
  x = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  if len(x) == 0:
    return NAN, NAN, NAN
  m = float(x.mean())
  if len(x) == 1:
    return m, NAN, NAN
  half = t_quantile(0.5 + level / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
  return m, m - half, m + half


def band(y_SxP: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`mean_ci` along the seed axis of a curve per seed (no NaN inside)."""
  n = y_SxP.shape[0]
  m = y_SxP.mean(0)
  if n < 2:
    return m, np.full_like(m, NAN), np.full_like(m, NAN)
  half = t_quantile(0.5 + level / 2, n - 1) * y_SxP.std(0, ddof=1) / math.sqrt(n)
  return m, m - half, m + half


def paired_deltas(a: dict[int, float], b: dict[int, float]) -> list[float]:
  """a(seed) - b(seed) over the seeds where both are finite: the same SFT start, so the
  start's luck cancels."""
  return [a[s] - b[s] for s in sorted(a) if s in b and np.isfinite(a[s]) and np.isfinite(b[s])]


def finite_mean(values: Sequence[float]) -> float:
  x = [v for v in values if np.isfinite(v)]
  return float(np.mean(x)) if x else NAN


def smooth(y: np.ndarray, window: int) -> np.ndarray:
  """Centred moving average; near the ends the window shrinks to what exists."""
  y = np.asarray(y, np.float64)
  c = np.concatenate([[0.0], np.cumsum(y)])
  i = np.arange(len(y))
  lo = np.maximum(i - window // 2, 0)
  hi = np.minimum(i + window - window // 2, len(y))
  return (c[hi] - c[lo]) / (hi - lo)


# ----------------------------------------------------------------------------- runs


@dataclasses.dataclass
class Run:
  name: str
  method: str
  seed: int
  config: dict[str, Any]
  steps: dict[int, dict[str, float]]  # metrics of each step, its lines merged

  @property
  def final(self) -> dict[str, float]:
    return self.steps[max(self.steps)] if self.steps else {}


def parse_run_name(name: str) -> tuple[str, int] | None:
  m = _RUN_NAME.match(name)
  return (m["method"], int(m["seed"])) if m else None


def merge_steps(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
  """One dict per step: the trainer writes the last iteration's training metrics and the
  final evaluation as two lines with the same step (and SFT's step 0 as two lines)."""
  out: dict[int, dict[str, float]] = {}
  for r in records:
    out.setdefault(int(r["step"]), {}).update(r)
  return dict(sorted(out.items()))


def load_runs(runs_dir: str) -> tuple[list[Run], list[str]]:
  """Finished runs sorted by (method, seed), and the names of the unfinished ones."""
  runs, unfinished = [], []
  for name in sorted(os.listdir(runs_dir)):
    path = os.path.join(runs_dir, name)
    parsed = parse_run_name(name)
    if not os.path.isdir(path) or parsed is None:
      continue
    if not os.path.exists(os.path.join(path, "DONE")):
      unfinished.append(name)
      continue
    with open(os.path.join(path, "config.json")) as f:
      config = json.load(f)
    steps = merge_steps(read_jsonl(os.path.join(path, "metrics.jsonl")))
    runs.append(Run(name, parsed[0], parsed[1], config, steps))
  return sorted(runs, key=lambda r: (r.method, r.seed)), unfinished


def order_methods(methods: set[str]) -> list[str]:
  known = [m for m in METHOD_ORDER if m in methods]
  return known + sorted(methods - set(METHOD_ORDER) - {SFT})


def config_value(config: dict[str, Any], key: str) -> Any:
  """`a.b.c` in a nested config (as `csa_jax.config.to_dict` writes it) or a flat one."""
  if key in config:
    return config[key]
  node: Any = config
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return None
    node = node[part]
  return node


# ----------------------------------------------------------------------------- per run


def wall_stats(run: Run) -> tuple[float, float]:
  """Seconds per RL iteration (rollout + advantages + update, evaluations excluded; the
  update's batch building is perf/batch_s since csa_jax/perf.py) and the advantage
  computation's share of them; NaN share where the run did not time it."""
  its = [m for s, m in run.steps.items() if s > 0 and "perf/rollout_s" in m]
  if not its:
    return NAN, NAN
  parts = np.array([[m.get(k, 0.0) for k in ("perf/rollout_s", "perf/adv_s", "perf/update_s",
                                             "perf/batch_s")]
                    for m in its], np.float64)
  timed_adv = any("perf/adv_s" in m for m in its) and parts.sum() > 0
  share = float(parts[:, 1].sum() / parts.sum()) if timed_adv else NAN
  return float(parts.sum(1).mean()), share


def run_scalars(run: Run) -> dict[str, float]:
  """The numbers a run contributes to its method's row (final held-out evaluation)."""
  f = run.final
  wall, adv_share = wall_stats(run)
  return {
      "sampled_success": f.get("eval_sampled/success", NAN),
      "greedy_success": f.get("eval/success", NAN),
      "sampled_episode_len": f.get("eval_sampled/episode_len", NAN),
      "sampled_invalid_action_frac": f.get("eval_sampled/invalid_action_frac", NAN),
      "credit_spearman": finite_mean([m["credit/spearman"] for s, m in run.steps.items()
                                      if s > 0 and "credit/spearman" in m]),
      "wall_s_per_iter": wall,
      "adv_share": adv_share,
      "env_steps_total": f.get("perf/env_steps_total", NAN),
  }


# ----------------------------------------------------------------------------- summary


def _ci_cols(prefix: str, values: Sequence[float]) -> dict[str, float]:
  m, lo, hi = mean_ci(values)
  return {f"{prefix}_mean": m, f"{prefix}_ci_low": lo, f"{prefix}_ci_high": hi}


def _by_seed(scal: dict[int, dict[str, float]], key: str) -> dict[int, float]:
  return {s: v[key] for s, v in scal.items()}


def method_row(method: str, scal: dict[int, dict[str, float]],
               sft: dict[int, dict[str, float]], grpo: dict[int, dict[str, float]] | None
               ) -> dict[str, Any]:
  """One summary row from the per-seed scalars of a method, the SFT starts and GRPO."""
  seeds = sorted(scal)
  row: dict[str, Any] = {"method": method, "seeds": len(seeds)}
  row |= _ci_cols("sampled_success", [scal[s]["sampled_success"] for s in seeds])
  row |= _ci_cols("greedy_success", [scal[s]["greedy_success"] for s in seeds])
  for k in ("sampled_episode_len", "sampled_invalid_action_frac", "wall_s_per_iter",
            "adv_share", "env_steps_total"):
    row[f"{k}_mean"] = finite_mean([scal[s][k] for s in seeds])
  if method == SFT:  # the reference itself: no deltas, no RL iterations
    return row
  sampled, greedy = _by_seed(scal, "sampled_success"), _by_seed(scal, "greedy_success")
  row |= _ci_cols("delta_vs_sft", paired_deltas(sampled, _by_seed(sft, "sampled_success")))
  row |= _ci_cols("greedy_delta_vs_sft", paired_deltas(greedy, _by_seed(sft, "greedy_success")))
  if grpo is not None:
    row |= _ci_cols("delta_vs_grpo", paired_deltas(sampled, _by_seed(grpo, "sampled_success")))
  row |= _ci_cols("credit_spearman", [scal[s]["credit_spearman"] for s in seeds])
  return row


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
  """Rows of summary.csv: the SFT start first, then the methods in `METHOD_ORDER`."""
  scal: dict[str, dict[int, dict[str, float]]] = {}
  for r in runs:
    scal.setdefault(r.method, {})[r.seed] = run_scalars(r)
  sft, grpo = scal.get(SFT, {}), scal.get("grpo")
  rows = [method_row(SFT, sft, sft, None)] if sft else []
  return rows + [method_row(m, scal[m], sft, grpo) for m in order_methods(set(scal))]


def _csv_cell(v: Any) -> str:
  if isinstance(v, str):
    return v
  if isinstance(v, (int, np.integer)):
    return str(int(v))
  return format(float(v), ".8g") if v is not None and np.isfinite(v) else ""


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
      w.writerow([_csv_cell(r.get(c)) for c in CSV_COLUMNS])


# ----------------------------------------------------------------------------- curves


def eval_points(run: Run, prefix: str = "eval_sampled") -> dict[int, tuple[float, float]]:
  """Iteration -> (env steps so far, held-out success) for the RL run's evaluations."""
  return {s: (m["perf/env_steps_total"], m[f"{prefix}/success"]) for s, m in run.steps.items()
          if s > 0 and f"{prefix}/success" in m and "perf/env_steps_total" in m}


def learning_curve(runs: list[Run], sft: dict[int, float], prefix: str = "eval_sampled"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Held-out success per evaluation, aligned by iteration over the seeds (their env-step
  counts differ a little), at the seeds' mean env-step count; the SFT start at x = 0."""
  runs = [r for r in runs if r.seed in sft]
  if not runs:
    return (np.zeros(0),) * 4
  pts = [eval_points(r, prefix) for r in runs]
  its = sorted(set.intersection(*(set(p) for p in pts)))
  x_SxP = np.array([[0.0] + [p[i][0] for i in its] for p in pts])
  y_SxP = np.array([[sft[r.seed]] + [p[i][1] for i in its] for r, p in zip(runs, pts)])
  return (x_SxP.mean(0), *band(y_SxP))


def training_curve(runs: list[Run], points: int = 100, window: int = SMOOTH_ITERS
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Training-rollout success, smoothed over iterations, on one env-step grid spanning the
  range every seed covers (np.interp would otherwise flatten the ends)."""
  curves = []
  for r in runs:
    xy = [(m["perf/env_steps_total"], m["rollout/success"]) for s, m in r.steps.items()
          if s > 0 and "rollout/success" in m and "perf/env_steps_total" in m]
    if len(xy) >= 2:
      x, y = np.array(xy, np.float64).T
      curves.append((x, smooth(y, window)))
  if not curves:
    return (np.zeros(0),) * 4
  lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
  grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
  return (grid, *band(np.stack([np.interp(grid, x, y) for x, y in curves])))


# ----------------------------------------------------------------------------- plots


_BASELINE_COLOURS = ("#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#7f7f7f", "#393b79")
_CSA_COLOURS = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#843c39")


def method_style(method: str, methods: list[str]) -> dict[str, Any]:
  """CSA variants solid in warm colours, baselines dashed in cool ones."""
  csa = method.startswith("csa")
  family = [m for m in methods if m.startswith("csa") == csa]
  colours = _CSA_COLOURS if csa else _BASELINE_COLOURS
  return {"color": colours[family.index(method) % len(colours)],
          "linestyle": "-" if csa else "--"}


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def panels(methods: list[str]) -> list[list[str]]:
  """Baselines in one panel, CSA variants in another with GRPO again as their reference:
  ten methods with CI bands in one panel are unreadable."""
  base = [m for m in methods if not m.startswith("csa")]
  csa = [m for m in methods if m.startswith("csa")]
  ref = ["grpo"] if "grpo" in methods else []
  return [p for p in (base, ref + csa if csa else []) if p]


def _curve_plot(curves: dict[str, tuple], methods: list[str], png: str, *, ylabel: str,
                title: str) -> None:
  """One line per method with its CI band; the axis stays on [0, 1], where a success rate
  lives, so a band cut at the edge is one that reaches past it (few seeds)."""
  plt = _plt()
  groups = panels(methods) or [[]]
  fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups) + 0.6, 4.6), dpi=120,
                           sharey=True, squeeze=False)
  for ax, group in zip(axes[0], groups):
    for m in group:
      x, y, lo, hi = curves[m]
      if len(x) == 0:
        continue
      st = method_style(m, methods)
      ax.plot(x, y, marker="o" if len(x) < 15 else None, ms=3, lw=1.6, label=m, **st)
      if np.isfinite(lo).all():
        ax.fill_between(x, lo, hi, color=st["color"], alpha=0.12, lw=0)
    ax.set_xlabel("environment interactions in RL training")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if group:
      ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=8,
                frameon=False)
  axes[0][0].set_ylabel(ylabel)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def plot_final(rows: list[dict[str, Any]], per_seed: dict[str, list[float]], png: str) -> None:
  """Paired change from the SFT start per method: mean, 95% CI whiskers, each seed's dot."""
  plt = _plt()
  rows = [r for r in rows if r["method"] != SFT]
  methods = [r["method"] for r in rows]
  fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(rows) + 1.5), 4.0), dpi=120)
  ax.axhline(0.0, color="black", lw=0.8)
  for i, r in enumerate(rows):
    st = method_style(r["method"], methods)
    m, lo, hi = (r.get(f"delta_vs_sft_{k}", NAN) for k in ("mean", "ci_low", "ci_high"))
    dots = per_seed.get(r["method"], [])
    ax.plot([i + 0.18] * len(dots), dots, ".", color="0.55", ms=4)
    if np.isfinite(lo):
      ax.errorbar(i, m, yerr=[[m - lo], [hi - m]], fmt="none", ecolor=st["color"], capsize=4,
                  lw=1.5)
    ax.plot(i, m, "o" if st["linestyle"] == "-" else "s", color=st["color"], ms=7)
  ax.set_xticks(range(len(rows)), methods, rotation=35, ha="right", fontsize=8)
  ax.set_ylabel("held-out success (sampled) - SFT start")
  ax.set_title("final success minus the SFT start, paired by seed\n"
               "(mean and 95% CI; grey: the seeds)", fontsize=9)
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def write_plots(runs: list[Run], rows: list[dict[str, Any]], out_dir: str) -> list[str]:
  by_method: dict[str, list[Run]] = {}
  for r in runs:
    by_method.setdefault(r.method, []).append(r)
  methods = order_methods(set(by_method))
  sft = {r.seed: r.final.get("eval_sampled/success", NAN) for r in by_method.get(SFT, [])}
  paths = [os.path.join(out_dir, p) for p in PLOTS]
  _curve_plot({m: learning_curve(by_method[m], sft) for m in methods}, methods, paths[0],
              ylabel="held-out success (sampled)",
              title="held-out success vs env interactions (mean over seeds, 95% CI)")
  _curve_plot({m: training_curve(by_method[m]) for m in methods}, methods, paths[1],
              ylabel="training-rollout success",
              title=f"training rollouts ({SMOOTH_ITERS}-iteration moving average, 95% CI)")
  per_seed = {m: paired_deltas({r.seed: r.final.get("eval_sampled/success", NAN)
                                for r in by_method[m]}, sft) for m in methods}
  plot_final(rows, per_seed, paths[2])
  return paths


# ----------------------------------------------------------------------------- markdown


def fmt_ci(m: Any, lo: Any, hi: Any, digits: int = 3) -> str:
  """`0.512 [0.47, 0.55]`; the mean alone where the interval does not exist."""
  if m is None or not np.isfinite(m):
    return ""
  if lo is None or not (np.isfinite(lo) and np.isfinite(hi)):
    return f"{m:.{digits}f}"
  return f"{m:.{digits}f} [{lo:.{digits - 1}f}, {hi:.{digits - 1}f}]"


def _fmt(v: Any, spec: str) -> str:
  return format(v, spec) if v is not None and np.isfinite(v) else ""


def markdown_table(rows: list[dict[str, Any]]) -> str:
  ci = lambda r, k: fmt_ci(r.get(f"{k}_mean"), r.get(f"{k}_ci_low"), r.get(f"{k}_ci_high"))
  head = ["method", "seeds", "success (sampled)", "vs SFT", "vs GRPO", "success (greedy)",
          "greedy vs SFT", "length (sampled)", "invalid (sampled)", "credit Spearman",
          "s / iter", "adv share"]
  lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
  for r in rows:
    cells = [r["method"], str(r["seeds"]), ci(r, "sampled_success"), ci(r, "delta_vs_sft"),
             ci(r, "delta_vs_grpo"), ci(r, "greedy_success"), ci(r, "greedy_delta_vs_sft"),
             _fmt(r.get("sampled_episode_len_mean"), ".2f"),
             _fmt(r.get("sampled_invalid_action_frac_mean"), ".3f"),
             ci(r, "credit_spearman"), _fmt(r.get("wall_s_per_iter_mean"), ".2f"),
             _fmt(r.get("adv_share_mean"), ".1%")]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _distinct(runs: list[Run], key: str) -> str:
  show = lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
  vals = sorted({show(config_value(r.config, key)) for r in runs})
  return " / ".join(vals) + (" (differs across runs)" if len(vals) > 1 else "")


def inventory(runs: list[Run], unfinished: list[str]) -> str:
  seeds: dict[str, list[int]] = {}
  for r in runs:
    seeds.setdefault(r.method, []).append(r.seed)
  lines = ["| run | finished seeds |", "|---|---|"]
  lines += [f"| {m} | {', '.join(map(str, sorted(seeds[m])))} |"
            for m in ([SFT] if SFT in seeds else []) + order_methods(set(seeds))]
  rl = [r for r in runs if r.method != SFT] or runs
  lines += ["",
            f"Unfinished runs ignored: {len(unfinished)}"
            + (f" ({', '.join(unfinished)})." if unfinished else "."),
            "",
            f"- environment: `{_distinct(rl, 'env.name')}` with `{_distinct(rl, 'env.kwargs')}`",
            f"- RL iterations per run: {_distinct(rl, 'rl_iterations')}, each of "
            f"{_distinct(rl, 'rollout.tasks_per_iter')} tasks x G = "
            f"{_distinct(rl, 'rollout.group_size')} rollouts",
            f"- held-out evaluation: {_distinct(rl, 'eval.num_episodes')} episodes per policy"]
  return "\n".join(lines)


def _read_optional(path: str) -> str | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read()


def markdown(name: str, study_dir: str, runs: list[Run], unfinished: list[str],
             rows: list[dict[str, Any]]) -> str:
  commands = _read_optional(os.path.join(study_dir, "commands.txt"))
  notes = _read_optional(os.path.join(study_dir, "notes.md"))
  parts = [
      f"# Study `{name}`",
      "Generated by `python -m experiments.report --name " + name + "` from "
      f"`{name}/runs/`; regenerate it rather than edit it (the verdict lives in "
      f"`{name}/notes.md`).",
      "## Reproduce",
      f"```bash\n{commands.rstrip()}\n```" if commands is not None
      else f"No commands recorded (`{name}/commands.txt` is absent).",
      "## Runs",
      inventory(runs, unfinished),
      "## Results",
      "Final held-out success after RL, with actions sampled at the rollout temperature "
      "(the policy RL optimises) and greedy. Mean over seeds and 95% Student-t interval "
      "`mean [low, high]`. Changes are paired by seed: each RL run minus the SFT start it "
      "began from (\"vs SFT\"), or minus GRPO of the same seed (\"vs GRPO\"). Credit "
      "Spearman: rank correlation of the step advantages with the oracle step labels, "
      "averaged over a run's iterations. s / iter: rollout + advantages + update, "
      f"evaluations excluded; adv share: the advantages' part of it. Also in "
      f"`{name}/summary.csv`.",
      markdown_table(rows),
      f"![held-out success vs env interactions]({name}/learning_curves.png)",
      f"![training-rollout success vs env interactions]({name}/training_curves.png)",
      f"![final success change from SFT]({name}/final_success.png)",
      "## Verdict and notes",
      notes.rstrip() if notes is not None else f"No notes yet (`{name}/notes.md` is absent).",
  ]
  return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- main


def write_report(reports_dir: str, name: str) -> list[str]:
  """Writes the CSV, the plots and the Markdown page; returns their paths."""
  study_dir = os.path.join(reports_dir, name)
  runs_dir = os.path.join(study_dir, "runs")
  if not os.path.isdir(runs_dir):
    raise SystemExit(f"no runs directory {runs_dir}")
  runs, unfinished = load_runs(runs_dir)
  rows = summarize(runs)
  csv_path = os.path.join(study_dir, "summary.csv")
  write_csv(rows, csv_path)
  pngs = write_plots(runs, rows, study_dir)
  md_path = os.path.join(reports_dir, f"{name}.md")
  with open(md_path, "w") as f:
    f.write(markdown(name, study_dir, runs, unfinished, rows))
  return [csv_path, *pngs, md_path]


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--name", required=True, help="study name: reads reports/NAME/runs/")
  p.add_argument("--reports-dir", default="reports")
  args = p.parse_args(argv)
  for path in write_report(args.reports_dir, args.name):
    print(path)


if __name__ == "__main__":
  main()
