"""The credit-accuracy study's report: analysed directories -> reports/NAME.md, CSV, plots.

    python -m studies.credit --report runs/credit/study/* --name credit
    python -m studies.credit --report reports/credit/runs/*    # from the committed runs

Reads each directory's `meta.json` and `results.csv` (written by `studies.credit`),
copies them under reports/NAME/runs/RUN/ (small; the rollouts .npz stay under runs/), writes
reports/NAME/summary.csv, one PNG of every metric per run at G = 8 and one of each metric
against G, and the page reports/NAME.md. The verdict is read from reports/NAME/verdict.md
(written by a person from the numbers), so regenerating the tables never overwrites it.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from studies.credit_table import COLUMNS, ESTIMATORS, LABEL_MEANING, read_csv, write_csv
from studies.plots import pyplot

METRIC_NAMES = {"spearman": "Spearman (all steps)", "spearman_failed": "Spearman (failed eps.)",
                "spearman_won": "Spearman (won eps.)", "auc": "AUC progress vs rest"}
MAIN_G = 8
AXIS_LABELS = {"spearman": "Spearman rho, advantage vs oracle label",
               "spearman_failed": "Spearman rho (failed episodes)",
               "spearman_won": "Spearman rho (won episodes)",
               "auc": "AUC, progress steps vs the rest"}
# Bar colours by estimator family (the legend of the metrics plot).
FAMILY_COLOURS = (("CSA variants", "tab:red"), ("GiGPO", "tab:blue"),
                  ("episode-level (GRPO, RLOO, ...)", "tab:gray"))


def _colour(est: str) -> str:
  return "tab:red" if est.startswith("csa") else "tab:blue" if "gigpo" in est else "tab:gray"


NA_TEXT = {"spearman_won": "n/a: no won episodes\nwith labelled steps",
           "spearman_failed": "n/a: no failed episodes\nwith labelled steps"}


def _na(ax, metric: str) -> None:
  """A panel without data: says so, with no axis to misread as zero."""
  ax.text(0.5, 0.5, NA_TEXT.get(metric, "n/a: too few labelled steps"), transform=ax.transAxes,
          ha="center", va="center", fontsize=9, color="0.4")
  ax.set_yticks([])


def _ci(v, lo, hi) -> str:
  if not np.isfinite(v):
    return "n/a"
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return f"{v:+.3f}"
  return f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def load(dirs: list[str]) -> list[tuple[dict, list[dict]]]:
  out = []
  for d in dirs:
    if not os.path.exists(os.path.join(d, "results.csv")):
      continue
    with open(os.path.join(d, "meta.json")) as f:
      meta = json.load(f)
    meta["run"] = os.path.basename(os.path.normpath(d))
    out.append((meta, read_csv(os.path.join(d, "results.csv"))))
  return out


def runs_table(runs) -> str:
  lines = ["| run | env | policy | checkpoint | groups x G | success | steps | labelled | "
           "progress steps (label > 0) | collect s |", "|" + "---|" * 10]
  for meta, rows in runs:
    r = next(x for x in rows if x["G"] == max(y["G"] for y in rows))
    lines.append(f"| {meta['run']} | {meta['env']} | {meta['which']} | {meta['checkpoint']} | "
                 f"{meta['groups']} x {meta['group_size']} | {meta['success']:.3f} | "
                 f"{meta['env_steps']} | {meta['labelled_steps']} | {int(r['progress_steps'])} "
                 f"({r['progress_steps'] / max(r['steps'], 1):.1%}) | {meta['collect_seconds']} |")
  return "\n".join(lines)


def _ci_table(rows: list[dict], g: int, first: str, estimators, value: str, lo: str,
              hi: str) -> str:
  """Estimators x metrics at group size g, each cell `value [lo, hi]` of those columns."""
  sel = [r for r in rows if r["G"] == g]
  lines = [f"| {first} | " + " | ".join(METRIC_NAMES.values()) + " |",
           "|" + "---|" * (len(METRIC_NAMES) + 1)]
  for est in estimators:
    cells = []
    for m in METRIC_NAMES:
      r = next((x for x in sel if x["estimator"] == est and x["metric"] == m), None)
      cells.append("" if r is None else _ci(r[value], r[lo], r[hi]))
    lines.append(f"| {est} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def metric_table(rows: list[dict], g: int) -> str:
  return _ci_table(rows, g, "estimator", ESTIMATORS, "value", "lo", "hi")


def delta_table(rows: list[dict], g: int) -> str:
  return _ci_table(rows, g, "estimator - grpo", [e for e in ESTIMATORS if e != "grpo"],
                   "delta_vs_grpo", "delta_lo", "delta_hi")


def g_table(rows: list[dict], metric: str) -> str:
  gs = sorted({int(r["G"]) for r in rows})
  lines = ["| estimator | " + " | ".join(f"G = {g}" for g in gs) + " |", "|" + "---|" * (len(gs) + 1)]
  for est in ESTIMATORS:
    cells = []
    for g in gs:
      r = next((x for x in rows if x["G"] == g and x["estimator"] == est and x["metric"] == metric), None)
      cells.append("" if r is None else _ci(r["value"], r["lo"], r["hi"]))
    lines.append(f"| {est} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_metrics(runs, g: int, png: str) -> None:
  """Every estimator's value of each metric at group size g, one row of panels per run,
  with 95% bootstrap intervals; a panel without data says n/a (no bars drawn as zero),
  and so does a single estimator without a value."""
  plt = pyplot()
  from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel
  ests = list(ESTIMATORS)
  fig, axes = plt.subplots(len(runs), len(METRIC_NAMES), figsize=(4 * len(METRIC_NAMES), 2.9 * len(runs) + 0.5),
                           squeeze=False)
  for i, (meta, rows) in enumerate(runs):
    for j, (m, title) in enumerate(METRIC_NAMES.items()):
      ax = axes[i][j]
      vals = [next((r for r in rows if r["G"] == g and r["estimator"] == e and r["metric"] == m), None)
              for e in ests]
      v = np.array([r["value"] if r else np.nan for r in vals], np.float64)
      lo = np.array([r["lo"] if r else np.nan for r in vals], np.float64)
      hi = np.array([r["hi"] if r else np.nan for r in vals], np.float64)
      ax.set_title(f"{meta['run']}: {title}", fontsize=8)
      ax.set_ylabel(AXIS_LABELS[m], fontsize=7)
      ax.set_xticks(range(len(ests)))
      ax.set_xticklabels(ests, rotation=70, fontsize=7)
      if not np.isfinite(v).any():
        _na(ax, m)
        continue
      ok = np.isfinite(v)
      err = np.nan_to_num(np.vstack([v - lo, hi - v]), nan=0.0)
      ax.bar(np.arange(len(ests))[ok], v[ok], yerr=err[:, ok], capsize=2,
             color=[_colour(e) for e, k in zip(ests, ok) if k])
      ax.axhline(0.5 if m == "auc" else 0.0, color="k", lw=0.6)
      for x in np.flatnonzero(~ok):
        ax.text(x, 0.5 if m == "auc" else 0.0, "n/a", ha="center", va="bottom", fontsize=6,
                rotation=90, color="0.4")
  fig.legend(handles=[Patch(color=c, label=name) for name, c in FAMILY_COLOURS],
             loc="upper center", ncol=len(FAMILY_COLOURS), fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
  fig.savefig(png, dpi=110)
  plt.close(fig)


def plot_vs_g(runs, png: str, show=("grpo", "rloo", "csa_lam0.5", "csa_lam1", "csa_step", "gigpo",
                                    "csa_gigpo")) -> None:
  plt = pyplot()
  fig, axes = plt.subplots(len(runs), 2, figsize=(9, 2.9 * len(runs) + 0.5), squeeze=False)
  handles = {}
  for i, (meta, rows) in enumerate(runs):
    for j, m in enumerate(("spearman", "auc")):
      ax = axes[i][j]
      drawn = 0
      for e in show:
        pts = sorted((r["G"], r["value"], r["lo"], r["hi"]) for r in rows
                     if r["estimator"] == e and r["metric"] == m and np.isfinite(r["value"]))
        if pts:
          g, v, lo, hi = map(np.array, zip(*pts))
          handles[e] = ax.errorbar(g, v, yerr=np.nan_to_num(np.vstack([v - lo, hi - v])),
                                   marker="o", label=e, capsize=2,
                                   color=f"C{show.index(e)}")
          drawn += 1
      ax.set_xscale("log", base=2)
      gs = sorted({int(r["G"]) for r in rows})
      ax.set_xticks(gs, [str(x) for x in gs])
      ax.set_xlabel("G (rollouts per group)")
      ax.set_ylabel(AXIS_LABELS[m], fontsize=7)
      ax.set_title(f"{meta['run']}: {METRIC_NAMES[m]}", fontsize=8)
      if not drawn:
        _na(ax, m)
      else:
        ax.axhline(0.5 if m == "auc" else 0.0, color="k", lw=0.6)
  fig.legend(handles=[handles[e] for e in show if e in handles], loc="upper center",
             ncol=len(handles) or 1, fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
  fig.savefig(png, dpi=110)
  plt.close(fig)


def write_report(dirs: list[str], name: str, reports_dir: str = "reports") -> str:
  runs = load(dirs)
  if not runs:
    raise SystemExit(f"no analysed directories among {dirs}")
  out_dir = os.path.join(reports_dir, name)
  os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
  all_rows = []
  for meta, rows in runs:
    dst = os.path.join(out_dir, "runs", meta["run"])
    os.makedirs(dst, exist_ok=True)
    src = next(d for d in dirs if os.path.basename(os.path.normpath(d)) == meta["run"])
    for f in ("meta.json", "results.csv"):
      if os.path.exists(os.path.join(dst, f)) and os.path.samefile(os.path.join(src, f),
                                                                   os.path.join(dst, f)):
        continue  # regenerating from the committed copies (reports/NAME/runs/*)
      shutil.copy(os.path.join(src, f), dst)
    all_rows += rows
  write_csv(all_rows, os.path.join(out_dir, "summary.csv"))
  plot_metrics(runs, MAIN_G, os.path.join(out_dir, f"metrics_G{MAIN_G}.png"))
  plot_vs_g(runs, os.path.join(out_dir, "vs_G.png"))
  verdict_path = os.path.join(out_dir, "verdict.md")
  verdict = open(verdict_path).read().strip() if os.path.exists(verdict_path) else "(not written yet)"
  md = [f"# Step-level credit accuracy: every estimator on the same rollouts\n",
        "Generated by `python -m studies.credit --report ...` from the directories below; "
        f"the verdict is `reports/{name}/verdict.md`. CSV: `reports/{name}/summary.csv` "
        f"(columns: {', '.join(COLUMNS)}).\n",
        "## Verdict\n", verdict, "\n## Labels\n"]
  for env in sorted({m["env_name"] for m, _ in runs}):
    md.append(f"- `{env}`: {LABEL_MEANING.get(env, 'see the environment module')}")
  md += ["\n## Runs\n", runs_table(runs), "\n## Commands\n", "```bash"]
  md += [m["command"] for m, _ in runs]
  md += [f"python -m studies.credit --report {' '.join(sorted(dirs))} --name {name}", "```\n"]
  for meta, rows in runs:
    gs = sorted({int(r["G"]) for r in rows})
    g = MAIN_G if MAIN_G in gs else gs[-1]
    md += [f"## {meta['run']} ({meta['env']}, {meta['which']}, success {meta['success']:.3f})\n",
           f"Value on all {meta['groups']} groups, bootstrap 95% interval over groups; G = {g}.\n",
           metric_table(rows, g), "",
           f"Paired difference to GRPO (same bootstrap draws), G = {g}:\n", delta_table(rows, g), "",
           "Spearman (all steps) against G (first G rollouts of each group):\n",
           g_table(rows, "spearman"), "", "AUC against G:\n", g_table(rows, "auc"), ""]
  md += [f"![metrics at G = {MAIN_G}]({name}/metrics_G{MAIN_G}.png)\n",
         f"![against G]({name}/vs_G.png)\n"]
  path = os.path.join(reports_dir, f"{name}.md")
  with open(path, "w") as f:
    f.write("\n".join(md))
  print(f"wrote {path}, {out_dir}/summary.csv and plots")
  return path
