"""Study report: tables, plots and a Markdown page for a sweep of methods x seeds.

    python -m studies.report --name NAME [--reports-dir reports]

Reads `reports/NAME/runs/`: one directory per run (`runs/RUN/`), or, for a study of several
experiment families such as the horizon study, one directory per family holding its runs
(`runs/FAMILY/RUN/`). A run directory has `config.json`, `metrics.jsonl` and, where the
run wrote one, `eval/episodes.jsonl` (one line per evaluated episode).
`sft_seed<k>` is the shared SFT start of seed k (its step-0 line holds the held-out
evaluation), `<method>_seed<k>` an RL run from that start. Only finished runs (those with
a `DONE` file) count; the page says how many others were ignored. Runs are grouped by
family and horizon (config `env.kwargs.horizon`, blank where the environment has none),
and every comparison is made within a group and a seed. Writes

- `reports/NAME/summary.csv`: one row per (method, horizon): the final held-out success
  with actions sampled (the policy RL optimises) and greedy, its change from the SFT start
  and from GRPO paired by seed, the same changes paired per task from the episodes,
  episode length, invalid actions, credit accuracy (Spearman, and the decisive step's AUC)
  and the cost of an iteration. Means over seeds with 95% Student-t intervals truncated to
  the parameter space; an empty cell is a value that does not exist (a delta of the SFT
  row, an interval from one seed, a per-task comparison without episode files);
- `reports/NAME/per_run.csv`: each run's final success with a 95% Wilson interval over its
  episodes, and the code commit it ran (config.json `provenance`) with its tree's state;
- `learning_curves.png`, `training_curves.png`, `final_success.png` (one row of panels per
  horizon) and, where runs have a horizon, `delta_vs_grpo_by_horizon.png`;
- `reports/NAME.md`: the reproduce commands (`reports/NAME/commands.txt`), the run
  inventory and budget (with the code commits and any run from an unclean tree), the
  table, the plots, the registered tests and the learning curves' summaries where the
  study registers tests, and the verdict (`reports/NAME/notes.md`), the commands and the
  notes copied verbatim;
- `reports/NAME/confirm.md`, where the study registers tests (`reports/NAME/tests.json`):
  `studies.confirm`'s page (Holm-corrected registered families, the sample-efficiency
  summaries with seed-level intervals, every run's commit).

Runs without episode files (older studies) fall back to the rates in metrics.jsonl and
have no per-task comparison. Nothing in the output depends on the time or machine, so
regenerating an unchanged study rewrites identical files.

This module builds the summary rows, the CSVs and the page; `studies.runs` reads the run
files, `studies.stats` holds the statistics and `studies.plots` draws the figures.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
from typing import Any, Sequence

import numpy as np

from studies import confirm
from studies.plots import (BESIDE_PLOT, HORIZON_PLOT, PLOTS, figure_names, varying_tasks,
                           write_plots)
from studies.runs import (EPISODES_FILE, PROMPTED, REFERENCES, SFT, GroupKey, Pairs, Run,
                          config_value, csv_cell, final_outcomes, group_label, group_runs,
                          lead_methods, load_runs, order_methods, pair_outcomes, per_run_row,
                          run_commit, run_scalars, start_outcomes, table_order, task_paired)
from studies.stats import DIFF, RATE, finite_mean, mean_ci, paired_deltas


def _task_columns(ref: str) -> tuple[str, ...]:
  return tuple(f"task_delta_vs_{ref}_{k}" for k in
               ("seeds", "tasks", "mean", "ci_low", "ci_high", "wins", "losses", "sign_p"))


CSV_COLUMNS = (
    "method", "horizon", "seeds",
    "sampled_success_mean", "sampled_success_ci_low", "sampled_success_ci_high",
    "delta_vs_sft_mean", "delta_vs_sft_ci_low", "delta_vs_sft_ci_high",
    "delta_vs_grpo_mean", "delta_vs_grpo_ci_low", "delta_vs_grpo_ci_high",
    "greedy_success_mean", "greedy_success_ci_low", "greedy_success_ci_high",
    "greedy_delta_vs_sft_mean", "greedy_delta_vs_sft_ci_low", "greedy_delta_vs_sft_ci_high",
    "sampled_episode_len_mean", "sampled_invalid_action_frac_mean",
    "credit_spearman_mean", "credit_spearman_ci_low", "credit_spearman_ci_high",
    "wall_s_per_iter_mean", "adv_share_mean", "env_steps_total_mean",
    *_task_columns("sft"), *_task_columns("grpo"),
    "decisive_auc_mean", "decisive_auc_ci_low", "decisive_auc_ci_high",
    "rollout_episode_len_mean", "iteration_s_mean", "adv_frac_of_iteration_mean",
    "family",
)
PER_RUN_COLUMNS = (
    "run", "family", "horizon", "method", "seed", "source",
    "sampled_episodes", "sampled_success", "sampled_wilson_low", "sampled_wilson_high",
    "greedy_episodes", "greedy_success", "greedy_wilson_low", "greedy_wilson_high",
    "commit", "tree",
)


# ----------------------------------------------------------------------------- summary


def _ci_cols(prefix: str, values: Sequence[float], bounds: tuple[float, float] | None
             ) -> dict[str, float]:
  m, lo, hi = mean_ci(values, bounds=bounds)
  return {f"{prefix}_mean": m, f"{prefix}_ci_low": lo, f"{prefix}_ci_high": hi}


def _by_seed(scal: dict[int, dict[str, float]], key: str) -> dict[int, float]:
  return {s: v[key] for s, v in scal.items()}


def _task_cols(prefix: str, seeds: Sequence[Pairs | None]) -> dict[str, float]:
  """The per-task columns over the seeds where both sides have episodes (none: empty)."""
  have = [p for p in seeds if p is not None]
  return {f"{prefix}_{k}": v for k, v in task_paired(have).items()} if have else {}


def method_row(method: str, runs: dict[int, Run], sft: dict[int, Run],
               grpo: dict[int, Run] | None) -> dict[str, Any]:
  """One summary row from a method's runs by seed, the SFT starts and GRPO of one group."""
  seeds = sorted(runs)
  scal = {s: run_scalars(runs[s]) for s in seeds}
  row: dict[str, Any] = {"method": method, "seeds": len(seeds)}
  row |= _ci_cols("sampled_success", [scal[s]["sampled_success"] for s in seeds], RATE)
  row |= _ci_cols("greedy_success", [scal[s]["greedy_success"] for s in seeds], RATE)
  for k in ("sampled_episode_len", "sampled_invalid_action_frac", "wall_s_per_iter",
            "adv_share", "env_steps_total", "rollout_episode_len", "iteration_s",
            "adv_frac_of_iteration"):
    row[f"{k}_mean"] = finite_mean([scal[s][k] for s in seeds])
  if method == SFT:  # the reference itself: no deltas, no RL iterations
    return row
  sft_scal = {s: run_scalars(r) for s, r in sft.items()}
  sampled, greedy = _by_seed(scal, "sampled_success"), _by_seed(scal, "greedy_success")
  row |= _ci_cols("delta_vs_sft", paired_deltas(sampled, _by_seed(sft_scal, "sampled_success")),
                  DIFF)
  row |= _ci_cols("greedy_delta_vs_sft",
                  paired_deltas(greedy, _by_seed(sft_scal, "greedy_success")), DIFF)
  if method == PROMPTED:  # the untrained model against the SFT start of its seed
    return row | _task_cols("task_delta_vs_sft",
                            [_pair_final(runs[s], sft.get(s)) for s in seeds])
  row |= _task_cols("task_delta_vs_sft", [_pair_start(runs[s], sft.get(s)) for s in seeds])
  if grpo is not None:
    grpo_sampled = {s: run_scalars(r)["sampled_success"] for s, r in grpo.items()}
    row |= _ci_cols("delta_vs_grpo", paired_deltas(sampled, grpo_sampled), DIFF)
    row |= _task_cols("task_delta_vs_grpo", [_pair_final(runs[s], grpo.get(s)) for s in seeds])
  row |= _ci_cols("credit_spearman", [scal[s]["credit_spearman"] for s in seeds], DIFF)
  row |= _ci_cols("decisive_auc", [scal[s]["decisive_auc"] for s in seeds], RATE)
  return row


def _pair_start(run: Run, sft: Run | None) -> Pairs | None:
  a, b = final_outcomes(run), start_outcomes(run, sft)
  return None if a is None or b is None else pair_outcomes(a, b, f"{run.label} vs its SFT start")


def _pair_final(run: Run, other: Run | None) -> Pairs | None:
  a, b = final_outcomes(run), final_outcomes(other)
  return None if a is None or b is None else pair_outcomes(a, b, f"{run.label} vs {other.label}")


def group_rows(key: GroupKey, runs: list[Run]) -> list[dict[str, Any]]:
  """The rows of one (family, horizon): the references first (the prompted model, the SFT
  start), then `METHOD_ORDER`."""
  by_method: dict[str, dict[int, Run]] = {}
  for r in runs:
    by_method.setdefault(r.method, {})[r.seed] = r
  sft, grpo = by_method.get(SFT, {}), by_method.get("grpo")
  rows = [method_row(m, by_method[m], sft, None) for m in lead_methods(set(by_method))]
  rows += [method_row(m, by_method[m], sft, grpo) for m in order_methods(set(by_method))]
  family, horizon = key
  return [{"family": family, "horizon": horizon} | r for r in rows]


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
  """Rows of summary.csv, group by group (horizons ascending)."""
  return [row for key, rs in group_runs(runs).items() for row in group_rows(key, rs)]



def csv_text(rows: list[dict[str, Any]], columns: Sequence[str] = CSV_COLUMNS) -> str:
  buf = io.StringIO()
  w = csv.writer(buf, lineterminator="\n")
  w.writerow(columns)
  for r in rows:
    w.writerow([csv_cell(r.get(c)) for c in columns])
  return buf.getvalue()


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


def fmt_p(p: Any) -> str:
  if p is None or not np.isfinite(p):
    return ""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _ci_cell(key: str):
  return lambda r: fmt_ci(r.get(f"{key}_mean"), r.get(f"{key}_ci_low"), r.get(f"{key}_ci_high"))


def _task_cell(ref: str):
  """`+0.052 [0.01, 0.09], p = 0.003 (12:3)`: mean over tasks with its interval, the sign
  test's p and the discordant pairs (wins:losses)."""
  def cell(r: dict[str, Any]) -> str:
    k = f"task_delta_vs_{ref}"
    ci = fmt_ci(r.get(f"{k}_mean"), r.get(f"{k}_ci_low"), r.get(f"{k}_ci_high"))
    if not ci:
      return ""
    return f"{ci}, {fmt_p(r.get(f'{k}_sign_p'))} ({r[f'{k}_wins']}:{r[f'{k}_losses']})"
  return cell


def _mean_cell(key: str, spec: str):
  return lambda r: _fmt(r.get(key), spec)


# (header, cell, always shown): an optional column appears where some row has a value,
# so a study without episode files or horizons keeps its table.
TABLE = (
    ("method", lambda r: r["method"], True),
    ("family", lambda r: r["family"], False),
    ("horizon", lambda r: "" if r["horizon"] is None else csv_cell(r["horizon"]), False),
    ("seeds", lambda r: str(r["seeds"]), True),
    ("success (sampled)", _ci_cell("sampled_success"), True),
    ("vs SFT", _ci_cell("delta_vs_sft"), True),
    ("vs SFT per task", _task_cell("sft"), False),
    ("vs GRPO", _ci_cell("delta_vs_grpo"), True),
    ("vs GRPO per task", _task_cell("grpo"), False),
    ("success (greedy)", _ci_cell("greedy_success"), True),
    ("greedy vs SFT", _ci_cell("greedy_delta_vs_sft"), True),
    ("length (sampled)", _mean_cell("sampled_episode_len_mean", ".2f"), True),
    ("length (training)", _mean_cell("rollout_episode_len_mean", ".2f"), False),
    ("invalid (sampled)", _mean_cell("sampled_invalid_action_frac_mean", ".3f"), True),
    ("credit Spearman", _ci_cell("credit_spearman"), True),
    ("decisive AUC", _ci_cell("decisive_auc"), False),
    ("s / iter", _mean_cell("wall_s_per_iter_mean", ".2f"), True),
    ("adv share", _mean_cell("adv_share_mean", ".1%"), True),
    ("iteration s", _mean_cell("iteration_s_mean", ".2f"), False),
    ("adv / iteration", _mean_cell("adv_frac_of_iteration_mean", ".1%"), False),
)


def shown_columns(rows: list[dict[str, Any]]) -> list[str]:
  """The headers of TABLE that the page shows for these rows."""
  keys = {(r["family"], r["horizon"]) for r in rows}
  out = []
  for header, cell, always in TABLE:
    if header == "family":  # only where the horizon does not tell the groups apart
      show = len(keys) > len({h for _, h in keys})
    else:
      show = always or any(cell(r) for r in rows)
    out += [header] if show else []
  return out


def markdown_table(rows: list[dict[str, Any]]) -> str:
  head = shown_columns(rows)
  cells = {h: cell for h, cell, _ in TABLE}
  lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
  return "\n".join(lines + ["| " + " | ".join(cells[h](r) for h in head) + " |" for r in rows])


def _distinct(runs: list[Run], key: str) -> str:
  show = lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
  vals = sorted({show(config_value(r.config, key)) for r in runs})
  return " / ".join(vals) + (" (differs across runs)" if len(vals) > 1 else "")


def inventory(runs: list[Run], unfinished: list[str]) -> str:
  groups = group_runs(runs)
  keys = list(groups)
  labelled = any(group_label(k, keys) for k in keys)
  lines = (["| group | run | finished seeds |", "|---|---|---|"] if labelled
           else ["| run | finished seeds |", "|---|---|"])
  for key, group in groups.items():
    seeds: dict[str, list[int]] = {}
    for r in group:
      seeds.setdefault(r.method, []).append(r.seed)
    for m in lead_methods(set(seeds)) + order_methods(set(seeds)):
      cells = ([group_label(key, keys)] if labelled else []) + [
          m, ", ".join(map(str, sorted(seeds[m])))]
      lines.append("| " + " | ".join(cells) + " |")
  rl = [r for r in runs if r.method not in REFERENCES] or runs
  lines += ["",
            f"Unfinished runs ignored: {len(unfinished)}"
            + (f" ({', '.join(unfinished)})." if unfinished else "."),
            "",
            f"- environment: `{_distinct(rl, 'env.name')}` with `{_distinct(rl, 'env.kwargs')}`",
            f"- RL iterations per run: {_distinct(rl, 'rl_iterations')}, each of "
            f"{_distinct(rl, 'rollout.tasks_per_iter')} tasks x G = "
            f"{_distinct(rl, 'rollout.group_size')} rollouts",
            f"- held-out evaluation: {_distinct(rl, 'eval.num_episodes')} episodes per policy"]
  if any(config_value(r.config, "rl_env_steps") for r in rl):
    lines.append(f"- RL environment-step budget (rl_env_steps): {_distinct(rl, 'rl_env_steps')}")
  if any(config_value(r.config, "eval.every") for r in rl):
    # eval.every_episodes unset or 0: every evaluation runs eval.num_episodes.
    sizes = sorted({config_value(r.config, "eval.every_episodes")
                    or config_value(r.config, "eval.num_episodes") for r in rl}, key=str)
    lines.append(f"- held-out evaluations during RL: every {_distinct(rl, 'eval.every')} "
                 f"iterations, {' / '.join(map(str, sizes))} episodes each; the most "
                 f"iterations between two evaluations of a run: {max(map(eval_gap, rl))}"
                 + ("; the held-out curves are over the tasks every evaluation of a run ran"
                    if any(map(varying_tasks, rl)) else ""))
  episodes = sum(r.episodes is not None for r in runs)
  lines += [f"- per-episode outcomes ({EPISODES_FILE}): {episodes} of {len(runs)} runs",
            code_line(runs)]
  return "\n".join(lines)


def eval_gap(run: Run) -> int:
  """The most RL iterations between two held-out evaluations of a run, its start (step 0)
  and its last step counted as evaluations."""
  steps = sorted({0, max(run.steps, default=0)} | {
      s for s, m in run.steps.items() if any(k.endswith("/success") and k.startswith("eval")
                                             for k in m)})
  return max((b - a for a, b in zip(steps, steps[1:])), default=0)


LISTED_COMMITS = 4  # more distinct commits than this are counted, not listed


def _runs(n: int) -> str:
  return f"{n} run" + ("" if n == 1 else "s")


def code_line(runs: list[Run]) -> str:
  """The code commits the runs name (config.json `provenance`) and the runs whose tree had
  uncommitted changes to tracked files when they started."""
  commits: dict[str, int] = {}
  for r in runs:
    commits[run_commit(r)[0]] = commits.get(run_commit(r)[0], 0) + 1
  missing = commits.pop("", 0)
  parts = []
  if 0 < len(commits) <= LISTED_COMMITS:
    parts.append(", ".join(f"`{c}` ({_runs(n)})" for c, n in
                           sorted(commits.items(), key=lambda kv: (-kv[1], kv[0]))))
  elif commits:
    parts.append(f"{len(commits)} commits over {_runs(sum(commits.values()))}")
  if missing:
    parts.append(f"not recorded by {_runs(missing)} (written before runs recorded it)")
  return "- code commit (each run's in `per_run.csv`): " + "; ".join(parts + [unclean_text(runs)])


def unclean_text(runs: list[Run]) -> str:
  """The runs from an unclean tree by family and method, in bold; or that there are none."""
  seeds: dict[str, list[int]] = {}
  for r in runs:
    if run_commit(r)[1] == "UNCLEAN":
      seeds.setdefault(f"{r.family}/{r.method}" if r.family else r.method, []).append(r.seed)
  if not seeds:
    return "no run from an unclean tree"
  named = "; ".join(f"{k} seed{'s' * (len(v) > 1)} {', '.join(map(str, sorted(v)))}"
                    for k, v in seeds.items())
  return f"**from an unclean tree: {named} ({_runs(sum(map(len, seeds.values())))})**"


def _read_optional(path: str) -> str | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read()


# What the results' columns mean; an optional column's sentence only where it is shown.
RESULTS_TEXT = (
    ("", "Final held-out success after RL, with actions sampled at the rollout temperature "
     "(the policy RL optimises) and greedy. Mean over seeds and 95% Student-t interval "
     "`mean [low, high]`, cut to the possible values ([0, 1] for a rate or an AUC, [-1, 1] "
     "for a difference or a correlation). Changes are paired by seed: each RL run minus the "
     "SFT start it began from (\"vs SFT\"), or minus GRPO of the same seed (\"vs GRPO\")."),
    ("horizon", "Rows are grouped by horizon (the environment's `horizon` argument); every "
     "comparison is within a horizon."),
    ("per task", "Per task: the same held-out tasks with the same sampler keys, from "
     "the runs' per-episode outcomes; per task the success difference averaged over the "
     "seeds, its mean over tasks with a 95% t-interval over tasks, the exact two-sided sign "
     "test's p over the (seed, task) pairs that differ, and their count (won:lost). "
     "Secondary: they count (seed, task) pairs as independent, so they ignore the "
     "variation between training runs; the intervals over seeds are the headline."),
    ("", "Credit Spearman: rank correlation of the step advantages with the oracle step "
     "labels, averaged over a run's iterations."),
    ("decisive AUC", "Decisive AUC (`csa_jax.credit.decisive_auc`): per iteration the AUC "
     "of the advantages of the steps labelled > 0 against those labelled < 0, steps labelled "
     "0 (routine) left out, averaged over a run's iterations; not the credit study's "
     "progress AUC (label > 0 against <= 0)."),
    ("length (training)", "Length (training): the training rollouts' mean episode length, "
     "averaged over the iterations."),
    ("", "s / iter: rollout + advantages + update, evaluations excluded; adv share: the "
     "advantages' part of it."),
    ("iteration s", "Iteration s: an RL iteration's whole wall time (`perf/iteration_s`, "
     "evaluations and checkpoints included); adv / iteration: the advantages' part of it."),
)


PROMPTED_TEXT = ("Prompted: the pretrained model with no training (`launch.py --prompted`), "
                 "on the same held-out tasks; its \"vs SFT\" is it minus the SFT start of "
                 "the same seed.")


def multiplicity_text(name: str, registered: bool) -> str:
  where = (f"the study's registered families (`{name}/tests.json`, committed before its "
           "runs) are Holm-corrected under \"Registered tests\"" if registered else
           f"this study registered none (no `{name}/tests.json`)")
  return ("Every interval and test in this table is per comparison, uncorrected for their "
          f"number: exploratory, except confirmatory tests registered before the runs; {where}.")


def results_text(shown: list[str], rows: list[dict[str, Any]], name: str,
                 registered: bool) -> str:
  texts = [text for column, text in RESULTS_TEXT
           if any(column in header for header in shown)]  # "" is in every header
  return " ".join(texts + ([PROMPTED_TEXT] if any(r["method"] == PROMPTED for r in rows)
                           else []) + [multiplicity_text(name, registered)])


def markdown(name: str, study_dir: str, runs: list[Run], unfinished: list[str],
             rows: list[dict[str, Any]], plots: Sequence[str] = PLOTS,
             beside: confirm.Beside | None = None) -> str:
  commands = _read_optional(os.path.join(study_dir, "commands.txt"))
  notes = _read_optional(os.path.join(study_dir, "notes.md"))
  tests = confirm.read_tests(study_dir)
  captions = {"learning_curves.png": "held-out success vs env interactions",
              "training_curves.png": "training-rollout success vs env interactions",
              "final_success.png": "final success change from SFT",
              HORIZON_PLOT: "difference to GRPO against the horizon",
              BESIDE_PLOT: "this study beside the one it names, against the horizon"}
  parts = [
      f"# Study `{name}`",
      "Generated by `python -m studies.report --name " + name + "` from "
      f"`{name}/runs/`; regenerate it rather than edit it (the verdict lives in "
      f"`{name}/notes.md`).",
      "## Reproduce",
      f"```bash\n{commands.rstrip()}\n```" if commands is not None
      else f"No commands recorded (`{name}/commands.txt` is absent).",
      "## Runs",
      inventory(runs, unfinished),
      "## Results",
      results_text(shown_columns(rows), rows, name, tests is not None)
      + f" Also in `{name}/summary.csv`; each run's final success with its 95% Wilson "
      f"interval over episodes in `{name}/per_run.csv`.",
      markdown_table(rows),
      *[f"![{captions[os.path.basename(p)]}]({name}/{os.path.basename(p)})" for p in plots],
      *([] if tests is None
        else registered_section(name, runs, tests, beside)),
      "## Verdict and notes",
      notes.rstrip() if notes is not None else f"No notes yet (`{name}/notes.md` is absent).",
  ]
  return "\n\n".join(parts) + "\n"


def registered_section(name: str, runs: list[Run], tests: dict[str, Any],
                       beside: confirm.Beside | None) -> list[str]:
  """The registered tests, the sample-efficiency summaries and the study beside this one
  (`studies.confirm`)."""
  return ["## Registered tests and sample efficiency",
          f"From `{name}/tests.json` (registered before the runs) and the runs, as "
          f"`{name}/{confirm.CONFIRM_FILE}` also has them with every run's code commit.",
          "\n".join(confirm.summary_lines(runs, tests, beside=beside)).rstrip()]


# ----------------------------------------------------------------------------- main


@dataclasses.dataclass(frozen=True)
class Study:
  """A study's finished runs and its summary rows, read from `reports_dir/name/runs/`."""
  reports_dir: str
  name: str
  runs: list[Run]
  unfinished: list[str]
  rows: list[dict[str, Any]]
  beside: confirm.Beside | None  # the study its page shows beside it

  @property
  def study_dir(self) -> str:
    return os.path.join(self.reports_dir, self.name)


def load_study(reports_dir: str, name: str) -> Study:
  runs_dir = os.path.join(reports_dir, name, "runs")
  if not os.path.isdir(runs_dir):
    raise SystemExit(f"no runs directory {runs_dir}")
  runs, unfinished = load_runs(runs_dir)
  return Study(reports_dir, name, runs, unfinished, summarize(runs),
               confirm.read_beside(os.path.join(reports_dir, name)))


def text_files(study: Study) -> dict[str, str]:
  """The report's text files by path: summary.csv, per_run.csv, the page and, where the
  study registers tests, confirm.md, built in
  memory (nothing drawn, nothing written), so that a test can hold a committed page
  against what its inputs give today."""
  d = study.study_dir
  per_run = [per_run_row(r) for r in table_order(study.runs)]
  page = markdown(study.name, d, study.runs, study.unfinished, study.rows,
                  figure_names(study.rows, study.beside is not None), study.beside)
  out = {os.path.join(d, "summary.csv"): csv_text(study.rows),
         os.path.join(d, "per_run.csv"): csv_text(per_run, PER_RUN_COLUMNS),
         os.path.join(study.reports_dir, f"{study.name}.md"): page}
  tests = confirm.read_tests(d)
  if tests is not None:
    out[os.path.join(d, confirm.CONFIRM_FILE)] = confirm.build(study.runs, tests, study.beside)
  return out


def write_report(reports_dir: str, name: str) -> list[str]:
  """Writes the CSVs, the plots and the Markdown page; returns their paths."""
  study = load_study(reports_dir, name)
  texts = text_files(study)
  pngs = write_plots(study.runs, study.rows, study.study_dir, study.beside)
  for path, text in texts.items():
    with open(path, "w", newline="") as f:
      f.write(text)
  return [*texts, *pngs]


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
