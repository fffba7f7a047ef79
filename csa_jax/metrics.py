"""Metrics (host side): what the proposal measures, and where it is written.

- success rate and episode length of a set of trajectories;
- writers: JSONL (one object per line, flushed each write, so a crash loses nothing
  written), TensorBoard events, and a PNG learning curve (success vs env steps).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from csa_jax.rollout import Trajectory


def episode_metrics(trajs: Sequence[Trajectory], prefix: str) -> dict[str, float]:
  return episode_rates(episode_sums(trajs), prefix)


def episode_sums(trajs: Sequence[Trajectory]) -> dict[str, int]:
  """The integer counts the episode metrics are ratios of (summed across processes by
  csa_jax/distributed.py before the ratios are taken)."""
  steps = [s for t in trajs for s in t.steps]
  return {"episodes": len(trajs), "won": sum(t.won for t in trajs),
          "length": sum(t.length for t in trajs), "steps": len(steps),
          "invalid": sum(not s.valid for s in steps),
          "errors": sum(t.error is not None for t in trajs),
          "dropped": sum(s.actions_dropped for s in steps)}


def episode_rates(sums: dict[str, int], prefix: str) -> dict[str, float]:
  n, steps = max(sums["episodes"], 1), sums["steps"]
  return {
      f"{prefix}/success": sums["won"] / n,
      f"{prefix}/episode_len": sums["length"] / n,
      f"{prefix}/episodes": float(sums["episodes"]),
      f"{prefix}/env_steps": float(steps),
      f"{prefix}/invalid_action_frac": sums["invalid"] / steps if steps else 0.0,
      f"{prefix}/errors": float(sums["errors"]),
      # Admissible actions the prompt budget left out of the list, per step (see
      # prompts.build_prompt): non-zero means the policy did not see every action.
      f"{prefix}/actions_dropped": sums["dropped"] / steps if steps else 0.0,
  }


EPISODES_FILE = os.path.join("eval", "episodes.jsonl")
EPISODE_KEYS = ("step", "policy", "split", "index", "success", "length", "return")


def episode_records(trajs, step: int, policy: str) -> list[dict[str, Any]]:
  """One record per evaluated episode (`EPISODE_KEYS`), so that two policies evaluated on
  the same tasks can be compared task by task; `policy` is the evaluation's prefix
  ("eval": greedy, "eval_sampled": sampled) and `step` the RL iteration (0: SFT)."""
  return [{"step": int(step), "policy": policy, "split": tr.task[0], "index": int(tr.task[1]),
           "success": int(bool(tr.won)), "length": int(tr.length),
           "return": float(sum(st.reward for st in tr.steps))} for tr in trajs]


def write_episodes(path: str, records: list[dict[str, Any]]) -> None:
  """Adds one evaluation's episode records to the JSONL file at `path`, replacing any
  records of the same (step, policy): a resumed run that replays an evaluation (they are
  deterministic) writes it once, not twice."""
  keys = {(r["step"], r["policy"]) for r in records}
  old = read_jsonl(path, tolerate_partial_last=True) if os.path.exists(path) else []
  kept = [r for r in old if (r["step"], r["policy"]) not in keys]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rewrite_jsonl(path, kept + list(records))


def rewrite_jsonl(path: str, records: list[dict[str, Any]]) -> None:
  """Replaces the JSONL file at `path` by `records`, atomically: the new lines go to a
  temporary file that then takes the old one's name, so a kill mid-write leaves the old
  file whole (a resume that drops lines must not lose the ones it keeps)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  os.replace(tmp, path)


class MetricsWriter:
  """Appends metrics to `metrics.jsonl` and TensorBoard events under `workdir`; each
  evaluation's per-episode outcomes go to `eval/episodes.jsonl` (`write_episodes`)."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.episodes_path = os.path.join(workdir, EPISODES_FILE)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._f = open(self.path, "a")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: dict[str, Any], tb_step: int | None = None) -> None:
    """One JSONL line at `step`; TensorBoard gets the values at `tb_step` (default `step`):
    SFT's curve is logged at RL step 0 with its batch number as the TensorBoard step."""
    clean = {k: float(v) for k, v in metrics.items()}
    self._f.write(json.dumps({"step": int(step), **clean}) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in clean.items():
        if np.isfinite(v):
          self._tb.add_scalar(k, v, step if tb_step is None else tb_step)
      self._tb.flush()

  def episodes(self, records: list[dict[str, Any]]) -> None:
    write_episodes(self.episodes_path, records)

  def drop_after(self, step: int) -> None:
    """Removes the JSONL lines of steps after `step` (resuming from a checkpoint there),
    and a last line cut short by a kill mid-write; the same for episode records."""
    self.keep(lambda r: r["step"] <= step)
    if os.path.exists(self.episodes_path):
      rewrite_jsonl(self.episodes_path, [
          r for r in read_jsonl(self.episodes_path, tolerate_partial_last=True)
          if r["step"] <= step])

  def keep(self, predicate) -> None:
    """Keeps only the metrics lines (records) for which `predicate` is true."""
    self._f.close()
    rewrite_jsonl(self.path, [r for r in read_jsonl(self.path, tolerate_partial_last=True)
                              if predicate(r)])
    self._f = open(self.path, "a")

  def close(self) -> None:
    self._f.close()
    if self._tb is not None:
      self._tb.close()


class NullWriter:
  """What processes other than 0 write: nothing (csa_jax/distributed.py, is_writer)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")

  def write(self, step: int, metrics: dict[str, Any], tb_step: int | None = None) -> None:
    del step, metrics, tb_step

  def episodes(self, records: list[dict[str, Any]]) -> None:
    del records

  def drop_after(self, step: int) -> None:
    del step

  def keep(self, predicate) -> None:
    del predicate

  def close(self) -> None:
    pass


def read_jsonl(path: str, tolerate_partial_last: bool = False) -> list[dict[str, Any]]:
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  if tolerate_partial_last and lines and not lines[-1].endswith("\n"):
    lines = lines[:-1]  # a write the process did not live to finish
  return [json.loads(line) for line in lines]


def plot_learning_curve(jsonl_path: str, png_path: str, title: str = "") -> str:
  """Success rate against cumulative training env steps: rollouts and evaluations."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  recs = read_jsonl(jsonl_path)
  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  train = [(r["perf/env_steps_total"], r["rollout/success"]) for r in recs
           if "rollout/success" in r and "perf/env_steps_total" in r]
  if train:
    x, y = zip(*train)
    ax.plot(x, y, ".-", alpha=0.6, label="training rollouts (sampled)")
  for prefix, style, label in (("eval", "o-", "held-out eval (greedy)"),
                                ("eval_sampled", "s--", "held-out eval (sampled)")):
    evals = [(r["perf/env_steps_total"], r[f"{prefix}/success"]) for r in recs
             if f"{prefix}/success" in r and "perf/env_steps_total" in r]
    if evals:
      x, y = zip(*evals)
      ax.plot(x, y, style, color="black", label=label)
  ax.set_xlabel("environment steps in RL training")
  ax.set_ylabel("success rate")
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(loc="best")
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(png_path)
  plt.close(fig)
  return png_path
