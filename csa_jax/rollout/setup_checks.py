"""Checks a run makes at start-up, before it writes anything: each failure is one line
(`SetupError`, a ConfigError) instead of a traceback from a worker minutes later."""

from __future__ import annotations

from csa_jax.config import ConfigError, ExperimentConfig
from csa_jax.distributed import processes as dist
from csa_jax.rollout import prompts
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


def check_budgets(cfg: ExperimentConfig, tok, fmt: prompts.PromptFormat, pool,
                  records: list[dict] | None) -> None:
  """Refuses (SetupError) prompt and action budgets that cannot hold what the environment
  asks: the task line and the whole first action list of each demonstration (`records`;
  None: of the first training tasks' resets in `pool`), and every expert action."""
  r = cfg.rollout
  if records is not None:
    firsts = [(rec["task"], rec["admissible"][0]) for rec in records]
    actions = [a for rec in records for a in rec["actions"]]
  else:  # SFT taken from another run: look at the environment itself
    slots = list(range(min(pool.num_envs, 4)))
    res = pool.reset(slots, [(cfg.env.train_split, i) for i in slots])
    firsts = [(x.info.task, x.info.admissible_actions) for x in res
              if not x.info.error]
    actions = [a for a in pool.expert_action(slots) if a]
  need = max((prompts.prompt_budget_needed(tok, *f, fmt=fmt) for f in firsts),
             default=0)
  if r.max_prompt_tokens < need:
    raise SetupError(f"rollout.max_prompt_tokens={r.max_prompt_tokens} cannot hold the task "
                     f"line and the action list of {cfg.env.name}'s first steps: at least "
                     f"{need} fit (model.max_seq_len must allow it plus the action budget)")
  need = max((len(tok.encode(fmt.answer_text(a))) + 1 for a in actions), default=0)
  if r.max_action_tokens < need:
    raise SetupError(f"rollout.max_action_tokens={r.max_action_tokens} cannot hold the expert's "
                     f"actions (and the end token): at least {need} fit")


def _one_line(err: BaseException) -> str:
  # A KeyError's str() is the repr of its message: take the message itself.
  text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
          ).strip().splitlines()
  return f"{type(err).__name__}: {text[0] if text else ''}"
