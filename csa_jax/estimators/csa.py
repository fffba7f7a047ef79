"""CSA, Counterfactual Step Advantage (the project proposal, Methods), and its variants.

`A = A_E + lam * A_S`: A_E is GRPO's episode advantage; A_S standardises, over the
rollouts active at step t, `l = A_E * (logp - mean_j logp)`. The variants change which
steps the step term compares or credits:

- csa_valid: only the actions the environment accepted (reports/invalid_credit);
- csa_decisive / csa_routine: only the steps whose index is in `algo.decisive_steps`, or
  only the others (the horizon study's mechanism arms);
- csa_state: over GiGPO's anchor-state step groups instead of step indices, so that it
  compares decisions taken in the same state.
lam = 0 is GRPO exactly (on active steps) for each of them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from csa_jax.estimators.episode import episode_advantages
from csa_jax.estimators.registry import register
from csa_jax.estimators.stats import (L_TIE_ATOL, MAX_ABS, as_mask, center, check_ddof,
                                      check_same, check_state_id, check_steps, combine, f32,
                                      segment_normalize, standardize, step_groups)


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, *, eps, ddof, step_mask_BxGxT=None):
  """The two parts of CSA: (A_E [B, G], A_S [B, G, T]); A = A_E + lam * A_S.

  A_E is GRPO over the rollouts with at least one active step. At each step t, over the
  rollouts j active at t: dev = logp - mean_j logp, l = A_E * dev, A_S = standardised l
  (0 where fewer than max(2, ddof + 1) rollouts are active or l has no spread).
  `step_mask_BxGxT` (default all) narrows the steps A_S compares and credits (0 off it).
  """
  mask_BxGxT = as_mask(mask_BxGxT)
  logp_BxGxT = f32(logp_BxGxT)
  rewards_BxG = f32(rewards_BxG)
  check_steps(mask_BxGxT, logp_BxGxT=logp_BxGxT)
  check_same("rewards_BxG", rewards_BxG.shape, "mask_BxGxT[..., 0]", mask_BxGxT.shape[:2])
  check_ddof(ddof)
  adv_e_BxG = episode_advantages(rewards_BxG, valid_BxG=mask_BxGxT.any(-1), eps=eps,
                                 ddof=ddof, std_normalize=True)
  if step_mask_BxGxT is not None:
    mask_BxGxT = mask_BxGxT & as_mask(step_mask_BxGxT)
  # dev / s_t, centred over the rollouts active at each step (axis G). The tie guard
  # makes dev exactly 0 where the log-probs tie: otherwise float32 rounding of the
  # mean would leave ulp-sized l, which the standardisation would blow up.
  dev_BxGxT, s_Bx1xT = center(logp_BxGxT, mask_BxGxT, 1, ddof=0)
  l_BxGxT = adv_e_BxG[..., None] * dev_BxGxT  # the true l is this times s_Bx1xT
  # l is only known to about 1e-7 * max|A_E| * max|logp| (float32 rounding of dev and
  # A_E); a smaller spread is noise, e.g. with exactly two active rollouts whose A_E
  # are opposite, l_1 == l_2 in exact arithmetic. See L_TIE_ATOL.
  max_ae_Bx1xT = jnp.max(jnp.where(mask_BxGxT, jnp.abs(adv_e_BxG)[..., None], 0.0),
                         axis=1, keepdims=True)
  adv_s_BxGxT = standardize(l_BxGxT, mask_BxGxT, 1, eps=eps, ddof=ddof, x_scale=s_Bx1xT,
                            atol=L_TIE_ATOL * max_ae_Bx1xT)
  return jax.lax.stop_gradient(adv_e_BxG), jax.lax.stop_gradient(adv_s_BxGxT)


def csa_step_term(rewards_BxG, logp_BxGxT, mask_BxGxT, *, eps, ddof):
  """CSA's step term A_S alone, 0 off the active steps (the credit study's `csa_step`)."""
  return csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps, ddof=ddof)[1]


@register("csa", step_term=csa_step_term)
@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, *, lam, eps, ddof):
  """Counterfactual Step Advantage: `A = A_E + lam * A_S` on active steps, 0 elsewhere.

  Args:
    rewards_BxG: episode (outcome) reward per rollout.
    logp_BxGxT: log pi_old of the whole action at each step, recorded at sampling time.
    mask_BxGxT: true where rollout i of group b has a step t.
    lam: weight of the step term; 0 gives exactly GRPO on active steps, 1 the
      proposal's "pure step-level" ablation (A_E is still added, as in its formula).
    eps, ddof: as in `episode_advantages`, used for both A_E and A_S.

  Note on the proposal's claim that "the sum over t of the combined advantages
  approximately recovers the episode-level advantage scaled by trajectory length"
  (measured in tests/test_advantages.py::test_sum_claim_*):
  - exactly, for the group total: A_S sums to 0 over the rollouts active at each step,
    so sum_{i,t} A = sum_i L_i A_E_i;
  - approximately, per rollout, when log-probs are independent across steps: the
    residual lam * sum_t A_S is a random walk, relative error about 0.5 / sqrt(L) at
    lam = 0.5, G = 8;
  - not, per rollout, when a rollout's log-probs are persistently above or below its
    siblings': the residual grows like L (relative error 0.48 at any L) and the sign of
    the total disagrees with A_E for about 2.5% of rollouts; a failed rollout that
    always picks unlikely actions is reinforced as a whole.
  With exactly two active rollouts whose A_E are opposite (e.g. a group of 2), l ties
  and A_S is 0: CSA is GRPO there.
  """
  adv_e_BxG, adv_s_BxGxT = csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps,
                                          ddof=ddof)
  return combine(mask_BxGxT, adv_e_BxG, (lam, adv_s_BxGxT))


@register("csa_valid")
@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_valid_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, invalid_BxGxT, *, lam, eps,
                         ddof):
  """CSA whose step term compares and credits only the actions the environment accepted:
  `l = A_E * dev` raises any unlikely action of a failed rollout, typically a rejected one
  (reports/invalid_credit). A rejected step keeps A_E alone; no rejection: CSA (to 1 ulp)."""
  adv_e_BxG, adv_s_BxGxT = csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps,
                                          ddof=ddof, step_mask_BxGxT=~as_mask(invalid_BxGxT))
  return combine(mask_BxGxT, adv_e_BxG, (lam, adv_s_BxGxT))


# ------------------------------------------------------------------------------------
# The step term on chosen step indices only.


def _steps_in(mask_BxGxT, steps, inside: bool):
  """True at the step indices in `steps` (inside) or at all others, broadcast to the mask."""
  T = mask_BxGxT.shape[-1]
  on_T = np.isin(np.arange(T), np.asarray(steps, np.int64))
  return jnp.broadcast_to(jnp.asarray(on_T if inside else ~on_T), mask_BxGxT.shape)


@register("csa_decisive")
@functools.partial(jax.jit, static_argnames=("ddof", "decisive_steps"))
def csa_decisive_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, *, lam, eps, ddof,
                            decisive_steps):
  """CSA with its step term on the decisive steps only: `A = A_E + lam * A_S` at the step
  indices in `decisive_steps`, A_E alone at every other step.

  The decisive steps are named by step index, not by the environment's oracle label: an
  index is known in every environment and for every policy, while a label exists only
  where an environment provides one, and labels are evaluation signals that no estimator
  reads. In KeyDoor the decisive step is the key room, t = 0 (the default, (0,)); with a
  fork (`decisions=2`) add its index, 1 + horizon // 2. CSA's step term at a step compares
  only the rollouts active at that same index, so A_S here equals CSA's at the kept
  indices.
  """
  adv_e_BxG, adv_s_BxGxT = csa_components(
      rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps, ddof=ddof,
      step_mask_BxGxT=_steps_in(mask_BxGxT, decisive_steps, True))
  return combine(mask_BxGxT, adv_e_BxG, (lam, adv_s_BxGxT))


@register("csa_routine")
@functools.partial(jax.jit, static_argnames=("ddof", "decisive_steps"))
def csa_routine_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, *, lam, eps, ddof,
                           decisive_steps):
  """CSA with its step term on the routine steps only, every step index not in
  `decisive_steps` (see `csa_decisive_advantages`); A_E alone on the decisive steps.
  csa_decisive and csa_routine split CSA's step term between them."""
  adv_e_BxG, adv_s_BxGxT = csa_components(
      rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps, ddof=ddof,
      step_mask_BxGxT=_steps_in(mask_BxGxT, decisive_steps, False))
  return combine(mask_BxGxT, adv_e_BxG, (lam, adv_s_BxGxT))


# ------------------------------------------------------------------------------------
# CSA over anchor-state groups.


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_state_components(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *, eps, ddof):
  """CSA's parts with the step term over anchor-state groups: (A_E [B, G], A_S [B, G, T]).

  CSA compares the log-probs of the rollouts active at one step index; once rollouts
  diverge those are decisions in different states. Here the comparison set of a step is
  its anchor-state step group, as GiGPO's (`step_groups`: the active steps of one task
  group whose state ids are equal, whichever rollout and step index they come from).
  Within each group: dev = logp - mean(logp), l = A_E * dev, A_S = (l - mean l) /
  (std l + eps); 0 for a group of fewer than max(2, ddof + 1) steps or whose l (or logp)
  has no spread, with CSA's tie rules (`csa_components`). A_E is GRPO over the rollouts
  with at least one active step. With state ids that make each step index its own group
  (id = t) this is CSA exactly.
  """
  mask_BxGxT = as_mask(mask_BxGxT)
  logp_BxGxT = f32(logp_BxGxT)
  state_id_BxGxT = check_state_id(state_id_BxGxT)
  check_steps(mask_BxGxT, logp_BxGxT=logp_BxGxT, state_id_BxGxT=state_id_BxGxT)
  check_same("rewards_BxG", f32(rewards_BxG).shape, "mask_BxGxT[..., 0]",
             mask_BxGxT.shape[:2])
  check_ddof(ddof)
  B, G, T = mask_BxGxT.shape
  adv_e_BxG = episode_advantages(rewards_BxG, valid_BxG=mask_BxGxT.any(-1), eps=eps,
                                 ddof=ddof, std_normalize=True)
  seg_N = step_groups(state_id_BxGxT, mask_BxGxT)[0].reshape(-1)
  act_N, n_seg = mask_BxGxT.reshape(-1), B * G * T
  seg_max = lambda v: jax.ops.segment_max(jnp.where(act_N, v, 0.0), seg_N,
                                          num_segments=n_seg)[seg_N]
  logp_N = logp_BxGxT.reshape(-1)
  dev_N = segment_normalize(logp_N, act_N, seg_N, n_seg, eps=eps, ddof=0,
                            std_normalize=False)
  ae_N = jnp.broadcast_to(adv_e_BxG[..., None], (B, G, T)).reshape(-1)
  # l is known only to about 1e-7 * max|A_E| * max|logp| over its group (see CSA's
  # L_TIE_ATOL): a smaller spread is float32 noise, not a difference.
  atol_N = L_TIE_ATOL * seg_max(jnp.abs(ae_N)) * seg_max(jnp.abs(
      jnp.clip(logp_N, -MAX_ABS, MAX_ABS)))
  adv_s_N = segment_normalize(ae_N * dev_N, act_N, seg_N, n_seg, eps=eps, ddof=ddof,
                              std_normalize=True, atol=atol_N)
  return (jax.lax.stop_gradient(adv_e_BxG),
          jax.lax.stop_gradient(adv_s_N.reshape(B, G, T)))


def csa_state_step_term(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *, eps, ddof):
  """csa_state's step term A_S alone, 0 off the active steps."""
  return csa_state_components(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, eps=eps,
                              ddof=ddof)[1]


@register("csa_state", step_term=csa_state_step_term)
@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_state_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *, lam, eps,
                         ddof):
  """csa_state: `A = A_E + lam * A_S` with CSA's step term taken over anchor-state groups
  instead of step indices (`csa_state_components`); 0 on padded steps. lam = 0 is GRPO."""
  adv_e_BxG, adv_s_BxGxT = csa_state_components(rewards_BxG, logp_BxGxT, mask_BxGxT,
                                                state_id_BxGxT, eps=eps, ddof=ddof)
  return combine(mask_BxGxT, adv_e_BxG, (lam, adv_s_BxGxT))
