"""Grain pipelines from episodes to fixed-shape training batches (host side).

One training row is one agent step: the prompt the policy saw and the action it wrote.
The loss falls on the action tokens only; each of them carries that step's advantage
and the log-prob it had under the sampling policy (the PPO ratio's denominator). SFT
rows are the same with the expert's action, advantage 1 and no old log-probs.

Every row becomes arrays of one length L, and the row count is padded to whole
batches with rows whose loss mask is 0, so the jitted update compiles once.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import grain
import numpy as np

from csa_jax.rollout import Trajectory

Row = dict[str, Any]

BATCH_KEYS = ("inputs", "targets", "attn_mask", "loss_mask", "old_logp", "adv")


def rl_rows(trajs: Sequence[Trajectory], adv_BxGxT: np.ndarray, group_size: int) -> list[Row]:
  """One row per real step, with that step's advantage (trajectories group-major)."""
  rows = []
  for k, tr in enumerate(trajs):
    b, g = divmod(k, group_size)
    for t, st in enumerate(tr.steps[: adv_BxGxT.shape[2]]):
      if not st.action_ids:
        continue
      rows.append({"prompt_ids": st.prompt_ids, "action_ids": st.action_ids,
                   "old_logps": st.action_logps, "advantage": float(adv_BxGxT[b, g, t])})
  return rows


def sft_row(prompt_ids: list[int], action_ids: list[int]) -> Row:
  return {"prompt_ids": prompt_ids, "action_ids": action_ids,
          "old_logps": [0.0] * len(action_ids), "advantage": 1.0}


def row_arrays(row: Row, seq_len: int) -> dict[str, np.ndarray]:
  """Teacher-forcing arrays of length `seq_len`: position p predicts targets[p]."""
  prompt, action = list(row["prompt_ids"]), list(row["action_ids"])
  seq = prompt + action
  if len(seq) - 1 > seq_len:
    raise ValueError(f"row of {len(seq)} tokens does not fit seq_len {seq_len} + 1")
  n = len(seq) - 1
  out = {k: np.zeros(seq_len, np.int32 if k in ("inputs", "targets", "attn_mask") else np.float32)
         for k in BATCH_KEYS}
  out["inputs"][:n] = seq[:-1]
  out["targets"][:n] = seq[1:]
  out["attn_mask"][:n] = 1
  # Target index j holds seq[j+1]; the action starts at seq[len(prompt)].
  lo = len(prompt) - 1
  out["loss_mask"][lo:n] = 1.0
  out["old_logp"][lo:n] = row["old_logps"]
  out["adv"][lo:n] = row["advantage"]
  return out


def _empty_row(pad_id: int) -> Row:
  # One real (pad) token so no attention row is empty; loss mask stays 0.
  return {"prompt_ids": [pad_id, pad_id], "action_ids": [], "old_logps": [], "advantage": 0.0}


def batches(rows: Sequence[Row], *, batch_size: int, seq_len: int, pad_id: int,
            seed: int, epochs: int = 1) -> grain.MapDataset:
  """Shuffled (anew each epoch) fixed-shape batches over `rows`, `epochs` times."""
  if not rows:
    raise ValueError("no training rows")
  rows = list(rows)
  rows += [_empty_row(pad_id)] * (-len(rows) % batch_size)
  return (grain.MapDataset.source(rows)
          .shuffle(seed=seed)
          .repeat(epochs)
          .map(lambda r: row_arrays(r, seq_len))
          .batch(batch_size, drop_remainder=True))


def iterate(ds: grain.MapDataset) -> Iterator[dict[str, np.ndarray]]:
  return iter(ds.to_iter_dataset())
