"""Training rows split by their oracle step label: decisive (label +1 or -1: KeyDoor's key
choice) and routine (label 0: a step whose action does not change the outcome).

Two uses, both for telling how an estimator's credit acts on the two kinds of step:
- `algo.update_rows="decisive"` trains on the decisive rows alone (the routine rows are
  left out of the update; their advantages are still computed and logged);
- `algo.log_row_classes` logs, per iteration, each class's share of the policy-gradient
  (its norm), its mean token entropy and its mean |advantage| (`RowClassMetrics`).
Both need an environment with oracle labels on every step; one without says so.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from csa_jax import losses
from csa_jax.model import lora
from csa_jax.model.sampling import sampling_logprobs
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts

CLASSES = ("decisive", "routine")


def step_classes(oracle_BxGxT: np.ndarray, mask_BxGxT: np.ndarray) -> dict[str, np.ndarray]:
  """{"decisive", "routine"}: boolean [B, G, T] masks of the active steps of each class.
  Raises ValueError when an active step has no oracle label (NaN)."""
  act = np.asarray(mask_BxGxT).astype(bool)
  oracle = np.asarray(oracle_BxGxT)
  if np.isnan(oracle[act]).any():
    raise ValueError("algo.update_rows=decisive and algo.log_row_classes need an oracle step "
                     "label on every step; this environment leaves some unlabelled")
  return {"decisive": act & (oracle != 0), "routine": act & (oracle == 0)}


class RowClassMetrics:
  """Per class of rows, at the parameters an iteration's update starts from: the norm of
  the policy-gradient term's gradient over that class's rows, each row weighted as in the
  iteration's loss (a row's share 1 / rows of the iteration, the clipped objective of
  `algo.loss_agg`; with a "seq-mean" aggregation the two classes' gradients sum to the
  whole batch's), their mean token entropy under the sampling distribution and their mean
  |advantage|. The KL term is left out: it is the same for every estimator."""

  def __init__(self, graphdef, algo, sampling_cfg, *, seq_len: int, action_len: int,
               pad_id: int):
    self._kw = dict(batch_size=algo.minibatch_size, seq_len=seq_len, action_len=action_len,
                    pad_id=pad_id)

    def grad_entropy(params, batch, weight):
      def pg(p):
        logits_NxAxV = ts.action_logits(graphdef, p, batch)
        logp_NxA = sampling_logprobs(logits_NxAxV, batch["targets"], sampling_cfg)
        loss, _ = losses.clipped_policy_loss(
            logp_NxA, batch["old_logp"], batch["adv"], batch["loss_mask"],
            clip_low=algo.clip_low, clip_high=algo.clip_high,
            dual_clip=algo.dual_clip if algo.dual_clip > 0 else None, agg=algo.loss_agg)
        ent = losses.entropy_from_logits(logits_NxAxV, batch["loss_mask"], agg="token-mean")
        return loss * weight, ent
      (_, ent), grads = jax.value_and_grad(pg, has_aux=True)(params)
      if lora.tree_has_lora(params):  # what the update moves: the adapters
        grads = lora.trainable(grads)
      return grads, ent * batch["loss_mask"].sum()

    self._step = jax.jit(grad_entropy)

  def class_grads(self, params, rows: list, total_rows: int):
    """(gradient, mean token entropy) of `rows`, each weighted 1 / `total_rows`."""
    grads, ent, tokens = None, 0.0, 0.0
    for batch in data_lib.ordered_batches(rows, **self._kw):
      real = float((batch["loss_mask"].sum(-1) > 0).sum())
      g, e = self._step(params, batch, jnp.float32(real / total_rows))
      grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
      ent, tokens = ent + float(e), tokens + float(batch["loss_mask"].sum())
    return grads, ent / max(tokens, 1.0)

  def __call__(self, params, rows_by_class: dict[str, list], total_rows: int) -> dict:
    """rows/{class}_pg_grad_norm, _entropy, _abs_adv and _rows of each class that has
    rows this iteration."""
    out = {}
    for name in CLASSES:
      rows = rows_by_class[name]
      if not rows:
        continue
      grads, entropy = self.class_grads(params, rows, total_rows)
      out |= {f"rows/{name}_pg_grad_norm": float(optax.tree.norm(grads)),
              f"rows/{name}_entropy": entropy,
              f"rows/{name}_abs_adv": float(np.mean([abs(r["advantage"]) for r in rows])),
              f"rows/{name}_rows": len(rows)}
    return out
