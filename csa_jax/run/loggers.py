"""The run's loggers: where every metrics line the trainer writes goes.

- `metrics.jsonl` in the work directory: one JSON object per line, flushed at each write
  so a crash loses nothing written; the record the reports and a resume read
  (csa_jax/rollout/metrics.py, `read_jsonl`);
- TensorBoard events (`tb/`);
- Weights & Biases when the config asks (`log.wandb`): each line becomes one row of a W&B
  run kept in the work directory's `wandb/`, with the same keys ("step" among them). With
  WANDB_MODE=offline nothing leaves the machine (`wandb sync` uploads it later);
- per-episode outcomes of each evaluation (`metrics.EPISODES_FILE`);
- at the end, the learning curve (`learning_curve.png`).

A resume drops the metrics.jsonl lines logged after its checkpoint (their iterations are
replayed); TensorBoard and W&B keep what they were sent, so a replayed iteration appears
there twice (a W&B run's history only grows). The resumed run logs to the same W&B run id
(offline, a second directory under wandb/ with that id, which `wandb sync` adds to it).
Only process 0 logs (`open_for`): the others get a `NullWriter`.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import numpy as np

from csa_jax.config import ExperimentConfig, LogConfig, to_dict
from csa_jax.distributed import processes as dist
from csa_jax.rollout.metrics import (EPISODES_FILE, ORACLE_FILE, read_jsonl, rewrite_jsonl,
                                     write_episodes)
from csa_jax.rollout.setup_checks import SetupError

METRICS_FILE = "metrics.jsonl"


class WandbLogger:
  """One W&B run per work directory: its id is kept in `wandb/run_id`, so `--resume`
  continues the run it started rather than opening another."""

  def __init__(self, log: LogConfig, workdir: str, cfg: ExperimentConfig | None = None):
    import wandb  # pylint: disable=import-outside-toplevel  (only runs that ask pay for it)
    root = os.path.join(workdir, "wandb")
    os.makedirs(root, exist_ok=True)
    id_file = os.path.join(root, "run_id")
    if os.path.exists(id_file):
      with open(id_file) as f:
        run_id = f.read().strip()
    else:
      run_id = uuid.uuid4().hex[:8]
      with open(id_file, "w") as f:
        f.write(run_id)
    try:
      # console "off": the run's own output (progress bars) stays as it is.
      self._run = wandb.init(project=log.wandb_project, dir=workdir, id=run_id,
                             resume="allow", name=cfg.name if cfg else None,
                             config=to_dict(cfg) if cfg else None,
                             settings=wandb.Settings(console="off", silent=True))
    except wandb.errors.Error as e:  # no login, no network: one line, before any training
      wandb.teardown()  # its settings (WANDB_MODE, the login) are read afresh by a next run
      raise SetupError(f"log.wandb: {(str(e).splitlines() or [type(e).__name__])[0]} "
                       "(WANDB_MODE=offline keeps the run on disk for `wandb sync`)") from None

  def write(self, line: dict[str, float]) -> None:
    self._run.log(line)

  def close(self) -> None:
    self._run.finish()


class MetricsWriter:
  """Appends metrics to `metrics.jsonl`, TensorBoard events and (`wandb`) a W&B run under
  `workdir`; each evaluation's per-episode outcomes go to `eval/episodes.jsonl`."""

  def __init__(self, workdir: str, tensorboard: bool = True, wandb: LogConfig | None = None,
               cfg: ExperimentConfig | None = None):
    os.makedirs(workdir, exist_ok=True)
    # First: a W&B run that cannot start is refused before any file is opened.
    self._wandb = WandbLogger(wandb, workdir, cfg) if wandb and wandb.wandb else None
    self.episodes_path = os.path.join(workdir, EPISODES_FILE)
    self.oracle_path = os.path.join(workdir, ORACLE_FILE)
    self.path = os.path.join(workdir, METRICS_FILE)
    self._f = open(self.path, "a")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: dict[str, Any], tb_step: int | None = None) -> None:
    """One line at `step` (JSONL and W&B); TensorBoard gets the values at `tb_step`
    (default `step`): SFT's curve is logged at RL step 0 with its batch number as the
    TensorBoard step. (W&B counts its rows itself: its steps must only grow, and SFT's
    batches come before RL's iterations on the same axis.)"""
    line = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    self._f.write(json.dumps(line) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in line.items():
        if k != "step" and np.isfinite(v):
          self._tb.add_scalar(k, v, step if tb_step is None else tb_step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.write(line)

  def episodes(self, records: list[dict[str, Any]]) -> None:
    write_episodes(self.episodes_path, records)

  def oracle_probs(self, records: list[dict[str, Any]]) -> None:
    write_episodes(self.oracle_path, records)

  def drop_after(self, step: int) -> None:
    """Removes the JSONL lines of steps after `step` (resuming from a checkpoint there),
    and a last line cut short by a kill mid-write; the same for episode and oracle records."""
    self.keep(lambda r: r["step"] <= step)
    for path in (self.episodes_path, self.oracle_path):
      if os.path.exists(path):
        rewrite_jsonl(path, [r for r in read_jsonl(path, tolerate_partial_last=True)
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
    if self._wandb is not None:
      self._wandb.close()


class NullWriter:
  """What processes other than 0 write: nothing (csa_jax/distributed/processes.py, is_writer)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, METRICS_FILE)

  def write(self, step: int, metrics: dict[str, Any], tb_step: int | None = None) -> None:
    del step, metrics, tb_step

  def episodes(self, records: list[dict[str, Any]]) -> None:
    del records

  def oracle_probs(self, records: list[dict[str, Any]]) -> None:
    del records

  def drop_after(self, step: int) -> None:
    del step

  def keep(self, predicate) -> None:
    del predicate

  def close(self) -> None:
    pass


def open_for(cfg: ExperimentConfig, workdir: str) -> MetricsWriter | NullWriter:
  """The run's loggers, as its config asks, on the process that writes (process 0)."""
  if not dist.is_writer():
    return NullWriter(workdir)
  return MetricsWriter(workdir, wandb=cfg.log, cfg=cfg)


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
