"""GiGPO (Feng et al., 2025, verl-agent, arXiv 2505.10978), and CSA+GiGPO.

GiGPO: steps of one task group whose anchor state is identical form a step group; A_S is
the discounted return normalised within it; `A = A_E + w * A_S`. CSA+GiGPO adds both step
terms to one episode term (`csa_gigpo_advantages`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from csa_jax.estimators.csa import csa_components
from csa_jax.estimators.episode import episode_advantages
from csa_jax.estimators.registry import register
from csa_jax.estimators.stats import (as_mask, check_ddof, check_state_id, check_steps,
                                      combine, f32, segment_normalize, step_groups)


def discounted_returns(step_rewards_BxGxT, mask_BxGxT, gamma):
  """R_t = r_t + gamma * R_next over the active steps of each rollout, 0 on padding.

  "Next" is the next active step: padded steps inside a rollout are skipped, so
  inserting padding changes no real entry.
  """
  m_TxBxG = jnp.moveaxis(as_mask(mask_BxGxT), -1, 0)
  r_TxBxG = jnp.where(m_TxBxG, jnp.moveaxis(f32(step_rewards_BxGxT), -1, 0), 0.0)

  def back(carry_BxG, r_m):
    r, m = r_m
    carry_BxG = jnp.where(m, r + gamma * carry_BxG, carry_BxG)
    return carry_BxG, jnp.where(m, carry_BxG, 0.0)

  _, ret_TxBxG = jax.lax.scan(back, jnp.zeros(r_TxBxG.shape[1:], jnp.float32),
                              (r_TxBxG, m_TxBxG), reverse=True)
  return jnp.moveaxis(ret_TxBxG, 0, -1)


@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def gigpo_components(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, *, gamma,
                     std_normalize, eps, ddof):
  """GiGPO's parts: (A_E [B, G], A_S [B, G, T], step_group_size [B, G, T]).

  A_E normalises the episode return R_i = sum_t r_{i,t} over the rollouts of the group
  (paper Eq. 3). A_S normalises the discounted return from each step (Eq. 5) over its
  anchor-state step group (Eq. 6-7): the active steps of the same task group whose
  state ids are equal, whichever rollout and step index they come from. A step group of
  one member (or fewer than ddof + 1), or whose returns are all equal, gets A_S = 0, as
  in verl-agent (a singleton is centred on itself).

  Differences from verl-agent's code (gigpo/core_gigpo.py), all choices of the paper's
  text over the code: A_E statistics are over trajectories (verl-agent's default
  `compute_mean_std_cross_steps=True` weighs each trajectory by its number of steps);
  std_normalize=True is its mode "mean_std_norm" (its default is "mean_norm", i.e.
  std_normalize=False); no similarity-based grouping (ids must be equal).
  """
  mask_BxGxT = as_mask(mask_BxGxT)
  step_rewards_BxGxT = f32(step_rewards_BxGxT)
  state_id_BxGxT = check_state_id(state_id_BxGxT)
  check_steps(mask_BxGxT, step_rewards_BxGxT=step_rewards_BxGxT,
              state_id_BxGxT=state_id_BxGxT)
  check_ddof(ddof)
  B, G, T = mask_BxGxT.shape
  episode_return_BxG = jnp.sum(jnp.where(mask_BxGxT, step_rewards_BxGxT, 0.0), axis=-1)
  adv_e_BxG = episode_advantages(episode_return_BxG, valid_BxG=mask_BxGxT.any(-1),
                                 std_normalize=std_normalize, eps=eps, ddof=ddof)
  ret_BxGxT = discounted_returns(step_rewards_BxGxT, mask_BxGxT, gamma)
  seg_BxGxT, size_BxGxT = step_groups(state_id_BxGxT, mask_BxGxT)
  adv_s = segment_normalize(ret_BxGxT.reshape(-1), mask_BxGxT.reshape(-1),
                            seg_BxGxT.reshape(-1), B * G * T, eps=eps, ddof=ddof,
                            std_normalize=std_normalize)
  return (adv_e_BxG, jax.lax.stop_gradient(adv_s.reshape(B, G, T)), size_BxGxT)


def gigpo_step_term(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, *, gamma,
                    std_normalize, eps, ddof):
  """GiGPO's step term A_S alone, 0 off the active steps (the credit study's
  `gigpo_step`)."""
  return gigpo_components(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, gamma=gamma,
                          std_normalize=std_normalize, eps=eps, ddof=ddof)[1]


@register("gigpo", step_term=gigpo_step_term)
@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def gigpo_advantages(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, *, gamma, w,
                     std_normalize, eps, ddof):
  """GiGPO (arXiv 2505.10978): `A = A_E + w * A_S` on active steps, 0 elsewhere.

  Args:
    step_rewards_BxGxT: reward received at each step (sparse tasks: the outcome on the
      last step, 0 before); the episode return is their sum.
    mask_BxGxT: true where rollout i of group b has a step t.
    state_id_BxGxT: int id of the anchor state at each step (no history; see
      `rollout.step_anchor`: the environment's state, or the observation text as in
      verl-agent); equal ids within a task group are the same state.
    gamma: discount of the step-level return (paper: 0.95).
    w: weight of the step term (paper: 1).
    std_normalize, eps, ddof: as in `episode_advantages`, for both terms.
  See `gigpo_components` for the exact definitions.
  """
  adv_e_BxG, adv_s_BxGxT, _ = gigpo_components(
      step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, gamma=gamma,
      std_normalize=std_normalize, eps=eps, ddof=ddof)
  return combine(mask_BxGxT, adv_e_BxG, (w, adv_s_BxGxT))


@register("csa_gigpo")
@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_gigpo_advantages(step_rewards_BxGxT, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *,
                         lam, gamma, w, eps, ddof):
  """CSA and GiGPO step terms on one episode term: `A = A_E + lam A_S^CSA + w A_S^GiGPO`.

  The two step terms use different evidence and are each zero-mean within their own
  groups: GiGPO's compares returns from the same anchor state (it is 0 for states that
  no sibling visited, common in long or diverse episodes), CSA's compares log-prob
  deviations at the same step index (available at every step with >= 2 active
  rollouts). A_E normalises the episode return sum_t r_t (with std); CSA's l uses that
  A_E. w = 0 gives CSA on episode returns; lam = 0 gives GiGPO with std_normalize=True.
  """
  mask = as_mask(mask_BxGxT)
  adv_e_BxG, gig_s_BxGxT, _ = gigpo_components(
      step_rewards_BxGxT, mask, state_id_BxGxT, gamma=gamma, std_normalize=True,
      eps=eps, ddof=ddof)
  episode_return_BxG = jnp.sum(jnp.where(mask, f32(step_rewards_BxGxT), 0.0), axis=-1)
  _, csa_s_BxGxT = csa_components(episode_return_BxG, logp_BxGxT, mask, eps=eps,
                                  ddof=ddof)
  return combine(mask_BxGxT, adv_e_BxG, (lam, csa_s_BxGxT), (w, gig_s_BxGxT))
