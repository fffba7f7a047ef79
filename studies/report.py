"""Study report: tables, plots and a Markdown page for a sweep of methods x seeds.

    python -m studies.report --name NAME [--reports-dir reports]

Reads `reports/NAME/runs/`: one directory per run (`runs/RUN/`), or, for a study of several
experiment families such as the horizon study, one directory per family holding its runs
(`runs/FAMILY/RUN/`). A run directory has `config.json`, `metrics.jsonl` and, in runs
written since issue 25, `eval/episodes.jsonl` (one line per evaluated episode).
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
  episodes;
- `learning_curves.png`, `training_curves.png`, `final_success.png` (one row of panels per
  horizon) and, where runs have a horizon, `delta_vs_grpo_by_horizon.png`;
- `reports/NAME.md`: the reproduce commands (`reports/NAME/commands.txt`), the run
  inventory and budget, the table, the plots and the verdict (`reports/NAME/notes.md`),
  both copied verbatim.

Runs without episode files (older studies) fall back to the rates in metrics.jsonl and
have no per-task comparison. Nothing in the output depends on the time or machine, so
regenerating an unchanged study rewrites identical files.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import re
import statistics
from typing import Any, Iterable, Sequence

import numpy as np

from csa_jax.metrics import read_jsonl

NAN = float("nan")
# Baselines first (GRPO, the reference of every delta, leads; then the model-based ones,
# iStar, SPA-RL, multi-turn DPO), then CSA, its combinations
# and its lambda ablations; methods not listed follow alphabetically.
METHOD_ORDER = ("grpo", "dr_grpo", "rloo", "dapo", "gigpo", "istar", "spa", "spa_bonus",
                "mtdpo", "csa", "csa_state", "csa_valid", "csa_t0", "csa_routine", "csa_dapo",
                "csa_gigpo", "csa_lam0", "csa_lam1")
SFT = "sft"
SAMPLED, GREEDY = "eval_sampled", "eval"  # the evaluations' metric prefixes and policies
RATE = (0.0, 1.0)   # parameter space of a success rate or an AUC
DIFF = (-1.0, 1.0)  # of a difference of two rates, or of a rank correlation
EPISODES_FILE = os.path.join("eval", "episodes.jsonl")


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
)
PLOTS = ("learning_curves.png", "training_curves.png", "final_success.png")
HORIZON_PLOT = "delta_vs_grpo_by_horizon.png"
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


def clip_interval(lo: float, hi: float, bounds: tuple[float, float] | None
                  ) -> tuple[float, float]:
  """A symmetric t-interval on a bounded quantity can reach past the bound (4 seeds of a
  rate near 1 gave an upper end of 1.004): values there are impossible, so cutting them
  off drops no possible value the interval covers. NaN stays NaN."""
  if bounds is None:
    return lo, hi
  return (max(lo, bounds[0]) if np.isfinite(lo) else lo,
          min(hi, bounds[1]) if np.isfinite(hi) else hi)


def mean_ci(values: Sequence[float], level: float = 0.95,
            bounds: tuple[float, float] | None = None) -> tuple[float, float, float]:
  """Mean and Student-t interval over the finite values (seeds), truncated to `bounds`
  (the parameter space); NaN bounds for one value."""
  x = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  if len(x) == 0:
    return NAN, NAN, NAN
  m = float(x.mean())
  if len(x) == 1:
    return m, NAN, NAN
  half = t_quantile(0.5 + level / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
  return (m, *clip_interval(m - half, m + half, bounds))


def band(y_SxP: np.ndarray, level: float = 0.95, bounds: tuple[float, float] | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`mean_ci` along the seed axis of a curve per seed (no NaN inside)."""
  n = y_SxP.shape[0]
  m = y_SxP.mean(0)
  if n < 2:
    return m, np.full_like(m, NAN), np.full_like(m, NAN)
  half = t_quantile(0.5 + level / 2, n - 1) * y_SxP.std(0, ddof=1) / math.sqrt(n)
  lo, hi = m - half, m + half
  if bounds is not None:
    lo, hi = np.maximum(lo, bounds[0]), np.minimum(hi, bounds[1])
  return m, lo, hi


def wilson(successes: float, n: float, level: float = 0.95) -> tuple[float, float, float]:
  """Rate and Wilson score interval of `successes` in `n` episodes.

  One run's evaluation is n Bernoulli outcomes; the Wald interval p +- z sqrt(p(1-p)/n)
  leaves [0, 1] and shrinks to a point at 0 or n successes, the Wilson interval (the set
  of rates a two-sided score test does not reject) does neither (Brown, Cai & DasGupta
  2001, "Interval estimation for a binomial proportion", recommend it over Wald)."""
  if not n > 0:
    return NAN, NAN, NAN
  z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
  p = successes / n
  denom = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  # It always holds p and lies in [0, 1] (ends at 0 and 1 when k = 0 or n): the min, max
  # and clip only undo rounding.
  return p, *clip_interval(min(centre - half, p), max(centre + half, p), RATE)


def sign_test_p(wins: int, losses: int) -> float:
  """Exact two-sided sign test on the discordant pairs (McNemar's exact test): under the
  null a pair that differs is a win or a loss with probability 1/2 each, so p is twice
  the binomial tail of the rarer side (capped at 1; 1 when no pair differs)."""
  n = wins + losses
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
  return min(1.0, 2 * tail / 2 ** n)  # int / int: exact up to the final rounding


def paired_deltas(a: dict[int, float], b: dict[int, float]) -> list[float]:
  """a(seed) - b(seed) over the seeds where both are finite: the same SFT start, so the
  start's luck cancels."""
  return [a[s] - b[s] for s in sorted(a) if s in b and np.isfinite(a[s]) and np.isfinite(b[s])]


def finite_mean(values: Iterable[float]) -> float:
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
    for m in ([SFT] if SFT in methods else []) + order_methods(methods):
      out += sorted((r for r in group if r.method == m), key=lambda r: r.seed)
  return out


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


def _over_iterations(run: Run, key: str) -> float:
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
      "credit_spearman": _over_iterations(run, "credit/spearman"),
      "decisive_auc": _over_iterations(run, "credit/decisive_auc"),
      "rollout_episode_len": _over_iterations(run, "rollout/episode_len"),
      "wall_s_per_iter": wall,
      "adv_share": adv_share,
      "iteration_s": iteration,
      "adv_frac_of_iteration": adv_frac,
      "env_steps_total": f.get("perf/env_steps_total", NAN),
  }


def per_run_row(run: Run) -> dict[str, Any]:
  """A line of per_run.csv: the run's final rates with 95% Wilson intervals."""
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
  return row


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
  """The rows of one (family, horizon): its SFT start first, then `METHOD_ORDER`."""
  by_method: dict[str, dict[int, Run]] = {}
  for r in runs:
    by_method.setdefault(r.method, {})[r.seed] = r
  sft, grpo = by_method.get(SFT, {}), by_method.get("grpo")
  rows = [method_row(SFT, sft, sft, None)] if sft else []
  rows += [method_row(m, by_method[m], sft, grpo) for m in order_methods(set(by_method))]
  family, horizon = key
  return [{"family": family, "horizon": horizon} | r for r in rows]


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
  """Rows of summary.csv, group by group (horizons ascending)."""
  return [row for key, rs in group_runs(runs).items() for row in group_rows(key, rs)]


def _csv_cell(v: Any) -> str:
  if isinstance(v, str):
    return v
  if isinstance(v, (bool, np.bool_)):
    return str(int(v))
  if isinstance(v, (int, np.integer)):
    return str(int(v))
  return format(float(v), ".8g") if v is not None and np.isfinite(v) else ""


def write_csv(rows: list[dict[str, Any]], path: str, columns: Sequence[str] = CSV_COLUMNS
              ) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
      w.writerow([_csv_cell(r.get(c)) for c in columns])


# ----------------------------------------------------------------------------- curves


def eval_points(run: Run, prefix: str = SAMPLED) -> dict[int, tuple[float, float]]:
  """Iteration -> (env steps so far, held-out success) for the RL run's evaluations."""
  return {s: (m["perf/env_steps_total"], m[f"{prefix}/success"]) for s, m in run.steps.items()
          if s > 0 and f"{prefix}/success" in m and "perf/env_steps_total" in m}


def learning_curve(runs: list[Run], sft: dict[int, float], prefix: str = SAMPLED
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


def group_label(key: GroupKey, keys: list[GroupKey]) -> str:
  """A panel's title: the horizon, and the family where it tells groups apart; "" for a
  study of one group without a horizon (the page says what it is)."""
  family, h = key
  parts = [f"horizon {_csv_cell(h)}"] if h is not None else []
  if family and (h is None or sum(k[1] == h for k in keys) > 1):
    parts.append(family)
  return ", ".join(parts)


@dataclasses.dataclass
class CurveRow:
  """One group's curves in a figure: a row of panels."""
  title: str
  methods: list[str]
  curves: dict[str, tuple]


def _curve_plot(rows: list[CurveRow], png: str, *, ylabel: str, title: str) -> None:
  """One line per method with its CI band, a row of panels per group; the axis stays on
  [0, 1], where a success rate lives, so a band cut at the edge is one that reaches it."""
  plt = _plt()
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
  rows = [r for r in rows if r["method"] != SFT]
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
  plt = _plt()
  width = sum(max(5.0, 0.7 * sum(r["method"] != SFT for r in rows) + 1.5)
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
  plt = _plt()
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
  ax.set_xticks(horizons, [_csv_cell(h) for h in horizons])
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


def write_plots(runs: list[Run], rows: list[dict[str, Any]], out_dir: str) -> list[str]:
  """The three figures (a row or panel per group) and, where the runs have a horizon and
  GRPO ran, the difference to GRPO against the horizon; returns their paths."""
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
    curves.append(CurveRow(label, methods, {m: learning_curve(by_method[m], sft)
                                            for m in methods}))
    training.append(CurveRow(label, methods, {m: training_curve(by_method[m])
                                              for m in methods}))
    per_seed = {m: paired_deltas({r.seed: final_rate(r, SAMPLED)[0] for r in by_method[m]},
                                 sft) for m in methods}
    finals.append((label, [r for r in rows if (r["family"], r["horizon"]) == key], per_seed))
  paths = [os.path.join(out_dir, p) for p in PLOTS]
  _curve_plot(curves, paths[0], ylabel="held-out success (sampled)",
              title="held-out success vs env interactions (mean over seeds, 95% CI)")
  _curve_plot(training, paths[1], ylabel="training-rollout success",
              title=f"training rollouts ({SMOOTH_ITERS}-iteration moving average, 95% CI)")
  plot_final(finals, paths[2])
  if any(r["horizon"] is not None and np.isfinite(r.get("delta_vs_grpo_mean", NAN))
         and r["method"] != "grpo" for r in rows):
    paths.append(os.path.join(out_dir, HORIZON_PLOT))
    plot_vs_horizon(rows, paths[-1])
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
    ("horizon", lambda r: "" if r["horizon"] is None else _csv_cell(r["horizon"]), False),
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
    for m in ([SFT] if SFT in seeds else []) + order_methods(set(seeds)):
      cells = ([group_label(key, keys)] if labelled else []) + [
          m, ", ".join(map(str, sorted(seeds[m])))]
      lines.append("| " + " | ".join(cells) + " |")
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
  if any(config_value(r.config, "rl_env_steps") for r in rl):
    lines.append(f"- RL environment-step budget (rl_env_steps): {_distinct(rl, 'rl_env_steps')}")
  episodes = sum(r.episodes is not None for r in runs)
  lines.append(f"- per-episode outcomes ({EPISODES_FILE}): {episodes} of {len(runs)} runs")
  return "\n".join(lines)


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
     "test's p over the (seed, task) pairs that differ, and their count (won:lost)."),
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


def results_text(shown: list[str]) -> str:
  return " ".join(text for column, text in RESULTS_TEXT
                  if any(column in header for header in shown))  # "" is in every header


def markdown(name: str, study_dir: str, runs: list[Run], unfinished: list[str],
             rows: list[dict[str, Any]], plots: Sequence[str] = PLOTS) -> str:
  commands = _read_optional(os.path.join(study_dir, "commands.txt"))
  notes = _read_optional(os.path.join(study_dir, "notes.md"))
  captions = {"learning_curves.png": "held-out success vs env interactions",
              "training_curves.png": "training-rollout success vs env interactions",
              "final_success.png": "final success change from SFT",
              HORIZON_PLOT: "difference to GRPO against the horizon"}
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
      results_text(shown_columns(rows)) + f" Also in `{name}/summary.csv`; each run's final "
      f"success with its 95% Wilson interval over episodes in `{name}/per_run.csv`.",
      markdown_table(rows),
      *[f"![{captions[os.path.basename(p)]}]({name}/{os.path.basename(p)})" for p in plots],
      "## Verdict and notes",
      notes.rstrip() if notes is not None else f"No notes yet (`{name}/notes.md` is absent).",
  ]
  return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- main


def write_report(reports_dir: str, name: str) -> list[str]:
  """Writes the CSVs, the plots and the Markdown page; returns their paths."""
  study_dir = os.path.join(reports_dir, name)
  runs_dir = os.path.join(study_dir, "runs")
  if not os.path.isdir(runs_dir):
    raise SystemExit(f"no runs directory {runs_dir}")
  runs, unfinished = load_runs(runs_dir)
  rows = summarize(runs)
  csv_path = os.path.join(study_dir, "summary.csv")
  write_csv(rows, csv_path)
  per_run_path = os.path.join(study_dir, "per_run.csv")
  write_csv([per_run_row(r) for r in table_order(runs)], per_run_path, PER_RUN_COLUMNS)
  pngs = write_plots(runs, rows, study_dir)
  md_path = os.path.join(reports_dir, f"{name}.md")
  with open(md_path, "w") as f:
    f.write(markdown(name, study_dir, runs, unfinished, rows, pngs))
  return [csv_path, per_run_path, *pngs, md_path]


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
