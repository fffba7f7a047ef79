"""iStar: implicit step rewards from a PRM trained by trajectory DPO (Liu et al., 2025,
arXiv 2509.19199; code: Tongyi-ConvAI/Tongyi-Character, `CharacterRL-iStar/`).

The PRM is a second copy of the policy, initialised from the same SFT weights, with its
own AdamW. Per iteration, on the episodes just played:

  r_t = beta * (log pi_prm(a_t) - log pi_old(a_t))   summed over the action's tokens;
  PRM loss: in each task group, over every (success, failure) pair of episodes,
            -log sigmoid(Q_success - Q_failure), Q = mean of r_t over the episode's
            steps; groups without both are skipped; the mean over all pairs;
  one PRM step (forward and backward on every step row, gradients accumulated over
  row batches); the advantages use r from before that step:
  A[b,i,t] = RLOO_i(R) + alpha * (rn[b,i,t] - mean of rn over the group's other steps),
            rn = r / (max |r| over the batch + 1e-6).

Then the project's clipped policy update. Defaults as the authors': beta 0.05,
alpha 1.0, PRM AdamW without weight decay, gradient clip 10.

Differences from the released code, on purpose:
- the step term's leave-one-out mean is over all other steps of the group, as its
  docstring says ("compared to all other steps in the same group"); the code's mean
  takes one step per trajectory (the first row it meets of each), a quirk;
- log pi_prm is taken under the sampling distribution (temperature), like pi_old, so a
  PRM equal to the policy gives r = 0 at any temperature (the authors sample at 1);
- the policy update keeps this project's KL anchor, invalid-action penalty and episode
  row weighting, like every method here (the authors: no KL, token-mean loss).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from csa_jax.algorithms import base
from csa_jax.algorithms.estimator import shaped_rewards
from csa_jax.estimators import combine, rloo_advantages
from csa_jax.model import lora
from csa_jax.model.sampling import sampling_logprobs
from csa_jax.rollout import groups
from csa_jax.update import train_step as ts

_NORM_EPS = 1e-6


# ----------------------------------------------------------------------------------------
# Pure functions.


def implicit_step_reward(prm_logp, old_logp, mask, *, beta):
  """r = beta * (log pi_prm(a) - log pi_old(a)) where mask, 0 elsewhere (any shape;
  each entry is a whole action's log-prob)."""
  return jnp.where(mask, beta * (jnp.asarray(prm_logp, jnp.float32)
                                 - jnp.asarray(old_logp, jnp.float32)), 0.0)


def prm_pair_loss(r_BxGxT, mask_BxGxT, won_BxG):
  """(sum over pairs of -log sigmoid(Q_w - Q_l), number of pairs).

  Q[b,i] = mean of r over episode i's steps; a pair is (i won, j lost) in the same
  group b, both with at least one step. Differentiable in r.
  """
  mask = jnp.asarray(mask_BxGxT, bool)
  n_BxG = mask.sum(-1)
  q_BxG = jnp.where(mask, r_BxGxT, 0.0).sum(-1) / jnp.maximum(n_BxG, 1)
  real_BxG = n_BxG > 0
  won = jnp.asarray(won_BxG, bool) & real_BxG
  lost = ~jnp.asarray(won_BxG, bool) & real_BxG
  pair_BxGxG = won[:, :, None] & lost[:, None, :]
  # -log sigmoid(x) = softplus(-x), stable for any x.
  loss_BxGxG = jax.nn.softplus(-(q_BxG[:, :, None] - q_BxG[:, None, :]))
  return jnp.where(pair_BxGxG, loss_BxGxG, 0.0).sum(), pair_BxGxG.sum()


@jax.jit
def istar_advantages(rewards_BxG, r_BxGxT, mask_BxGxT, alpha):
  """A = RLOO episode term + alpha * leave-one-out step term of the normalised r."""
  mask = jnp.asarray(mask_BxGxT, bool)
  a_e_BxG = rloo_advantages(rewards_BxG, valid_BxG=mask.any(-1))
  r = jnp.where(mask, jnp.asarray(r_BxGxT, jnp.float32), 0.0)
  rn = r / (jnp.max(jnp.abs(r)) + _NORM_EPS)
  n_B = mask.sum((1, 2), keepdims=True)
  others = (rn.sum((1, 2), keepdims=True) - rn) / jnp.maximum(n_B - 1, 1)
  a_s = jnp.where(mask & (n_B > 1), rn - others, 0.0)
  return jax.lax.stop_gradient(combine(mask, a_e_BxG, (alpha, a_s)))


# ----------------------------------------------------------------------------------------
# The PRM on packed row batches.


def _prm_loss_fn(graphdef, scfg, beta, num_groups, group_size, max_turns):
  """(params, batch, won_UxG) -> (pair-loss sum, (r per row, pairs))."""

  def loss_fn(params, batch, won_UxG):
    logp_RxA = sampling_logprobs(ts.action_logits(graphdef, params, batch), batch["targets"], scfg)
    m = batch["loss_mask"]
    valid = batch["valid"] > 0
    r_R = implicit_step_reward((logp_RxA * m).sum(-1), (batch["old_logp"] * m).sum(-1),
                               valid, beta=beta)
    where = (batch["unit"], batch["slot"], batch["step"])
    shape = (num_groups, group_size, max_turns)
    r_UxGxT = jnp.zeros(shape, jnp.float32).at[where].add(r_R)
    mask_UxGxT = jnp.zeros(shape, jnp.int32).at[where].max(valid.astype(jnp.int32)) > 0
    loss_sum, pairs = prm_pair_loss(r_UxGxT, mask_UxGxT, won_UxG)
    return loss_sum, (r_R, pairs)

  return loss_fn


class IStar(base.Algorithm):
  name = "istar"

  def __init__(self):
    self._fns = {}  # (G, T) -> the jitted PRM gradient and update

  def init_aux(self, cfg, params) -> dict:
    s = cfg.algo.istar
    # A copy: the policy's buffers are donated to its jitted step.
    prm = jax.tree.map(jnp.copy, params)
    return {"prm": ts.init_state(prm, base.aux_optimizer(s.learning_rate, s.grad_clip))}

  def _compile(self, ctx, G: int, T: int):
    """The PRM's jitted gradient and update for task groups of G episodes of T steps."""
    if (G, T) not in self._fns:
      c, s = ctx.cfg, ctx.cfg.algo.istar
      loss_fn = _prm_loss_fn(ctx.graphdef, ctx.sampling_cfg, s.beta, c.rollout.tasks_per_iter,
                             G, T)
      tx = base.aux_optimizer(s.learning_rate, s.grad_clip)
      # The gradient of the trainable part only (a LoRA PRM's adapters; all of a full one).
      grad_t = jax.value_and_grad(
          lambda t, frozen, b, w: loss_fn(lora.merge(t, frozen), b, w), has_aux=True)
      grad = jax.jit(lambda p, b, w: grad_t(*lora.split(p), b, w))
      apply = jax.jit(lambda st, loss, g: ts.apply_update(tx, st, loss, g, {}),
                      donate_argnums=0)
      self._fns[G, T] = grad, apply
    return self._fns[G, T]

  def prepare(self, ctx, it, groups_batch, params, aux) -> base.Prepared:
    c, s = ctx.cfg, ctx.cfg.algo.istar
    r = c.rollout
    t0 = time.perf_counter()
    arrays = groups_batch.arrays
    _, G, T = arrays.mask_BxGxT.shape
    grad_fn, apply_fn = self._compile(ctx, G, T)
    prm = aux["prm"]
    units = groups.group_units(groups_batch, T)
    won_BxG = arrays.rewards_BxG > 0
    r_BxGxT = np.zeros(arrays.mask_BxGxT.shape, np.float32)
    grads, loss_sum, pairs = None, 0.0, 0
    for idx, batch in base.pack(units, rows_per_batch=max(s.batch_rows, G * T),
                                units_per_batch=r.tasks_per_iter,
                                seq_len=r.seq_len,
                                action_len=r.max_action_tokens, pad_id=ctx.pad_id):
      won_UxG = np.zeros((r.tasks_per_iter, G), bool)
      won_UxG[:len(idx)] = won_BxG[idx]
      (ls, (r_R, n)), g = grad_fn(prm.params, ctx.to_device(batch), jnp.asarray(won_UxG))
      grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
      loss_sum, pairs = loss_sum + float(ls), pairs + int(n)
      ok = batch["valid"] > 0
      b_R = np.asarray(idx)[batch["unit"][ok]]
      r_BxGxT[b_R, batch["slot"][ok], batch["step"][ok]] = np.asarray(r_R)[ok]
    m = {"istar/pairs": float(pairs),
         "istar/r_abs_max": float(np.abs(r_BxGxT).max(initial=0.0))}
    if pairs:  # one PRM step on the mean pair loss; no pair, no step (and no Adam drift)
      grads = jax.tree.map(lambda x: x / pairs, grads)
      prm, upd = apply_fn(prm, jnp.float32(loss_sum / pairs), grads)
      m |= {"istar/prm_loss": loss_sum / pairs} | {f"istar/prm_{k}": float(v)
                                                    for k, v in upd.items()}
    m["perf/aux_s"] = time.perf_counter() - t0
    rewards_BxG, _ = shaped_rewards(arrays, c.algo, r)
    adv_BxGxT = np.asarray(istar_advantages(jnp.asarray(rewards_BxG), jnp.asarray(r_BxGxT),
                                            jnp.asarray(arrays.mask_BxGxT), s.alpha))
    rows = groups.rl_rows(groups_batch, adv_BxGxT, c.algo.row_weight)
    return base.Prepared(rows=rows, aux={"prm": prm}, metrics=m, adv_BxGxT=adv_BxGxT,
                         skip=base.skip_update(adv_BxGxT, c.algo))
