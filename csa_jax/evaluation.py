"""Held-out evaluation: one episode per task of the evaluation split (shared across
processes), its rates and its episodes; and the table a run prints at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm.auto import tqdm

from csa_jax import distributed as dist
from csa_jax import prompts
from csa_jax import rollout as rollout_lib
from csa_jax.config import ExperimentConfig


def evaluate(pool, policy, tok, cfg: ExperimentConfig, label: str, prefix: str,
             fmt: prompts.PromptFormat = prompts.PLAIN) -> tuple[dict, list]:
  """eval.num_episodes held-out tasks from eval.first_task on, one episode each (split
  across processes; the metrics are over all of them, the episodes this process's)."""
  n, first = cfg.eval.num_episodes, cfg.eval.first_task
  tasks = dist.share([(cfg.env.eval_split, first + i) for i in range(n)])
  with tqdm(total=len(tasks), desc=f"eval {label}", unit="ep", leave=False) as bar:
    trajs = rollout_lib.run_episodes(pool, policy, tok, tasks, cfg.rollout,
                                     np.random.default_rng(0), on_wave=bar.update, fmt=fmt)
  return dist.episode_metrics(trajs, prefix), trajs


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
