"""Grain pipelines from episodes to fixed-shape training batches (host side).

One training row is one agent step: the prompt the policy saw and the action it wrote.
The loss falls on the action tokens only; each of them carries that step's advantage
and the log-prob it had under the sampling policy (the PPO ratio's denominator). SFT
rows are the same with the expert's action, advantage 1 and no old log-probs.

Every row becomes arrays of fixed lengths (L inputs, A action tokens), and the row count is padded to whole
batches with rows whose loss mask is 0, so the jitted update compiles once.

Packing (`packed_batches`, optim.pack_rows): a minibatch holds the same rows, but their
tokens are laid first-fit into S sequences of L slots, several rows to a sequence, with
segment ids (attention stays within a row: a block-diagonal causal mask) and positions
restarting at 0 in each row, so every row sees exactly what it sees alone. The per-row
arrays ([R, A]: targets, loss mask, old log-probs, advantages) are those of the unpacked
batch; `act_idx` says where in the flattened [S * L] sequence slots each action token's
prediction is read. The loss is therefore the same function of the same rows.

A shared prefix (`packed_batches` with prefix_len P, optim.share_prefix): where a minibatch
is laid out one row per sequence, the first P prompt tokens every row starts with (the chat
markup and system message) are split off into `prefix`, and the rows keep what follows; the
update runs the prefix through the model once per micro-batch and every row attends to it
(`Decoder.hidden_states_prefixed`), the same logits up to float rounding for fewer tokens.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import grain
import numpy as np


Row = dict[str, Any]

# [N, L] over the whole row: inputs, attn_mask. [N, A] over the action tokens only:
# act_pos (the input position whose next token is action token a), targets, loss_mask,
# old_logp, adv. The update computes logits at act_pos alone.
BATCH_KEYS = ("inputs", "attn_mask", "act_pos", "targets", "loss_mask", "old_logp", "adv")
# A packed batch: [S, L] inputs, attn_mask, positions, segment_ids (0 on padding, 1, 2, ...
# for the rows of a sequence); [R, A] act_idx (flat slot in the batch's, or with micro-batches
# the micro-batch's, [S * L] sequence slots), targets, loss_mask, old_logp, adv.
PACKED_KEYS = ("inputs", "attn_mask", "positions", "segment_ids", "act_idx", "targets",
               "loss_mask", "old_logp", "adv")
# A prefixed batch: BATCH_KEYS with inputs and attn_mask [N, L - P] (what follows the P
# prompt tokens every row starts with) and act_pos shifted by -P to index them, and prefix
# [N, P] (those tokens, copied into every row so that the batch splits into micro-batches
# and over 'data' as any other; the update reads one row of it).
PREFIXED_KEYS = BATCH_KEYS + ("prefix",)
# A packed batch's sequence count is rounded up to the next of PACK_STEPS evenly spaced
# counts per doubling (1..8, then 9, 10, .. 16, 18, 20, .. 32, 36, ...): at most 1/PACK_STEPS
# of the sequences are rounding. A count already compiled is reused for a minibatch that
# needs fewer, down to 1 / (1 + PACK_REUSE_SLACK) of it (`reuse_count`), so a run compiles a
# new update shape only for a need no compiled count holds with that little to spare.
PACK_STEPS = 8
PACK_REUSE_SLACK = 0.25
# A packed step costs about 10% more per sequence than an unpacked one (segment masks, the
# gather of action slots; the quickstart measured 3.0-3.25 s against 2.6-2.9 s per update at
# the same count), so a minibatch is packed only where that saves at least 1/8 of them.
PACK_MAX_FILL = 7 / 8


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
  return (_shuffled(rows, batch_size, pad_id, seed, epochs)
          .map(lambda r: row_arrays(r, seq_len, action_len))
          .batch(batch_size, drop_remainder=True))


def ordered_batches(rows: Sequence[Row], *, batch_size: int, seq_len: int, action_len: int,
                    pad_id: int) -> list[dict[str, np.ndarray]]:
  """`rows` in their order as fixed-shape batches, the last padded with zero-loss rows
  (for a pass over rows whose order matters: evaluations, diagnostics)."""
  rows = list(rows) + [empty_row(pad_id)] * (-len(rows) % batch_size)
  arrays = [row_arrays(r, seq_len, action_len) for r in rows]
  return [{k: np.stack([a[k] for a in arrays[i:i + batch_size]]) for k in BATCH_KEYS}
          for i in range(0, len(arrays), batch_size)]


def _shuffled(rows: Sequence[Row], batch_size: int, pad_id: int, seed: int, epochs: int
              ) -> grain.MapDataset:
  """`rows` padded with zero-loss rows to whole batches, shuffled anew each epoch: the row
  order `batches` and `packed_batches` share."""
  if not rows:
    raise ValueError("no training rows")
  rows = list(rows)
  rows += [empty_row(pad_id)] * (-len(rows) % batch_size)
  return grain.MapDataset.source(rows).shuffle(seed=seed).repeat(epochs)


def first_fit(lengths: Sequence[int], capacity: int) -> list[int]:
  """First-fit decreasing: the bin of each item (longest first, ties in input order, each
  into the first bin with room), so the result depends on the lengths alone."""
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  room: list[int] = []
  where = [0] * len(lengths)
  for i in order:
    if lengths[i] > capacity:
      raise ValueError(f"an item of {lengths[i]} does not fit a bin of {capacity}")
    for b, free in enumerate(room):
      if lengths[i] <= free:
        break
    else:
      b = len(room)
      room.append(capacity)
    room[b] -= lengths[i]
    where[i] = b
  return where


def _token_lens(rows: Sequence[Row]) -> list[int]:
  """Input slots each row takes (0 for a row without action tokens: it holds none)."""
  return [len(r["prompt_ids"]) + len(r["action_ids"]) - 1 if r["action_ids"] else 0
          for r in rows]


def _bins(lens: list[int], seq_len: int, m: int) -> tuple[dict[int, list[int]], int]:
  """First-fit bins of each micro-batch's rows (rows j, j + m, ...), and the most bins
  any micro-batch needs (at least 1)."""
  bins = {j: first_fit(lens[j::m], seq_len) for j in range(m)}
  return bins, max([max(b, default=-1) + 1 for b in bins.values()] + [1])


def round_up_count(n: int, steps: int = PACK_STEPS) -> int:
  """n rounded up to the next of `steps` evenly spaced counts per doubling (n <= steps
  stays n)."""
  if n <= steps:
    return n
  step = 2 ** ((n - 1).bit_length() - 1) // steps  # 2^(k-1) < n <= 2^k
  return -(-n // step) * step


def seq_count(need: int, n_rows: int, micro_batches: int = 1, seq_multiple: int = 1) -> int:
  """Sequences per micro-batch for micro-batches that need `need`: rounded up by
  `round_up_count`, but never more than the micro-batch's rows (one row each always fits:
  the unpacked shape bounds it), then up so that the batch's sequence count is a multiple of
  `seq_multiple` (the mesh's data axis shards it)."""
  m = micro_batches
  local = min(round_up_count(need), n_rows // m)
  q = seq_multiple // math.gcd(m, seq_multiple)
  return -(-local // q) * q


def pack_rows(rows: Sequence[Row], *, seq_len: int, action_len: int, micro_batches: int = 1,
              seqs_per_micro: int = 0, seq_multiple: int = 1) -> dict[str, np.ndarray]:
  """One packed batch (PACKED_KEYS) of `rows`; rows without action tokens hold no tokens.

  Row r belongs to micro-batch r % micro_batches and its tokens go into that micro-batch's
  sequences, which are batch sequences j, j + m, ... (the slices of
  train_step.value_and_grad_micro), so each micro-batch is a packed batch of its own rows.
  Sequences per micro-batch: `seqs_per_micro`, or (0) `seq_count` of what these rows need.
  """
  m, n_rows = micro_batches, len(rows)
  if n_rows % m:
    raise ValueError(f"{n_rows} rows do not split into {m} micro-batches")
  arrays = [row_arrays(r, seq_len, action_len) for r in rows]
  lens = _token_lens(rows)
  bins, need = _bins(lens, seq_len, m)
  local = seqs_per_micro or seq_count(need, n_rows, m, seq_multiple)
  if local < need:
    raise ValueError(f"the rows need {need} sequences per micro-batch, {local} given")
  s = local * m
  out = {k: np.zeros((s, seq_len), np.int32)
         for k in ("inputs", "attn_mask", "positions", "segment_ids")}
  out["act_idx"] = np.zeros((n_rows, action_len), np.int32)
  for k in ("targets", "loss_mask", "old_logp", "adv"):
    out[k] = np.stack([a[k] for a in arrays])
  fill = [0] * s
  for j in range(m):
    for q, b in enumerate(bins[j]):
      r = j + q * m
      if not lens[r]:
        continue
      seq, start, n = b * m + j, fill[b * m + j], lens[r]
      fill[seq] += n
      sl = slice(start, start + n)
      out["inputs"][seq, sl] = arrays[r]["inputs"][:n]
      out["attn_mask"][seq, sl] = 1
      out["positions"][seq, sl] = np.arange(n)
      out["segment_ids"][seq, sl] = out["segment_ids"][seq].max() + 1
      a = len(rows[r]["action_ids"])
      out["act_idx"][r, :a] = b * seq_len + start + arrays[r]["act_pos"][:a]
  return out


def packed_needs(rows: Sequence[Row], *, batch_size: int, seq_len: int, pad_id: int, seed: int,
                 epochs: int = 1, micro_batches: int = 1, seq_multiple: int = 1) -> list[int]:
  """Sequences per micro-batch each minibatch of `packed_batches` with these arguments needs,
  in order: `seq_count` of what its rows take (lengths alone decide it)."""
  m = micro_batches
  minibatches = (_shuffled(rows, batch_size, pad_id, seed, epochs)
                 .batch(batch_size, drop_remainder=True, batch_fn=list))
  return [seq_count(_bins(_token_lens(mb), seq_len, m)[1], batch_size, m, seq_multiple)
          for mb in minibatches]


def reuse_count(need: int, compiled: list[int], rows: int) -> int:
  """The sequence count for a minibatch of `rows` rows (per micro-batch) that needs `need`:
  0 (lay it out unpacked) where packing would save less than 1 - PACK_MAX_FILL of the
  sequences; else the smallest count already compiled that holds it with at most
  PACK_REUSE_SLACK of its sequences spare, else `need` itself, which joins `compiled` (the
  caller's list, one per update shape it compiled)."""
  if need > PACK_MAX_FILL * rows:
    return 0
  fits = [c for c in compiled if need <= c <= need * (1 + PACK_REUSE_SLACK)]
  if fits:
    return min(fits)
  compiled.append(need)
  return need


def common_prefix_len(rows: Sequence[Row]) -> int:
  """How many first prompt ids every row with action tokens starts with (a row without
  holds no tokens), leaving each at least one prompt token of its own: the last prompt
  token predicts the first action token, so it must be among the row's own. 0 for none."""
  prompts = [r["prompt_ids"] for r in rows if r["action_ids"]]
  if not prompts:
    return 0
  n = max(min(len(p) for p in prompts) - 1, 0)
  first = prompts[0]
  for p in prompts[1:]:
    n = next((i for i in range(n) if p[i] != first[i]), n)
  return n


def reuse_prefix_len(common: int, compiled: list[int]) -> int:
  """The prefix length to split off rows that share `common` first tokens: the longest one
  already compiled that they hold (a shorter prefix serves as well, and each length is
  another update shape), else `common`, which joins `compiled` (the caller's list)."""
  fits = [p for p in compiled if p <= common]
  if fits:
    return max(fits)
  if common:
    compiled.append(common)
  return common


def prefixed(batch: dict[str, np.ndarray], prefix_ids: Sequence[int]) -> dict[str, np.ndarray]:
  """An unpacked batch (BATCH_KEYS) of rows that start with `prefix_ids`, those split off
  (PREFIXED_KEYS); targets, loss masks, old log-probs and advantages stay as they are."""
  p = len(prefix_ids)
  out = dict(batch, inputs=batch["inputs"][:, p:], attn_mask=batch["attn_mask"][:, p:])
  # An action slot past a row's action keeps index 0 (its loss mask is 0).
  out["act_pos"] = np.where(batch["loss_mask"] > 0, batch["act_pos"] - p, 0).astype(np.int32)
  out["prefix"] = np.tile(np.asarray(prefix_ids, np.int32), (len(batch["inputs"]), 1))
  return out


def packed_batches(rows: Sequence[Row], *, batch_size: int, seq_len: int, action_len: int,
                   pad_id: int, seed: int, epochs: int = 1, micro_batches: int = 1,
                   seq_multiple: int = 1, seqs_per_micro: Sequence[int] = (),
                   prefix_len: int = 0) -> grain.MapDataset:
  """`batches` packed: the same rows in the same minibatches (the same padding rows,
  shuffle and repeat), minibatch i laid out by `pack_rows` in `seqs_per_micro[i]` sequences
  per micro-batch (0: unpacked, as `batches` lays it out), or (empty) in what it needs
  (`packed_needs`). The trainer passes `reuse_count`'s counts, so a run compiles a few
  update shapes and packs only where it pays. prefix_len P > 0 (at most
  `common_prefix_len(rows)`): an unpacked minibatch is laid out `prefixed`, its rows' first
  P prompt tokens split off."""
  counts = list(seqs_per_micro) or packed_needs(
      rows, batch_size=batch_size, seq_len=seq_len, pad_id=pad_id, seed=seed, epochs=epochs,
      micro_batches=micro_batches, seq_multiple=seq_multiple)
  if prefix_len > common_prefix_len(rows):
    raise ValueError(f"the rows do not all start with the same {prefix_len} prompt tokens "
                     f"and one of their own")
  prefix_ids = next((r["prompt_ids"][:prefix_len] for r in rows if r["action_ids"]), [])

  def lay_out(i, mb):
    if not counts[i]:
      arrays = [row_arrays(r, seq_len, action_len) for r in mb]
      batch = {k: np.stack([a[k] for a in arrays]) for k in BATCH_KEYS}
      return prefixed(batch, prefix_ids) if prefix_len else batch
    return pack_rows(mb, seq_len=seq_len, action_len=action_len,
                     micro_batches=micro_batches, seqs_per_micro=counts[i])

  return (_shuffled(rows, batch_size, pad_id, seed, epochs)
          .batch(batch_size, drop_remainder=True, batch_fn=list)
          .map_with_index(lay_out))


def token_counts(batch: dict[str, np.ndarray], micro_batches: int = 1) -> tuple[int, int]:
  """(tokens of real rows, all token slots) of a batch, packed, prefixed or neither, as the
  update computes it in `micro_batches` slices: a padding row of an unpacked batch holds
  one pad token that counts as padding; a prefixed batch's prefix counts once a slice."""
  mask = batch["attn_mask"]
  if "segment_ids" in batch:
    return int(mask.sum()), mask.size
  real, slots = int(mask[batch["loss_mask"].any(-1)].sum()), mask.size
  if "prefix" in batch:
    shared = micro_batches * batch["prefix"].shape[1]
    real, slots = real + shared, slots + shared
  return real, slots


def iterate(ds: grain.MapDataset) -> Iterator[dict[str, np.ndarray]]:
  return iter(ds.to_iter_dataset())
