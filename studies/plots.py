"""The figures of a study report: held-out learning curves, training curves, the final
change from the SFT start and, where runs have a horizon, the difference to GRPO against
the horizon; a row of panels per (family, horizon) group. PNGs without a time stamp, so an
unchanged study redraws identical files.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

from studies.runs import (REFERENCES, SAMPLED, SFT, Run, csv_cell, final_rate, group_label,
                          group_runs, order_methods)
from studies.confirm import Beside, beside_deltas, curve_by_step
from studies.stats import DIFF, NAN, RATE, band, mean_ci, paired_deltas, smooth

PLOTS = ("learning_curves.png", "training_curves.png", "final_success.png")
HORIZON_PLOT = "delta_vs_grpo_by_horizon.png"
BESIDE_PLOT = "beside_by_horizon.png"
SMOOTH_ITERS = 5  # moving-average window of the training curves, in iterations


# ----------------------------------------------------------------------------- curves


def eval_points(run: Run, prefix: str = SAMPLED) -> dict[int, tuple[float, float]]:
  """Iteration -> (env steps so far, held-out success) for the RL run's evaluations."""
  return {s: (m["perf/env_steps_total"], m[f"{prefix}/success"]) for s, m in run.steps.items()
          if s > 0 and f"{prefix}/success" in m and "perf/env_steps_total" in m}


def varying_tasks(run: Run) -> bool:
  """Whether the run's sampled evaluations ran different task sets (intermediate ones on
  fewer tasks than the final one)."""
  sets = {frozenset(ep) for (policy, _), ep in (run.episodes or {}).items() if policy == SAMPLED}
  return len(sets) > 1


def learning_curve(runs: list[Run], sft: dict[int, float], prefix: str = SAMPLED,
                   sft_runs: dict[int, Run] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Held-out success per evaluation, aligned by iteration over the seeds (their env-step
  counts differ a little), at the seeds' mean env-step count; the SFT start at x = 0.
  Where a run's sampled evaluations ran different tasks, its curve is over the tasks every
  one of them ran (`confirm.curve_by_step`), so that its points differ by the policy alone."""
  runs = [r for r in runs if r.seed in sft]
  if not runs:
    return (np.zeros(0),) * 4
  if prefix == SAMPLED and any(map(varying_tasks, runs)):
    pts = [curve_by_step(r, (sft_runs or {}).get(r.seed)) for r in runs]
    its = sorted(set.intersection(*(set(p) for p in pts)))
    x_SxP = np.array([[p[i][0] for i in its] for p in pts])
    y_SxP = np.array([[p[i][1] for i in its] for p in pts])
    return (x_SxP.mean(0), *band(y_SxP, bounds=RATE))
  pts = [eval_points(r, prefix) for r in runs]
  its = sorted(set.intersection(*(set(p) for p in pts)))
  x_SxP = np.array([[0.0] + [p[i][0] for i in its] for p in pts])
  y_SxP = np.array([[sft[r.seed]] + [p[i][1] for i in its] for r, p in zip(runs, pts)])
  return (x_SxP.mean(0), *band(y_SxP, bounds=RATE))


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
  return (grid, *band(np.stack([np.interp(grid, x, y) for x, y in curves]), bounds=RATE))


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


def pyplot():
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


@dataclasses.dataclass
class CurveRow:
  """One group's curves in a figure: a row of panels."""
  title: str
  methods: list[str]
  curves: dict[str, tuple]


def _curve_plot(rows: list[CurveRow], png: str, *, ylabel: str, title: str) -> None:
  """One line per method with its CI band, a row of panels per group; the axis stays on
  [0, 1], where a success rate lives, so a band cut at the edge is one that reaches it."""
  plt = pyplot()
  layout = [panels(r.methods) or [[]] for r in rows]
  ncols = max(len(g) for g in layout)
  fig, axes = plt.subplots(len(rows), ncols, figsize=(5.2 * ncols + 0.6, 4.6 * len(rows)),
                           dpi=120, sharey=True, squeeze=False)
  for row, groups, ax_row in zip(rows, layout, axes):
    for ax in ax_row[len(groups):]:
      ax.set_visible(False)
    for ax, group in zip(ax_row, groups):
      for m in group:
        x, y, lo, hi = row.curves[m]
        if len(x) == 0:
          continue
        st = method_style(m, row.methods)
        ax.plot(x, y, marker="o" if len(x) < 15 else None, ms=3, lw=1.6, label=m, **st)
        if np.isfinite(lo).all():
          ax.fill_between(x, lo, hi, color=st["color"], alpha=0.12, lw=0)
      ax.set_xlabel("environment interactions in RL training")
      ax.set_ylim(-0.02, 1.02)
      ax.grid(alpha=0.3)
      if row.title:
        ax.set_title(row.title, fontsize=9)
      if group:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=8,
                  frameon=False)
    ax_row[0].set_ylabel(ylabel)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def _final_panel(ax, rows: list[dict[str, Any]], per_seed: dict[str, list[float]]) -> None:
  """Paired change from the SFT start per method: mean, 95% CI whiskers, each seed's dot."""
  rows = [r for r in rows if r["method"] not in REFERENCES]
  methods = [r["method"] for r in rows]
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
  ax.grid(axis="y", alpha=0.3)


def plot_final(groups: list[tuple[str, list[dict[str, Any]], dict[str, list[float]]]],
               png: str) -> None:
  """`_final_panel` per group (title, its summary rows, its per-seed deltas), side by side."""
  plt = pyplot()
  width = sum(max(5.0, 0.7 * sum(r["method"] not in REFERENCES for r in rows) + 1.5)
              for _, rows, _ in groups)
  fig, axes = plt.subplots(1, len(groups), figsize=(width, 4.0), dpi=120, sharey=True,
                           squeeze=False)
  title = "final success minus the SFT start, paired by seed\n(mean and 95% CI; grey: the seeds)"
  for ax, (label, rows, per_seed) in zip(axes[0], groups):
    _final_panel(ax, rows, per_seed)
    ax.set_title(label or title, fontsize=9)
  if any(label for label, _, _ in groups):  # one title over the groups' panels
    fig.suptitle(title.replace("\n", " "), fontsize=10)
  axes[0][0].set_ylabel("held-out success (sampled) - SFT start")
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def plot_vs_horizon(rows: list[dict[str, Any]], png: str) -> None:
  """Each method's paired difference to GRPO against the horizon, 95% CI whiskers; the
  x axis is logarithmic (horizons such as 4, 16, 48) with the horizons as its ticks, and
  a method's points are shifted a little sideways so that whiskers do not overlap."""
  plt = pyplot()
  rows = [r for r in rows if r["horizon"] is not None and r["method"] not in (SFT, "grpo")
          and np.isfinite(r.get("delta_vs_grpo_mean", NAN))]
  methods = order_methods({r["method"] for r in rows})
  horizons = sorted({r["horizon"] for r in rows})
  fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
  ax.axhline(0.0, color="black", lw=0.8, label="grpo (reference)")
  for i, m in enumerate(methods):
    pts = sorted((r["horizon"], r) for r in rows if r["method"] == m)
    shift = math.exp(0.035 * (i - (len(methods) - 1) / 2))
    x = np.array([h for h, _ in pts], np.float64) * shift
    y, lo, hi = (np.array([r.get(f"delta_vs_grpo_{k}", NAN) for _, r in pts], np.float64)
                 for k in ("mean", "ci_low", "ci_high"))
    st = method_style(m, methods)
    ax.plot(x, y, marker="o" if st["linestyle"] == "-" else "s", ms=6, lw=1.4, label=m, **st)
    ok = np.isfinite(lo) & np.isfinite(hi)
    ax.errorbar(x[ok], y[ok], yerr=[y[ok] - lo[ok], hi[ok] - y[ok]], fmt="none",
                ecolor=st["color"], capsize=3, lw=1.2)
  ax.set_xscale("log")
  ax.set_xticks(horizons, [csv_cell(h) for h in horizons])
  ax.minorticks_off()
  if horizons:
    ax.set_xlim(horizons[0] / 1.4, horizons[-1] * 1.4)
  ax.set_xlabel("horizon (env.kwargs.horizon, log scale)")
  ax.set_ylabel("held-out success (sampled) - GRPO, paired by seed")
  ax.set_title("difference to GRPO against the horizon (mean over seeds, 95% CI)", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=8,
            frameon=False)
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def plot_beside(runs: list[Run], beside: Beside, png: str) -> None:
  """A panel per comparison of `beside.json`: its paired difference against the horizon in
  this study (solid) and in the one it names (dashed), 95% CI whiskers over seeds."""
  plt = pyplot()
  spec, data = beside[0], beside_deltas(runs, beside)
  comps = list(dict.fromkeys((a, b) for a, b, _, _ in data))
  fig, axes = plt.subplots(1, max(1, len(comps)), figsize=(4.0 * max(1, len(comps)), 4.0),
                           dpi=120, squeeze=False)
  studies = ((spec["this"], "-", "o", "tab:blue"),
             (f"{spec['that']} ({spec['study']})", "--", "s", "tab:orange"))
  for ax, (a, b) in zip(axes[0], comps):
    pts = [(h, per) for a2, b2, h, per in data if (a2, b2) == (a, b) and h is not None]
    for j, (label, ls, marker, color) in enumerate(studies):
      stats = [(h * math.exp(0.04 * (j - 0.5)), *mean_ci(per[j][0], bounds=DIFF))
               for h, per in pts]
      if not stats:
        continue
      x, y, lo, hi = (np.array(v, np.float64) for v in zip(*stats))
      ok = np.isfinite(y)
      ax.plot(x[ok], y[ok], ls=ls, marker=marker, color=color, lw=1.4, label=label)
      ok &= np.isfinite(lo) & np.isfinite(hi)
      ax.errorbar(x[ok], y[ok], yerr=[y[ok] - lo[ok], hi[ok] - y[ok]], fmt="none",
                  ecolor=color, capsize=3, lw=1.2)
    horizons = sorted(h for h, _ in pts)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(horizons, [csv_cell(h) for h in horizons])
    ax.minorticks_off()
    if horizons:
      ax.set_xlim(horizons[0] / 1.4, horizons[-1] * 1.4)
    ax.set_title(f"{a} - {b}", fontsize=9)
    ax.set_xlabel("horizon (log scale)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(f"{spec['metric']} difference, paired by seed")
  axes[0][0].legend(fontsize=8, loc="best")
  fig.suptitle(f"this study beside {spec['study']} (mean over seeds, 95% CI)", fontsize=10)
  fig.tight_layout()
  fig.savefig(png, metadata={"Software": None})
  plt.close(fig)


def figure_names(rows: list[dict[str, Any]], beside: bool = False) -> list[str]:
  """The figures `write_plots` draws for these summary rows: the three, the difference to
  GRPO against the horizon where a method other than GRPO has one at some horizon, and
  the study beside this one where one is named."""
  vs_horizon = any(r["horizon"] is not None and np.isfinite(r.get("delta_vs_grpo_mean", NAN))
                   and r["method"] != "grpo" for r in rows)
  return (list(PLOTS) + ([HORIZON_PLOT] if vs_horizon else [])
          + ([BESIDE_PLOT] if beside else []))


def write_plots(runs: list[Run], rows: list[dict[str, Any]], out_dir: str,
                beside: Beside | None = None) -> list[str]:
  """The three figures (a row or panel per group), where the runs have a horizon and GRPO
  ran the difference to GRPO against the horizon, and the study `beside` this one where one
  is named; returns their paths."""
  groups = group_runs(runs)
  keys = list(groups)
  curves, training, finals = [], [], []
  for key, group in groups.items():
    by_method: dict[str, list[Run]] = {}
    for r in group:
      by_method.setdefault(r.method, []).append(r)
    methods = order_methods(set(by_method))
    sft = {r.seed: final_rate(r, SAMPLED)[0] for r in by_method.get(SFT, [])}
    label = group_label(key, keys)
    sft_runs = {r.seed: r for r in by_method.get(SFT, [])}
    curves.append(CurveRow(label, methods, {m: learning_curve(by_method[m], sft,
                                                              sft_runs=sft_runs)
                                            for m in methods}))
    training.append(CurveRow(label, methods, {m: training_curve(by_method[m])
                                              for m in methods}))
    per_seed = {m: paired_deltas({r.seed: final_rate(r, SAMPLED)[0] for r in by_method[m]},
                                 sft) for m in methods}
    finals.append((label, [r for r in rows if (r["family"], r["horizon"]) == key], per_seed))
  paths = [os.path.join(out_dir, p) for p in figure_names(rows, beside is not None)]
  _curve_plot(curves, paths[0], ylabel="held-out success (sampled)",
              title="held-out success vs env interactions (mean over seeds, 95% CI)")
  _curve_plot(training, paths[1], ylabel="training-rollout success",
              title=f"training rollouts ({SMOOTH_ITERS}-iteration moving average, 95% CI)")
  plot_final(finals, paths[2])
  if HORIZON_PLOT in map(os.path.basename, paths):
    plot_vs_horizon(rows, os.path.join(out_dir, HORIZON_PLOT))
  if beside is not None:
    plot_beside(runs, beside, os.path.join(out_dir, BESIDE_PLOT))
  return paths

