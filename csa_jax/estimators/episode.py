"""Episode-level estimators: one advantage per rollout, the same on each of its steps.

- GRPO (Shao et al., 2024, DeepSeekMath, arXiv 2402.03300): episode reward normalised
  within its group, `A_E = (r - mean) / (std + eps)`.
- Dr.GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
  the same without the division by the std.
- RLOO (Ahmadian et al., 2024, arXiv 2402.14740): leave-one-out baseline,
  `A_i = r_i - mean_{j != i} r_j`.

Every output is 0 for padded rollouts and steps, never NaN or inf for finite inputs, and
carries no gradient (advantages are constants of the policy update).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from csa_jax.estimators.registry import register
from csa_jax.estimators.stats import (as_mask, center, check_ddof, combine,
                                      rewards_and_valid, standardize)


@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def episode_advantages(rewards_BxG, *, valid_BxG=None, std_normalize, eps, ddof):
  """GRPO episode advantage `(r - mean_i r) / (std_i r + eps)` per group (Dr.GRPO: no std).

  Args:
    rewards_BxG: episode reward of rollout i of group b.
    valid_BxG: which rollouts are real (default: all); statistics use only those, and
      padded rollouts get 0.
    std_normalize: False gives Dr.GRPO (mean-centred only; eps is then unused).
    eps: added to the std.
    ddof: delta degrees of freedom of the std (1 = unbiased, as torch.std in GRPO).

  Returns:
    adv_BxG, 0 for padded rollouts and for groups whose rewards are all equal or that
    have fewer than max(2, ddof + 1) real rollouts.
  """
  check_ddof(ddof)
  rewards_BxG, valid_BxG = rewards_and_valid(rewards_BxG, valid_BxG)
  if std_normalize:
    adv = standardize(rewards_BxG, valid_BxG, -1, eps=eps, ddof=ddof)
  else:
    c, s = center(rewards_BxG, valid_BxG, -1, ddof=ddof)
    adv = c * s
  return jax.lax.stop_gradient(adv)


@jax.jit
def rloo_advantages(rewards_BxG, *, valid_BxG=None):
  """RLOO: `r_i - mean_{j != i} r_j` over the real rollouts of each group.

  Equal to `n / (n - 1) * (r_i - mean_j r_j)` with n real rollouts; 0 where n < 2, for
  padded rollouts, and where all rewards are equal.
  """
  rewards_BxG, valid_BxG = rewards_and_valid(rewards_BxG, valid_BxG)
  c, s = center(rewards_BxG, valid_BxG, -1, ddof=1)
  n = jnp.sum(valid_BxG, axis=-1, keepdims=True)
  return jax.lax.stop_gradient(c * s * n / jnp.maximum(n - 1, 1))


@register("grpo")
def grpo(rewards_BxG, mask_BxGxT, *, eps, ddof, std_normalize):
  """GRPO's episode advantage over the rollouts with a step, on each of their steps."""
  mask = as_mask(mask_BxGxT)
  return combine(mask, episode_advantages(rewards_BxG, valid_BxG=mask.any(-1), eps=eps,
                                          ddof=ddof, std_normalize=std_normalize))


@register("dr_grpo")
def dr_grpo(rewards_BxG, mask_BxGxT):
  """Dr.GRPO: `r - mean r` on each step. It has no knob: no std, so no eps; and the one
  use of ddof, the smallest group that is not degenerate, is 2 rollouts for ddof 0 or 1."""
  mask = as_mask(mask_BxGxT)
  return combine(mask, episode_advantages(rewards_BxG, valid_BxG=mask.any(-1), eps=0.0,
                                          ddof=1, std_normalize=False))


@register("rloo")
def rloo(rewards_BxG, mask_BxGxT):
  """RLOO's episode advantage on each step."""
  mask = as_mask(mask_BxGxT)
  return combine(mask, rloo_advantages(rewards_BxG, valid_BxG=mask.any(-1)))
