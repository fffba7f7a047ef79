"""Multi-turn DPO, online iterative (M-DPO: Xiong et al., 2024, arXiv 2409.02392; code:
WeiXiongUST/Building-Math-Agents-with-Multi-Turn-Iterative-Preference-Learning).

Each iteration, from each task group of G rollouts of the current policy, one random
successful and one random failed episode form a pair (w, l); groups without both are
dropped. An episode's score is the sum of the policy's log-probs over its action tokens
only (the observations in the prompts are masked out):

  s(tau) = sum over steps t, action tokens k of log pi(a_t,k | ...),
  L = mean over pairs of -log sigmoid(beta * [(s_theta(w) - s_ref(w)) - (s_theta(l) - s_ref(l))]),

beta 0.1; the reference is the SFT policy or, with `mtdpo.reference=previous`, the
policy at the start of the iteration (pi_t). Then `algo.epochs` passes over the pairs
(the authors: one epoch per iteration). The log-probs are those of the sampling
distribution (the rollout temperature, 1 by default, where they are the model's own).
Not used: the clipped objective, advantages, the KL term (DPO's beta is its anchor).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from csa_jax.algorithms import base
from csa_jax.model.sampling import sampling_logprobs
from csa_jax.rollout import groups
from csa_jax.update import train_step as ts


# ----------------------------------------------------------------------------------------
# Pure functions.


def sequence_logp(logp_NxL, action_mask_NxL):
  """Per-row sum of the token log-probs where action_mask is 1 (observation and padding
  tokens contribute nothing, and get no gradient)."""
  return jnp.where(jnp.asarray(action_mask_NxL) > 0, logp_NxL, 0.0).sum(-1)


def mdpo_loss(s_pol_Px2, s_ref_Px2, valid_P, *, beta):
  """(mean over valid pairs of -log sigmoid(beta * margin), metrics); column 0 holds the
  winner's score, column 1 the loser's."""
  ratio_Px2 = s_pol_Px2 - jax.lax.stop_gradient(s_ref_Px2)
  margin_P = beta * (ratio_Px2[:, 0] - ratio_Px2[:, 1])
  valid = jnp.asarray(valid_P, bool)
  n = jnp.maximum(valid.sum(), 1)
  loss = jnp.where(valid, jax.nn.softplus(-margin_P), 0.0).sum() / n
  sg = jax.lax.stop_gradient(margin_P)
  return loss, {"dpo_loss": loss, "margin": jnp.where(valid, sg, 0.0).sum() / n,
                "reward_acc": jnp.where(valid, sg > 0, False).sum() / n}


def pick_pairs(won_BxG, real_BxG, rng: np.random.Generator) -> list[tuple[int, int, int]]:
  """(b, winner g, loser g) per group holding both a won and a lost episode."""
  pairs = []
  for b in range(won_BxG.shape[0]):
    w = np.flatnonzero(won_BxG[b] & real_BxG[b])
    l = np.flatnonzero(~won_BxG[b] & real_BxG[b])
    if w.size and l.size:
      pairs.append((b, int(rng.choice(w)), int(rng.choice(l))))
  return pairs


# ----------------------------------------------------------------------------------------
# Steps on packed pair batches.


def _pair_scores(batch, s_R, num_pairs):
  valid = batch["valid"] > 0
  s_Px2 = jnp.zeros((num_pairs, 2), jnp.float32).at[batch["unit"], batch["slot"]].add(
      jnp.where(valid, s_R, 0.0))
  valid_P = jnp.zeros((num_pairs,), jnp.int32).at[batch["unit"]].max(
      valid.astype(jnp.int32)) > 0
  return s_Px2, valid_P


def _row_scores(graphdef, scfg, params, batch):
  logp_RxA = sampling_logprobs(ts.action_logits(graphdef, params, batch), batch["targets"], scfg)
  return sequence_logp(logp_RxA, batch["loss_mask"])


def make_dpo_step(graphdef, tx, scfg, beta: float, num_pairs: int):
  def loss_fn(params, batch, ref_params):
    del ref_params  # the reference's scores are in the batch
    s_Px2, valid_P = _pair_scores(batch, _row_scores(graphdef, scfg, params, batch), num_pairs)
    ref_Px2, _ = _pair_scores(batch, batch["ref_logp"], num_pairs)
    return mdpo_loss(s_Px2, ref_Px2, valid_P, beta=beta)

  # ts.Update: the trainable part alone is differentiated and donated (LoRA adapters).
  return ts.Update(tx, loss_fn)


class MultiTurnDPO(base.Algorithm):
  name = "mtdpo"

  needs_sft_reference = True  # also with reference=previous: cheap, and one code path

  def __init__(self):
    self._ref_fn = None

  def _rows(self, ctx) -> int:
    return max(ctx.cfg.algo.minibatch_size, 2 * ctx.cfg.rollout.max_turns)

  def make_step(self, ctx):
    return make_dpo_step(ctx.graphdef, ctx.tx, ctx.sampling_cfg, ctx.cfg.algo.mtdpo.beta,
                         ctx.cfg.rollout.tasks_per_iter)

  def prepare(self, ctx, it, batch, params, aux) -> base.Prepared:
    c = ctx.cfg
    r = c.rollout
    rng = np.random.default_rng([c.seed, it])  # the same pairs after a resume
    arrays = batch.arrays
    pairs = pick_pairs(arrays.rewards_BxG > 0, arrays.mask_BxGxT.any(-1), rng)
    m = {"mtdpo/pairs": float(len(pairs)), "perf/aux_s": 0.0}
    if not pairs:
      return base.Prepared(rows=[], aux=aux, metrics=m, skip=True)
    units = groups.pair_units(batch, pairs, r.max_turns)
    t0 = time.perf_counter()
    if self._ref_fn is None:
      self._ref_fn = jax.jit(lambda p, b: _row_scores(ctx.graphdef, ctx.sampling_cfg, p, b))
    ref = ctx.ref_params if c.algo.mtdpo.reference == "sft" else params
    batches = []
    for _, batch in base.pack(units, rows_per_batch=self._rows(ctx),
                              units_per_batch=r.tasks_per_iter,
                              seq_len=r.seq_len,
                              action_len=r.max_action_tokens, pad_id=ctx.pad_id):
      batch["ref_logp"] = np.asarray(self._ref_fn(ref, ctx.to_device(batch)))
      batches.append(batch)
    m["perf/aux_s"] = time.perf_counter() - t0  # the reference's forward passes
    return base.Prepared(rows=batches, aux=aux, metrics=m)

  def update(self, ctx, step, state, prep, it, ref_params, observe=lambda upd: None):
    upd = {}
    for _ in range(ctx.cfg.algo.epochs):
      for batch in prep.rows:
        state, upd = step(state, ctx.to_device(batch), None)
        observe(upd)
    return state, upd
