"""Held-out evaluation: one episode per task of the evaluation split (shared across
processes), its rates and its episodes; and the table a run prints at the end."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from csa_jax.config import ExperimentConfig
from csa_jax.distributed import processes as dist
from csa_jax.model.sampling import sampling_logprobs
from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout import metrics as metrics_lib
from csa_jax.rollout import prompts
from csa_jax.rollout.sft_rows import action_target
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts
from environments.registry import make_env

# Rows per pass of the oracle-action probabilities (one compiled shape).
ORACLE_BATCH = 64


def evaluate(pool, policy, tok, cfg: ExperimentConfig, label: str, prefix: str,
             fmt: prompts.PromptFormat = prompts.PLAIN,
             num_episodes: int | None = None) -> tuple[dict, list]:
  """`num_episodes` (default eval.num_episodes) held-out tasks from eval.first_task on,
  one episode each (split across processes; the metrics are over all of them, the
  episodes this process's)."""
  n, first = num_episodes or cfg.eval.num_episodes, cfg.eval.first_task
  tasks = dist.share([(cfg.env.eval_split, first + i) for i in range(n)])
  with tqdm(total=len(tasks), desc=f"eval {label}", unit="ep", leave=False) as bar:
    trajs = rollout_lib.run_episodes(pool, policy, tok, tasks, cfg.rollout,
                                     np.random.default_rng(0), on_wave=bar.update, fmt=fmt)
  return metrics_lib.gathered_episode_metrics(trajs, prefix), trajs


class OracleProbs:
  """The exact probability that the policy writes the environment's oracle action
  (`TextEnv.oracle_action`: KeyDoor's right key) at the first step of each held-out task,
  under the sampled evaluation's distribution (temperature; the policy RL optimises): the
  probability of the action's own token ids (`sft_rows.action_target`, end token
  included), so another spelling that parses to the same action is not counted. On a task
  decided by that one step this is the sampled success without sampling noise.

  The prompts are built once, in this process, from a fresh environment (one that does
  not need the pool's engines); each call scores them with the given parameters."""

  def __init__(self, graphdef, tok, cfg: ExperimentConfig, fmt: prompts.PromptFormat,
               sampling_cfg):
    r, n, first = cfg.rollout, cfg.eval.num_episodes, cfg.eval.first_task
    env = make_env(cfg.env.name, **dict(cfg.env.kwargs))
    rows = []
    try:
      for i in range(first, first + n):
        res = env.reset(cfg.env.eval_split, i)
        action = env.oracle_action()
        if action is None:
          raise ValueError(f"eval.oracle_prob: environment {cfg.env.name!r} names no oracle "
                           f"action at the first step of {cfg.env.eval_split} task {i}")
        prompt = prompts.encode_prompt(
            tok, res.info.task, [], res.observation, res.info.admissible_actions,
            history_turns=r.history_turns, max_tokens=r.max_prompt_tokens, fmt=fmt)
        rows.append(data_lib.sft_row(prompt, action_target(tok, action, cfg, fmt)))
    finally:
      env.close()
    self.split, self.first = cfg.env.eval_split, first
    self._batches = data_lib.ordered_batches(
        rows, batch_size=ORACLE_BATCH, seq_len=r.max_prompt_tokens + r.max_action_tokens,
        action_len=r.max_action_tokens, pad_id=tok.pad_id)
    self._n = n

    def logp_B(params, batch):
      lp_BxA = sampling_logprobs(ts.action_logits(graphdef, params, batch), batch["targets"],
                                 sampling_cfg)
      return (lp_BxA * batch["loss_mask"]).sum(-1)

    self._logp = jax.jit(logp_B)

  def __call__(self, params, num_tasks: int | None = None) -> np.ndarray:
    """The probabilities of the first `num_tasks` (default all) held-out tasks."""
    n = num_tasks or self._n
    out = [np.asarray(self._logp(params, b)) for b in self._batches[:-(-n // ORACLE_BATCH)]]
    return np.exp(np.concatenate(out)[:n].astype(np.float64))

  def records(self, probs: np.ndarray, step: int) -> list[dict]:
    """One line per task for eval/oracle_probs.jsonl."""
    return [{"step": int(step), "policy": "eval_oracle", "split": self.split,
             "index": self.first + i, "prob": float(p)} for i, p in enumerate(probs)]


def summary_table(summary: dict[str, Any], split: str) -> str:
  """A Markdown table of the held-out evaluations (greedy and sampled where run)."""
  cols = [("eval", "greedy"), ("eval_sampled", "sampled")]
  present = [(p, n) for p, n in cols if any(f"{p}/success" in m for m in summary.values())]
  head = ["policy"] + [f"{split} success ({n})" for _, n in present] + \
         [f"mean length ({n})" for _, n in present] + ["episodes"]
  rows = [head]
  for name, key in (("SFT", "sft"), ("SFT + RL", "rl")):
    if key in summary:
      m = summary[key]
      rows.append([name] + [f"{m[f'{p}/success']:.3f}" for p, _ in present] +
                  [f"{m[f'{p}/episode_len']:.2f}" for p, _ in present] +
                  [f"{int(m[f'{present[0][0]}/episodes'])}"])
  widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
  lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
  lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
  return "\n".join(lines)
