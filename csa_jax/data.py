"""Grain pipelines from episodes to fixed-shape training batches (host side).

One training row is one agent step: the prompt the policy saw and the action it wrote.
The loss falls on the action tokens only; each of them carries that step's advantage
and the log-prob it had under the sampling policy (the PPO ratio's denominator). SFT
rows are the same with the expert's action, advantage 1 and no old log-probs.

Every row becomes arrays of fixed lengths (L inputs, A action tokens), and the row count is padded to whole
batches with rows whose loss mask is 0, so the jitted update compiles once.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import grain
import numpy as np

from csa_jax.rollout import Trajectory

Row = dict[str, Any]

# [N, L] over the whole row: inputs, attn_mask. [N, A] over the action tokens only:
# act_pos (the input position whose next token is action token a), targets, loss_mask,
# old_logp, adv. The update computes logits at act_pos alone.
BATCH_KEYS = ("inputs", "attn_mask", "act_pos", "targets", "loss_mask", "old_logp", "adv")


def rl_rows(trajs: Sequence[Trajectory], adv_BxGxT: np.ndarray, group_size: int,
            row_weight: str = "step") -> list[Row]:
  """One row per real step, with that step's advantage (trajectories group-major).

  row_weight "episode" scales each row's advantage by mean_len / len(its episode), so
  every episode carries the same total weight in the loss whatever its length (the
  clipped objective is linear in a positive advantage scale, so this is a row weight).
  """
  lens = [min(t.length, adv_BxGxT.shape[2]) for t in trajs]
  mean_len = float(np.mean([n for n in lens if n > 0])) if any(lens) else 1.0
  rows = []
  for k, tr in enumerate(trajs):
    b, g = divmod(k, group_size)
    scale = mean_len / lens[k] if row_weight == "episode" and lens[k] else 1.0
    for t, st in enumerate(tr.steps[: adv_BxGxT.shape[2]]):
      if not st.action_ids:
        continue
      rows.append({"prompt_ids": st.prompt_ids, "action_ids": st.action_ids,
                   "old_logps": st.action_logps,
                   "advantage": float(adv_BxGxT[b, g, t]) * scale})
  return rows


def sft_row(prompt_ids: list[int], action_ids: list[int]) -> Row:
  return {"prompt_ids": prompt_ids, "action_ids": action_ids,
          "old_logps": [0.0] * len(action_ids), "advantage": 1.0}


def row_arrays(row: Row, seq_len: int, action_len: int) -> dict[str, np.ndarray]:
  """Teacher-forcing arrays: `seq_len` input slots, `action_len` action-token slots.

  Input position act_pos[a] predicts targets[a], the a-th action token.
  """
  prompt, action = list(row["prompt_ids"]), list(row["action_ids"])
  seq = prompt + action
  if len(seq) - 1 > seq_len or len(action) > action_len:
    raise ValueError(f"row of {len(prompt)} prompt + {len(action)} action tokens does not "
                     f"fit seq_len {seq_len} + 1 / action_len {action_len}")
  n, a = len(seq) - 1, len(action)
  out = {"inputs": np.zeros(seq_len, np.int32), "attn_mask": np.zeros(seq_len, np.int32),
         "act_pos": np.zeros(action_len, np.int32), "targets": np.zeros(action_len, np.int32)}
  for k in ("loss_mask", "old_logp", "adv"):
    out[k] = np.zeros(action_len, np.float32)
  out["inputs"][:n] = seq[:-1]
  out["attn_mask"][:n] = 1
  out["act_pos"][:a] = np.arange(len(prompt) - 1, n)
  out["targets"][:a] = action
  out["loss_mask"][:a] = 1.0
  out["old_logp"][:a] = row["old_logps"]
  out["adv"][:a] = row["advantage"]
  return out


def empty_row(pad_id: int) -> Row:
  # One real (pad) token so no attention row is empty; loss mask stays 0.
  return {"prompt_ids": [pad_id, pad_id], "action_ids": [], "old_logps": [], "advantage": 0.0}


def batches(rows: Sequence[Row], *, batch_size: int, seq_len: int, action_len: int,
            pad_id: int, seed: int, epochs: int = 1) -> grain.MapDataset:
  """Shuffled (anew each epoch) fixed-shape batches over `rows`, `epochs` times."""
  if not rows:
    raise ValueError("no training rows")
  rows = list(rows)
  rows += [empty_row(pad_id)] * (-len(rows) % batch_size)
  return (grain.MapDataset.source(rows)
          .shuffle(seed=seed)
          .repeat(epochs)
          .map(lambda r: row_arrays(r, seq_len, action_len))
          .batch(batch_size, drop_remainder=True))


def iterate(ds: grain.MapDataset) -> Iterator[dict[str, np.ndarray]]:
  return iter(ds.to_iter_dataset())
