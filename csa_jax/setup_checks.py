"""Checks a run makes at start-up, before it writes anything: each failure is one line
(`SetupError`, a ConfigError) instead of a traceback from a worker minutes later."""

from __future__ import annotations

from csa_jax import distributed as dist
from csa_jax.config import ConfigError, ExperimentConfig
from environments.registry import make_env


class SetupError(ConfigError):
  """A run that cannot work as configured, found at start-up (one line says why)."""


def check_environment(cfg: ExperimentConfig) -> None:
  """Builds one environment here and resets the first training and held-out tasks, so
  that a bad environment argument, split or task range is one line before anything is
  written, not a traceback from a worker minutes later."""
  e = cfg.env
  what = f"environment {e.name} {dict(e.kwargs)}"
  try:
    env = make_env(e.name, **dict(e.kwargs))
  except Exception as err:  # pylint: disable=broad-except  (any engine's own error)
    raise SetupError(f"{what}: {_one_line(err)}") from None
  try:
    for split, first, count, field in (
        (e.train_split, 0, e.num_train_tasks, "env.num_train_tasks"),
        (e.eval_split, cfg.eval.first_task, cfg.eval.num_episodes,
         "eval.first_task + eval.num_episodes")):
      try:
        n = env.num_tasks(split)
        env.reset(split, first)
      except Exception as err:  # pylint: disable=broad-except
        raise SetupError(f"{what}, split {split!r}: {_one_line(err)}") from None
      if first + count > n:
        raise SetupError(f"{field} = {first + count} but {what} has {n} tasks in split "
                         f"{split!r}")
  finally:
    env.close()


def check_processes(cfg: ExperimentConfig, algo) -> None:
  """Refuses, with several processes, what is not written for them yet: methods with an
  auxiliary model or episodes of their own (their extra batches and exploration are not
  split across processes), dynamic sampling (a process could end a round with no group
  while others train), and fewer task groups than processes."""
  p = dist.process_count()
  if p == 1:
    return
  if not algo.multiprocess:  # the method's own property (csa_jax/algorithms/base.py)
    raise SetupError(f"algo.method {cfg.algo.method} runs on one process only; with {p} "
                     "processes use an estimator method (algo.method=estimator)")
  if cfg.algo.dynamic_sampling:
    raise SetupError(f"algo.dynamic_sampling runs on one process only ({p} here)")
  if cfg.rollout.tasks_per_iter < p:
    raise SetupError(f"rollout.tasks_per_iter={cfg.rollout.tasks_per_iter} task groups "
                     f"cannot be shared by {p} processes: at least one each")


def _one_line(err: BaseException) -> str:
  # A KeyError's str() is the repr of its message: take the message itself.
  text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
          ).strip().splitlines()
  return f"{type(err).__name__}: {text[0] if text else ''}"
