"""Policy-gradient losses over padded token rows: PPO/GRPO/DAPO clipped objective, KL, entropy.

Implements:
- the PPO clipped surrogate (Schulman et al., 2017, arXiv 1707.06347) as used by GRPO
  (Shao et al., 2024, arXiv 2402.03300), with DAPO's decoupled clip range "clip-higher"
  (Yu et al., 2025, arXiv 2503.14476: eps_low 0.2, eps_high 0.28) and the dual clip of
  Ye et al., 2020 (arXiv 1912.09729) for negative advantages;
- loss aggregation modes as named in verl: "token-mean" (DAPO's token-level loss),
  "seq-mean-token-mean" (GRPO), "seq-mean-token-sum", and "seq-mean-token-sum-norm"
  (Dr.GRPO, arXiv 2503.20783: token sum over a constant length);
- KL-to-reference estimators k1, k2, k3 (Schulman, "Approximating KL divergence", 2020;
  k3 is GRPO's low-variance unbiased estimator);
- token entropy and token log-probs from logits.

Shapes: N rows, L tokens per row. In this project one row is one agent step (prompt +
action) and `mask_NxL` is 1 on the action tokens only. All functions are pure and
jit-friendly; `agg` and `kind` are Python strings (static).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
             "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")
# exp() of a log-ratio beyond this overflows float32 sums; verl clamps at 20 as well.
_MAX_LOG_RATIO = 20.0


def _check_2d(**arrays):
  shape = None
  for name, x in arrays.items():
    if x.ndim != 2:
      raise ValueError(f"{name} must have shape [N, L], got {x.shape}")
    if shape is not None and x.shape != shape:
      raise ValueError(f"{name} has shape {x.shape}, expected {shape} like the others")
    shape = x.shape


def aggregate(loss_NxL, mask_NxL, agg="token-mean"):
  """Reduce per-token values to a scalar over the tokens where mask is 1.

  token-mean: sum over all tokens / number of tokens (each token weighs the same;
    long rows weigh more). Note: over a minibatch, so grad accumulation over
    microbatches must weigh by token counts to equal one big batch.
  seq-mean-token-mean: mean over rows of the row's token mean (each row weighs the same).
  seq-mean-token-sum: mean over rows of the row's token sum.
  seq-mean-token-sum-norm: mean over rows of the row's token sum / L (L = padded row
    length, a constant: Dr.GRPO's unbiased normaliser).
  Rows without any token count in no seq-mean; an empty batch gives 0.
  """
  if agg not in AGG_MODES:
    raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(AGG_MODES)}")
  mask = jnp.asarray(mask_NxL) != 0
  x = jnp.where(mask, loss_NxL, 0.0)
  if agg == "token-mean":
    return jnp.sum(x) / jnp.maximum(jnp.sum(mask), 1)
  count_N = jnp.sum(mask, axis=-1)
  if agg == "seq-mean-token-mean":
    row_N = jnp.sum(x, axis=-1) / jnp.maximum(count_N, 1)
  elif agg == "seq-mean-token-sum":
    row_N = jnp.sum(x, axis=-1)
  else:
    row_N = jnp.sum(x, axis=-1) / mask.shape[-1]
  rows = count_N > 0
  return jnp.sum(jnp.where(rows, row_N, 0.0)) / jnp.maximum(jnp.sum(rows), 1)


def clipped_policy_loss(logp_NxL, old_logp_NxL, adv_NxL, mask_NxL, *, clip_low=0.2,
                        clip_high=0.2, dual_clip=None, agg="token-mean"):
  """PPO clipped surrogate, to minimise: -min(r A, clip(r, 1 - low, 1 + high) A).

  Args:
    logp_NxL: log pi_theta of each token (differentiated).
    old_logp_NxL: log pi_old of each token at sampling time (constant).
    adv_NxL: advantage of each token (constant; the step's advantage on its tokens).
    mask_NxL: 1 on tokens that carry loss (action tokens).
    clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high]; DAPO uses
      0.2 / 0.28 ("clip-higher": more room to raise unlikely tokens).
    dual_clip: None, or c > 1: for A < 0 the loss is at most -c A (Ye et al., 2020), so
      a huge ratio on a bad token cannot dominate the batch.
    agg: see `aggregate`.

  Returns:
    (loss, metrics): metrics are token means over the mask: clip_frac (either side
    bound), clip_frac_low, clip_frac_high, dual_clip_frac, approx_kl (k3 estimate of
    KL(pi_old || pi_theta)), approx_kl_k1, ratio_mean, ratio_max, pg_loss_token_mean.
    Metrics carry no gradient.
  """
  logp_NxL = jnp.asarray(logp_NxL, jnp.float32)
  old_logp_NxL = jax.lax.stop_gradient(jnp.asarray(old_logp_NxL, jnp.float32))
  adv_NxL = jax.lax.stop_gradient(jnp.asarray(adv_NxL, jnp.float32))
  mask_NxL = jnp.asarray(mask_NxL) != 0
  _check_2d(logp_NxL=logp_NxL, old_logp_NxL=old_logp_NxL, adv_NxL=adv_NxL,
            mask_NxL=mask_NxL)
  if not (0 <= clip_low < 1 and clip_high >= 0):
    raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, "
                     f"{clip_high}")
  if dual_clip is not None and not dual_clip > 1:
    raise ValueError(f"dual_clip must be None or > 1, got {dual_clip}")

  # Padded tokens may hold anything; keep them out of exp() and of the gradient.
  log_ratio = jnp.where(mask_NxL, logp_NxL - old_logp_NxL, 0.0)
  log_ratio = jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  ratio = jnp.exp(log_ratio)
  adv = jnp.where(mask_NxL, adv_NxL, 0.0)
  pg_unclipped = -adv * ratio
  pg_clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  pg = jnp.maximum(pg_unclipped, pg_clipped)
  dual_hit = jnp.zeros_like(mask_NxL)
  if dual_clip is not None:
    pg_dual = -adv * dual_clip
    dual_hit = (adv < 0) & (pg > pg_dual)
    pg = jnp.where(dual_hit, pg_dual, pg)
  loss = aggregate(pg, mask_NxL, agg)

  sg = jax.lax.stop_gradient
  r, lr = sg(ratio), sg(log_ratio)
  tm = lambda x: aggregate(x.astype(jnp.float32), mask_NxL, "token-mean")
  metrics = {
      "clip_frac": tm(sg(pg_clipped > pg_unclipped)),
      "clip_frac_low": tm((r < 1.0 - clip_low) & (adv < 0)),
      "clip_frac_high": tm((r > 1.0 + clip_high) & (adv > 0)),
      "dual_clip_frac": tm(dual_hit),
      "approx_kl": tm(r - 1.0 - lr),
      "approx_kl_k1": tm(-lr),
      "ratio_mean": tm(r),
      "ratio_max": jnp.max(jnp.where(mask_NxL, r, 0.0)),
      "pg_loss_token_mean": tm(sg(pg)),
  }
  return loss, metrics


def kl_estimate(logp_NxL, ref_logp_NxL, *, kind="k3"):
  """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

  With x = log pi_ref - log pi_theta:
    k1 = -x               unbiased, high variance, can be negative;
    k2 = x^2 / 2          biased, low variance, >= 0;
    k3 = exp(x) - 1 - x   unbiased, low variance, >= 0 (GRPO's choice).
  x is clipped to +-20 before exp so that k3 stays finite.
  """
  if kind not in KL_KINDS:
    raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_KINDS)}")
  x = jnp.asarray(ref_logp_NxL, jnp.float32) - jnp.asarray(logp_NxL, jnp.float32)
  if kind == "k1":
    return -x
  if kind == "k2":
    return 0.5 * x**2
  x = jnp.clip(x, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  return jnp.expm1(x) - x


def kl_penalty(logp_NxL, ref_logp_NxL, mask_NxL, *, kind="k3", agg="token-mean"):
  """KL(pi_theta || pi_ref) loss term: `kl_estimate` aggregated over the mask.

  Differentiable in logp_NxL; ref_logp_NxL is a constant. Add `beta * kl_penalty(...)`
  to the policy loss (GRPO: beta = 0.04; DAPO and Dr.GRPO drop it).
  """
  logp_NxL = jnp.asarray(logp_NxL, jnp.float32)
  ref_logp_NxL = jax.lax.stop_gradient(jnp.asarray(ref_logp_NxL, jnp.float32))
  mask_NxL = jnp.asarray(mask_NxL) != 0
  _check_2d(logp_NxL=logp_NxL, ref_logp_NxL=ref_logp_NxL, mask_NxL=mask_NxL)
  # Padded tokens may hold anything (NaN included): give them a zero log-ratio before
  # any nonlinearity, or 0 * NaN would reach the gradient.
  zero = jnp.zeros_like(logp_NxL)
  est = kl_estimate(jnp.where(mask_NxL, logp_NxL, zero),
                    jnp.where(mask_NxL, ref_logp_NxL, zero), kind=kind)
  return aggregate(est, mask_NxL, agg)


def token_entropy(logits_NxLxV):
  """Entropy (nats) of the softmax at each position, computed in float32."""
  logits = jnp.asarray(logits_NxLxV, jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_from_logits(logits_NxLxV, mask_NxL, *, agg="token-mean"):
  """Mean token entropy over the mask (for logging; differentiable if used as a bonus)."""
  logits_NxLxV = jnp.asarray(logits_NxLxV)
  if logits_NxLxV.ndim != 3:
    raise ValueError(f"logits_NxLxV must have shape [N, L, V], got {logits_NxLxV.shape}")
  _check_2d(mask_NxL=jnp.asarray(mask_NxL))
  if logits_NxLxV.shape[:2] != jnp.shape(mask_NxL):
    raise ValueError(f"logits_NxLxV {logits_NxLxV.shape} and mask_NxL "
                     f"{jnp.shape(mask_NxL)} disagree on [N, L]")
  return aggregate(token_entropy(logits_NxLxV), mask_NxL, agg)


def token_logprobs(logits_NxLxV, tokens_NxL):
  """log softmax(logits)[token] at each position, float32.

  Align before calling: logits at position l must be the prediction of tokens[l].
  """
  logp = jax.nn.log_softmax(jnp.asarray(logits_NxLxV, jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, jnp.asarray(tokens_NxL)[..., None], axis=-1)[..., 0]
