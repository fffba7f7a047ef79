"""A study's run files as the report reads them: run directories, their metrics, their
per-episode evaluations, and the numbers each run contributes to its method's row.

`RUNS/<method>_seed<k>/` (or `RUNS/FAMILY/<method>_seed<k>/` for a study of several
families) holds `config.json`, `metrics.jsonl` and, where written, `eval/episodes.jsonl`;
`sft_seed<k>` is seed k's SFT start, `prompted_seed<k>` the pretrained model with no training
evaluated with seed k (`launch.py --prompted`). Only runs with a `DONE` file count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Iterable, Sequence

import numpy as np

from csa_jax.rollout.metrics import read_jsonl
from studies.stats import DIFF, NAN, finite_mean, mean_ci, sign_test_p, wilson

# Baselines first (GRPO, the reference of every delta, leads; then the model-based ones,
# iStar, SPA-RL, multi-turn DPO), then CSA, its combinations
# and its lambda ablations; methods not listed follow alphabetically.
METHOD_ORDER = ("grpo", "dr_grpo", "rloo", "dapo", "gigpo", "istar", "spa", "spa_bonus",
                "mtdpo", "csa", "csa_state", "csa_valid", "csa_t0", "csa_routine", "csa_dapo",
                "csa_gigpo", "csa_lam0", "csa_lam1")
SFT = "sft"
# The untrained model's evaluation (`launch.py --prompted`), a reference like the SFT start.
PROMPTED = "prompted"
REFERENCES = (PROMPTED, SFT)  # the rows before the methods, in this order
SAMPLED, GREEDY = "eval_sampled", "eval"  # the evaluations' metric prefixes and policies
EPISODES_FILE = os.path.join("eval", "episodes.jsonl")
_RUN_NAME = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)$")


# ----------------------------------------------------------------------------- episodes


TaskKey = tuple[str, int]  # (split, index)


@dataclasses.dataclass(frozen=True)
class Episode:
  success: int
  length: int
  ret: float


# (policy, step) -> (split, index) -> episode: every evaluation in one episodes file.
Evaluations = dict[tuple[str, int], dict[TaskKey, Episode]]
Pairs = list[tuple[TaskKey, int, int]]  # (task, success of A, success of B)


def parse_episodes(records: Iterable[dict[str, Any]], source: str = "episodes"
                   ) -> Evaluations:
  """The evaluations in an episodes file's lines. A line repeated by a resumed run must
  repeat its outcome; a conflict, a missing field or a success other than 0/1 is an error
  naming `source`."""
  out: Evaluations = {}
  for r in records:
    try:
      key = (str(r["policy"]), int(r["step"]))
      task = (str(r["split"]), int(r["index"]))
      ep = Episode(int(r["success"]), int(r["length"]), float(r["return"]))
    except (KeyError, TypeError, ValueError):
      raise ValueError(f"{source}: an episode line needs step, policy, split, index, "
                       f"success, length and return; got {r}") from None
    if ep.success not in (0, 1):
      raise ValueError(f"{source}: success must be 0 or 1, got {r}")
    evaluation = out.setdefault(key, {})
    if evaluation.get(task, ep) != ep:
      raise ValueError(f"{source}: two different outcomes of task {task} in the {key[0]} "
                       f"evaluation at step {key[1]}")
    evaluation[task] = ep
  return out


def load_episodes(path: str) -> Evaluations | None:
  """A run's episodes file (`RUN/eval/episodes.jsonl` or its path); None where absent."""
  if os.path.isdir(path):
    path = os.path.join(path, EPISODES_FILE)
  return parse_episodes(read_jsonl(path), path) if os.path.exists(path) else None


def check_same_tasks(a: dict[TaskKey, Any], b: dict[TaskKey, Any], what: str) -> None:
  """Two evaluations can be paired per task only if they ran the same (split, index) set."""
  if set(a) == set(b):
    return
  only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
  raise ValueError(f"{what}: the two evaluations ran different tasks ({len(a)} and {len(b)}; "
                   f"{len(only_a)} only in the first, e.g. {only_a[:3]}, {len(only_b)} only "
                   f"in the second, e.g. {only_b[:3]}); a per-task pairing needs the same "
                   "(split, index) set")


def pair_outcomes(a: dict[TaskKey, Episode], b: dict[TaskKey, Episode], what: str) -> Pairs:
  """(task, success of a, success of b) per task, sorted, after `check_same_tasks`."""
  check_same_tasks(a, b, what)
  return [(k, a[k].success, b[k].success) for k in sorted(a)]


def load_pair(path_a: str, step_a: int, path_b: str, step_b: int, policy: str = SAMPLED
              ) -> Pairs:
  """Loads two episodes files and pairs evaluation (policy, step_a) of the first with
  (policy, step_b) of the second per task: an RL run's final step against step 0 of the
  same file (its SFT start), or two methods' final steps on one seed."""
  evaluations = []
  for path, step in ((path_a, step_a), (path_b, step_b)):
    ev = load_episodes(path)
    if ev is None or (policy, step) not in ev:
      raise ValueError(f"{path}: no {policy} evaluation at step {step}")
    evaluations.append(ev[(policy, step)])
  return pair_outcomes(*evaluations, f"{path_a} step {step_a} vs {path_b} step {step_b}")


def task_paired(seeds: Sequence[Pairs]) -> dict[str, float]:
  """Per-task comparison of two policies over one or more seeds' pairs.

  Per task, the success difference averaged over the seeds that ran it (seeds that ran
  the same task indices make one task's difference a mean of several); then the mean over
  tasks with a 95% t-interval over tasks, truncated to [-1, 1]. The sign test counts every
  discordant (seed, task) pair: it asks whether these trained policies differ, given the
  training runs; the t-interval over seeds in the same row is the statement about the
  method across training seeds."""
  per_task: dict[TaskKey, list[int]] = {}
  for pairs in seeds:
    for task, a, b in pairs:
      per_task.setdefault(task, []).append(a - b)
  diffs = [float(np.mean(v)) for _, v in sorted(per_task.items())]
  wins = sum(a > b for pairs in seeds for _, a, b in pairs)
  losses = sum(a < b for pairs in seeds for _, a, b in pairs)
  m, lo, hi = mean_ci(diffs, bounds=DIFF)
  return {"seeds": len(seeds), "tasks": len(diffs), "mean": m, "ci_low": lo, "ci_high": hi,
          "wins": wins, "losses": losses, "sign_p": sign_test_p(wins, losses)}


# ----------------------------------------------------------------------------- runs


@dataclasses.dataclass
class Run:
  name: str
  method: str
  seed: int
  config: dict[str, Any]
  steps: dict[int, dict[str, float]]  # metrics of each step, its lines merged
  family: str = ""  # the family directory of a several-family study; "" for runs/RUN
  episodes: Evaluations | None = None  # None: a run written before episodes files

  @property
  def final(self) -> dict[str, float]:
    return self.steps[max(self.steps)] if self.steps else {}

  @property
  def horizon(self) -> Any:
    return config_value(self.config, "env.kwargs.horizon")

  @property
  def label(self) -> str:
    return f"{self.family}/{self.name}" if self.family else self.name


GroupKey = tuple[str, Any]  # (family, horizon): the runs that are compared with each other


def group_key(run: Run) -> GroupKey:
  return run.family, run.horizon


def group_order(key: GroupKey) -> tuple:
  """Horizons ascending, a group without a horizon first, then the family name."""
  family, h = key
  return (h is not None, h if h is not None else 0, family)


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


def run_dirs(runs_dir: str) -> list[tuple[str, str, str]]:
  """(family, run name, path) of every run directory: `RUN/` directly under runs/ (family
  ""), or `FAMILY/RUN/` one level down, the layout of a sweep over several families."""
  out = []
  for name in sorted(os.listdir(runs_dir)):
    path = os.path.join(runs_dir, name)
    if not os.path.isdir(path):
      continue
    if parse_run_name(name):
      out.append(("", name, path))
      continue
    out += [(name, sub, os.path.join(path, sub)) for sub in sorted(os.listdir(path))
            if parse_run_name(sub) and os.path.isdir(os.path.join(path, sub))]
  return out


def load_run(family: str, name: str, path: str) -> Run:
  method, seed = parse_run_name(name)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  steps = merge_steps(read_jsonl(os.path.join(path, "metrics.jsonl")))
  return Run(name, method, seed, config, steps, family, load_episodes(path))


def load_runs(runs_dir: str) -> tuple[list[Run], list[str]]:
  """Finished runs sorted by (group, method, seed), and the unfinished ones' labels."""
  runs, unfinished = [], []
  for family, name, path in run_dirs(runs_dir):
    if os.path.exists(os.path.join(path, "DONE")):
      runs.append(load_run(family, name, path))
    else:
      unfinished.append(f"{family}/{name}" if family else name)
  return sorted(runs, key=lambda r: (group_order(group_key(r)), r.method, r.seed)), unfinished


def group_runs(runs: list[Run]) -> dict[GroupKey, list[Run]]:
  """The runs of each (family, horizon), groups in `group_order`."""
  out: dict[GroupKey, list[Run]] = {}
  for r in sorted(runs, key=lambda r: group_order(group_key(r))):
    out.setdefault(group_key(r), []).append(r)
  return out


def table_order(runs: list[Run]) -> list[Run]:
  """Group by group, the SFT starts first, then the methods in `METHOD_ORDER`, by seed."""
  out = []
  for group in group_runs(runs).values():
    methods = {r.method for r in group}
    for m in lead_methods(methods) + order_methods(methods):
      out += sorted((r for r in group if r.method == m), key=lambda r: r.seed)
  return out


def order_methods(methods: set[str]) -> list[str]:
  """The trained methods among `methods` (the references left out)."""
  known = [m for m in METHOD_ORDER if m in methods]
  return known + sorted(methods - set(METHOD_ORDER) - set(REFERENCES))


def lead_methods(methods: set[str]) -> list[str]:
  """The references among `methods`, in the order the tables show them first."""
  return [m for m in REFERENCES if m in methods]


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


def final_outcomes(run: Run | None, policy: str = SAMPLED) -> dict[TaskKey, Episode] | None:
  """The episodes of the evaluation the run's last metrics line reports (step 0 of an SFT
  run); None without an episodes file or that evaluation in it."""
  if run is None or not run.episodes or not run.steps:
    return None
  return run.episodes.get((policy, max(run.steps)))


def start_outcomes(run: Run, sft: Run | None, policy: str = SAMPLED
                   ) -> dict[TaskKey, Episode] | None:
  """The SFT evaluation an RL run began from: the step-0 lines of its own episodes file
  (its start's evaluation, copied: right even where the seed's SFT run was rebuilt
  later), else its seed's SFT run."""
  for r in (run, sft):
    if r is not None and r.episodes and (policy, 0) in r.episodes:
      return r.episodes[(policy, 0)]
  return None


def final_rate(run: Run, prefix: str) -> tuple[float, float, str]:
  """(success rate, episodes, source) of the final evaluation: counted from the episodes
  file where it has that evaluation (checked against metrics.jsonl's rate), else the rate
  and episode count in metrics.jsonl."""
  f = run.final
  rate, n = f.get(f"{prefix}/success", NAN), f.get(f"{prefix}/episodes", NAN)
  eps = final_outcomes(run, prefix)
  if eps is None:
    return rate, n, "metrics"
  k = sum(e.success for e in eps.values())
  if np.isfinite(rate) and abs(k / len(eps) - rate) > 1e-9:
    raise ValueError(f"{run.label}: {prefix} success {rate} in metrics.jsonl but {k} of "
                     f"{len(eps)} in {EPISODES_FILE} at step {max(run.steps)}")
  return k / len(eps), float(len(eps)), "episodes"


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


def iteration_stats(run: Run) -> tuple[float, float]:
  """Mean `perf/iteration_s` (the whole iteration's wall time as csa_jax/perf.py measures
  it: everything from its start to its line, evaluations and the previous checkpoint save
  included, so RL's total cost is this times the iterations) and perf/adv_s over
  perf/iteration_s summed over the iterations; NaN where the run did not time them."""
  its = [m for s, m in run.steps.items() if s > 0 and "perf/iteration_s" in m]
  if not its:
    return NAN, NAN
  total = float(sum(m["perf/iteration_s"] for m in its))
  timed_adv = any("perf/adv_s" in m for m in its) and total > 0
  share = sum(m.get("perf/adv_s", 0.0) for m in its) / total if timed_adv else NAN
  return total / len(its), share


def over_iterations(run: Run, key: str) -> float:
  """Mean of a per-iteration metric over the RL iterations where it is finite."""
  return finite_mean(m[key] for s, m in run.steps.items() if s > 0 and key in m)


def run_scalars(run: Run) -> dict[str, float]:
  """The numbers a run contributes to its method's row (final held-out evaluation)."""
  f = run.final
  wall, adv_share = wall_stats(run)
  iteration, adv_frac = iteration_stats(run)
  return {
      "sampled_success": final_rate(run, SAMPLED)[0],
      "greedy_success": final_rate(run, GREEDY)[0],
      "sampled_episode_len": f.get("eval_sampled/episode_len", NAN),
      "sampled_invalid_action_frac": f.get("eval_sampled/invalid_action_frac", NAN),
      "credit_spearman": over_iterations(run, "credit/spearman"),
      "decisive_auc": over_iterations(run, "credit/decisive_auc"),
      "rollout_episode_len": over_iterations(run, "rollout/episode_len"),
      "wall_s_per_iter": wall,
      "adv_share": adv_share,
      "iteration_s": iteration,
      "adv_frac_of_iteration": adv_frac,
      "env_steps_total": f.get("perf/env_steps_total", NAN),
  }


COMMIT_CHARS = 12  # of the code commit a run names


def run_commit(run: Run) -> tuple[str, str]:
  """(code commit, tree) of the run from its config.json `provenance`: the commit's first
  `COMMIT_CHARS` hex digits ("" where not recorded) and "clean", "UNCLEAN" (uncommitted
  changes when it started) or "unknown" (runs older than the record)."""
  p = config_value(run.config, "provenance") or {}
  dirty = p.get("git_dirty")
  tree = "unknown" if dirty is None else ("UNCLEAN" if dirty else "clean")
  return str(p.get("git_commit") or "")[:COMMIT_CHARS], tree


def per_run_row(run: Run) -> dict[str, Any]:
  """A line of per_run.csv: the run's final rates with 95% Wilson intervals and its code
  commit."""
  row: dict[str, Any] = {"run": run.label, "family": run.family, "horizon": run.horizon,
                         "method": run.method, "seed": run.seed}
  sources = set()
  for prefix, col in ((SAMPLED, "sampled"), (GREEDY, "greedy")):
    rate, n, source = final_rate(run, prefix)
    _, lo, hi = wilson(rate * n, n)
    row |= {f"{col}_episodes": n, f"{col}_success": rate, f"{col}_wilson_low": lo,
            f"{col}_wilson_high": hi}
    sources.add(source)
  row["source"] = "+".join(sorted(sources))
  row["commit"], row["tree"] = run_commit(run)
  return row


def csv_cell(v: Any) -> str:
  """A value as a CSV cell or a label: ints and bools as integers, floats to 8 significant
  digits, NaN and None empty."""
  if isinstance(v, str):
    return v
  if isinstance(v, (bool, np.bool_)):
    return str(int(v))
  if isinstance(v, (int, np.integer)):
    return str(int(v))
  return format(float(v), ".8g") if v is not None and np.isfinite(v) else ""


def group_label(key: GroupKey, keys: list[GroupKey]) -> str:
  """A panel's title: the horizon, and the family where it tells groups apart; "" for a
  study of one group without a horizon (the page says what it is)."""
  family, h = key
  parts = [f"horizon {csv_cell(h)}"] if h is not None else []
  if family and (h is None or sum(k[1] == h for k in keys) > 1):
    parts.append(family)
  return ", ".join(parts)
