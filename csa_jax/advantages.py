"""Critic-free advantage estimators over padded [B, G, T] rollout arrays.

Implements, as pure jitted functions:

- GRPO (Shao et al., 2024, DeepSeekMath, arXiv 2402.03300): episode reward normalised
  within its group, `A_E = (r - mean) / (std + eps)`.
- Dr.GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
  the same without the division by the std.
- RLOO (Ahmadian et al., 2024, arXiv 2402.14740): leave-one-out baseline,
  `A_i = r_i - mean_{j != i} r_j`.
- CSA, Counterfactual Step Advantage (the project proposal,
  ../shared/research/csa_proposal.md, Methods): `A = A_E + lam * A_S` where A_S
  standardises, over the rollouts active at step t, `l = A_E * (logp - mean_j logp)`.
- GiGPO (Feng et al., 2025, verl-agent, arXiv 2505.10978): steps of one task group whose
  anchor state is identical form a step group; A_S is the discounted return normalised
  within it; `A = A_E + w * A_S`.
- csa_state (this project): CSA's step term over GiGPO's anchor-state step groups instead
  of step indices, so that it compares decisions taken in the same state
  (`csa_state_advantages`).
- CSA+GiGPO: both step terms on one episode term (see `csa_gigpo_advantages`).
DAPO's reward-side parts (dynamic sampling, overlong shaping) are in dapo.py, its
clip-higher and token-level loss in losses.py.

Shapes: B task groups, G rollouts per group, T max steps. `mask_BxGxT` is true where
rollout i of group b has a step t; a rollout with no active step is padding. Every
output is 0 where the mask is 0, never NaN or inf for finite inputs, and carries no
gradient (advantages are constants of the policy update).

Degenerate groups. A standardisation `(x - mean) / (std + eps)` over a set of active
entries is defined as 0 when the set has fewer than `max(2, ddof + 1)` members or when
its spread is 0. "Spread 0" is tested as `max - min <= _TIE_RTOL * max(|max|, |min|)`,
so that values equal up to float32 rounding (e.g. a mean that is off by one ulp) count
as equal (for CSA's l also `max - min <= 1e-5 * max|A_E| * max|logp|` at that step); otherwise `ulp / eps` would turn rounding noise into O(0.1..1) advantages.
Inputs are clipped to +-1e30 and statistics are taken on values scaled by their
largest magnitude, so nothing overflows.

The trainer calls every estimator through one keyword signature, see `get_estimator`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array

# Relative spread under which a set of values counts as all-equal (about 8 float32 ulps).
_TIE_RTOL = 1e-6
# CSA's l = A_E * dev has zero spread at a step when its spread is at most
# _L_TIE_ATOL * max_j |A_E_j| * max_j |logp_j| over the rollouts active there: below the
# float32 resolution of its inputs (log-probs from a bf16 sampler are far coarser).
_L_TIE_ATOL = 1e-5
# Inputs are clipped to +-_MAX_ABS first: XLA on CPU flushes subnormals to 0, so 1 / s
# must stay a normal float32 for every scale s used below.
_MAX_ABS = 1e30


# ------------------------------------------------------------------------------------
# Shared helpers; the public ones are also DAPO's (csa_jax/dapo.py), so that its
# dynamic sampling uses the very tie rule of the estimators.
# ------------------------------------------------------------------------------------


def _check_ndim(name: str, x: Array, ndim: int, layout: str):
  if x.ndim != ndim:
    raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got {x.shape}")


def _check_same(name_a: str, a: tuple, name_b: str, b: tuple):
  if tuple(a) != tuple(b):
    raise ValueError(f"{name_a} has shape {tuple(a)} but {name_b} has shape {tuple(b)}")


def _check_ddof(ddof: int):
  if not isinstance(ddof, int) or ddof < 0:
    raise ValueError(f"ddof must be a non-negative int, got {ddof!r}")


def _scaled(x, active, axis):
  """x / s with s = max |x| over the active entries (1 where that is 0), and s.

  Statistics of x / s cannot overflow; the standardisations below are written so that
  the scaling cancels exactly (in real arithmetic), which keeps every output finite for
  any finite input.
  """
  x = jnp.clip(jnp.where(active, x, 0.0), -_MAX_ABS, _MAX_ABS)
  s = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
  s = jnp.where(s > 0, s, 1.0)
  return x / s, s


def center(x, active, axis, *, ddof, atol=0.0):
  """(x - mean) / s over active entries along axis, and s (see `_scaled`).

  0 where degenerate: fewer than max(2, ddof + 1) active entries, or no spread
  (max - min <= _TIE_RTOL * max(|max|, |min|), or max - min <= atol).
  """
  y, s = _scaled(x, active, axis)
  n = jnp.sum(active, axis=axis, keepdims=True)
  mean = jnp.sum(y, axis=axis, keepdims=True) / jnp.maximum(n, 1)
  hi = jnp.max(jnp.where(active, y, -jnp.inf), axis=axis, keepdims=True)
  lo = jnp.min(jnp.where(active, y, jnp.inf), axis=axis, keepdims=True)
  ok = (n >= max(2, ddof + 1)) & (hi - lo > _TIE_RTOL * jnp.maximum(hi, -lo))
  ok &= (hi - lo) * s > atol
  return jnp.where(active & ok, y - mean, 0.0), s


def _standardize(x, active, axis, *, eps, ddof, x_scale=1.0, atol=0.0):
  """(v - mean) / (std + eps) of the true values v = x * x_scale, over active entries.

  Inactive entries of `x` never enter a statistic and come out 0; degenerate sets
  (see `center`) come out 0. `x_scale` lets a caller pass pre-scaled values.
  """
  c, s = center(x, active, axis, ddof=ddof, atol=atol)
  n = jnp.sum(active, axis=axis, keepdims=True)
  std = jnp.sqrt(jnp.sum(c**2, axis=axis, keepdims=True) / jnp.maximum(n - ddof, 1))
  # (v - mean) / (std_v + eps) == c / (std_c + eps / (s * x_scale)); if s * x_scale
  # underflows to 0 the quotient is inf and the (tiny) true result becomes 0.
  denom = std + eps / (s * x_scale)
  return jnp.where(denom > 0, c / jnp.where(denom > 0, denom, 1.0), 0.0)


def as_mask(mask):
  """A bool mask from any 0/1 array."""
  return jnp.asarray(mask) != 0


def f32(x):
  """float32: every statistic here is computed in it, whatever the caller passes."""
  return jnp.asarray(x, jnp.float32)


# ------------------------------------------------------------------------------------
# Episode-level estimators: GRPO, Dr.GRPO, RLOO.
# ------------------------------------------------------------------------------------



def rewards_and_valid(rewards_BxG, valid_BxG):
  """float32 rewards [B, G] and a bool mask of real rollouts (all real when None)."""
  rewards_BxG = f32(rewards_BxG)
  _check_ndim("rewards_BxG", rewards_BxG, 2, "[B, G]")
  if valid_BxG is None:
    valid_BxG = jnp.ones(rewards_BxG.shape, bool)
  valid_BxG = as_mask(valid_BxG)
  _check_same("valid_BxG", valid_BxG.shape, "rewards_BxG", rewards_BxG.shape)
  return rewards_BxG, valid_BxG


@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def episode_advantages(rewards_BxG, *, valid_BxG=None, std_normalize=True, eps=1e-6,
                       ddof=1):
  """GRPO episode advantage `(r - mean_i r) / (std_i r + eps)` per group (Dr.GRPO: no std).

  Args:
    rewards_BxG: episode reward of rollout i of group b.
    valid_BxG: which rollouts are real (default: all); statistics use only those, and
      padded rollouts get 0.
    std_normalize: False gives Dr.GRPO (mean-centred only).
    eps: added to the std.
    ddof: delta degrees of freedom of the std (1 = unbiased, as torch.std in GRPO).

  Returns:
    adv_BxG, 0 for padded rollouts and for groups whose rewards are all equal or that
    have fewer than max(2, ddof + 1) real rollouts.
  """
  _check_ddof(ddof)
  rewards_BxG, valid_BxG = rewards_and_valid(rewards_BxG, valid_BxG)
  if std_normalize:
    adv = _standardize(rewards_BxG, valid_BxG, -1, eps=eps, ddof=ddof)
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


def broadcast_episode(adv_BxG, mask_BxGxT):
  """Episode advantage onto every active step, 0 on padded steps."""
  mask_BxGxT = as_mask(mask_BxGxT)
  return jnp.where(mask_BxGxT, f32(adv_BxG)[..., None], 0.0)


# ------------------------------------------------------------------------------------
# CSA.
# ------------------------------------------------------------------------------------


def check_steps(mask_BxGxT, **arrays):
  """Refuses a mask that is not [B, G, T] or a per-step array of another shape."""
  _check_ndim("mask_BxGxT", mask_BxGxT, 3, "[B, G, T]")
  for name, x in arrays.items():
    if x is not None:
      _check_same(name, x.shape, "mask_BxGxT", mask_BxGxT.shape)


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, *, eps=1e-6, ddof=1,
                   step_mask_BxGxT=None):
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
  _check_same("rewards_BxG", rewards_BxG.shape, "mask_BxGxT[..., 0]",
              mask_BxGxT.shape[:2])
  _check_ddof(ddof)
  adv_e_BxG = episode_advantages(rewards_BxG, valid_BxG=mask_BxGxT.any(-1), eps=eps,
                                 ddof=ddof)
  if step_mask_BxGxT is not None:
    mask_BxGxT = mask_BxGxT & as_mask(step_mask_BxGxT)
  # dev / s_t, centred over the rollouts active at each step (axis G). The tie guard
  # makes dev exactly 0 where the log-probs tie: otherwise float32 rounding of the
  # mean would leave ulp-sized l, which the standardisation would blow up.
  dev_BxGxT, s_Bx1xT = center(logp_BxGxT, mask_BxGxT, 1, ddof=0)
  l_BxGxT = adv_e_BxG[..., None] * dev_BxGxT  # the true l is this times s_Bx1xT
  # l is only known to about 1e-7 * max|A_E| * max|logp| (float32 rounding of dev and
  # A_E); a smaller spread is noise, e.g. with exactly two active rollouts whose A_E
  # are opposite, l_1 == l_2 in exact arithmetic. See _L_TIE_ATOL.
  max_ae_Bx1xT = jnp.max(jnp.where(mask_BxGxT, jnp.abs(adv_e_BxG)[..., None], 0.0),
                         axis=1, keepdims=True)
  adv_s_BxGxT = _standardize(l_BxGxT, mask_BxGxT, 1, eps=eps, ddof=ddof,
                             x_scale=s_Bx1xT, atol=_L_TIE_ATOL * max_ae_Bx1xT)
  return jax.lax.stop_gradient(adv_e_BxG), jax.lax.stop_gradient(adv_s_BxGxT)


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, *, lam=0.5, eps=1e-6, ddof=1):
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
  mask_BxGxT = as_mask(mask_BxGxT)
  return jnp.where(mask_BxGxT, adv_e_BxG[..., None] + lam * adv_s_BxGxT, 0.0)


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_valid_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, invalid_BxGxT, *, lam=0.5,
                         eps=1e-6, ddof=1):
  """CSA whose step term compares and credits only the actions the environment accepted:
  `l = A_E * dev` raises any unlikely action of a failed rollout, typically a rejected one
  (reports/invalid_credit). A rejected step keeps A_E alone; no rejection: CSA (to 1 ulp)."""
  adv_e_BxG, adv_s_BxGxT = csa_components(rewards_BxG, logp_BxGxT, mask_BxGxT, eps=eps,
                                          ddof=ddof,
                                          step_mask_BxGxT=~as_mask(invalid_BxGxT))
  mask_BxGxT = as_mask(mask_BxGxT)
  return jnp.where(mask_BxGxT, adv_e_BxG[..., None] + lam * adv_s_BxGxT, 0.0)


# ------------------------------------------------------------------------------------
# GiGPO.
# ------------------------------------------------------------------------------------


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


def step_groups(state_id_BxGxT, mask_BxGxT):
  """Anchor-state step groups: a segment id per entry, without a loop over groups.

  Active entries of task group b with equal state ids share an id in
  [b * G * T, (b + 1) * G * T); padded entries get ids of their own kind that no active
  entry shares. One sort per task group (O(GT log GT)) instead of GT x GT comparisons.

  Returns:
    (seg_BxGxT int32, group_size_BxGxT int32: members of the entry's step group, 0 on
    padding).
  """
  B, G, T = mask_BxGxT.shape
  N = G * T
  ids_BxN = state_id_BxGxT.reshape(B, N)
  act_BxN = as_mask(mask_BxGxT).reshape(B, N)
  # Active first, then by state id: equal (active, id) pairs become contiguous runs.
  order_BxN = jnp.lexsort((ids_BxN, ~act_BxN), axis=-1)
  ids_s = jnp.take_along_axis(ids_BxN, order_BxN, axis=-1)
  act_s = jnp.take_along_axis(act_BxN, order_BxN, axis=-1)
  starts = jnp.concatenate(
      [jnp.ones((B, 1), bool),
       (ids_s[:, 1:] != ids_s[:, :-1]) | (act_s[:, 1:] != act_s[:, :-1])], axis=-1)
  seg_s = jnp.cumsum(starts, axis=-1, dtype=jnp.int32) - 1
  seg_s = seg_s + (jnp.arange(B, dtype=jnp.int32) * N)[:, None]
  seg_BxN = jnp.zeros_like(seg_s).at[jnp.arange(B)[:, None], order_BxN].set(seg_s)
  size = jax.ops.segment_sum(act_BxN.reshape(-1).astype(jnp.int32), seg_BxN.reshape(-1),
                             num_segments=B * N)
  size_BxN = jnp.where(act_BxN, size[seg_BxN], 0)
  return seg_BxN.reshape(B, G, T), size_BxN.reshape(B, G, T)


def _segment_normalize(x, active, seg, num_segments, *, eps, ddof, std_normalize,
                       atol=None):
  """`center` / `_standardize` over segments instead of an axis (flat arrays); `atol`
  (per entry, optional) is a spread of the true values at or below which a segment
  counts as tied, as in `center`."""
  ssum = lambda v: jax.ops.segment_sum(v, seg, num_segments=num_segments)
  x = jnp.clip(jnp.where(active, x, 0.0), -_MAX_ABS, _MAX_ABS)
  s = jax.ops.segment_max(jnp.abs(x), seg, num_segments=num_segments)
  s = jnp.where(s > 0, s, 1.0)[seg]
  y = x / s
  n = ssum(active.astype(jnp.float32))[seg]
  mean = ssum(y)[seg] / jnp.maximum(n, 1)
  hi = jax.ops.segment_max(jnp.where(active, y, -jnp.inf), seg,
                           num_segments=num_segments)[seg]
  lo = jax.ops.segment_min(jnp.where(active, y, jnp.inf), seg,
                           num_segments=num_segments)[seg]
  ok = active & (n >= max(2, ddof + 1)) & (hi - lo > _TIE_RTOL * jnp.maximum(hi, -lo))
  if atol is not None:
    ok &= (hi - lo) * s > atol
  c = jnp.where(ok, y - mean, 0.0)
  if not std_normalize:
    return c * s
  std = jnp.sqrt(ssum(c**2)[seg] / jnp.maximum(n - ddof, 1))
  denom = std + eps / s
  return jnp.where(denom > 0, c / jnp.where(denom > 0, denom, 1.0), 0.0)


def _check_state_id(state_id_BxGxT):
  state_id_BxGxT = jnp.asarray(state_id_BxGxT)
  if not jnp.issubdtype(state_id_BxGxT.dtype, jnp.integer):
    raise ValueError("state_id_BxGxT must hold integer ids (hash anchor states on "
                     f"the host), got dtype {state_id_BxGxT.dtype}")
  return state_id_BxGxT


@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def gigpo_components(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, *, gamma=0.95,
                     std_normalize=True, eps=1e-6, ddof=1):
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
  state_id_BxGxT = _check_state_id(state_id_BxGxT)
  check_steps(mask_BxGxT, step_rewards_BxGxT=step_rewards_BxGxT,
               state_id_BxGxT=state_id_BxGxT)
  _check_ddof(ddof)
  B, G, T = mask_BxGxT.shape
  episode_return_BxG = jnp.sum(jnp.where(mask_BxGxT, step_rewards_BxGxT, 0.0), axis=-1)
  adv_e_BxG = episode_advantages(episode_return_BxG, valid_BxG=mask_BxGxT.any(-1),
                                 std_normalize=std_normalize, eps=eps, ddof=ddof)
  ret_BxGxT = discounted_returns(step_rewards_BxGxT, mask_BxGxT, gamma)
  seg_BxGxT, size_BxGxT = step_groups(state_id_BxGxT, mask_BxGxT)
  adv_s = _segment_normalize(ret_BxGxT.reshape(-1), mask_BxGxT.reshape(-1),
                             seg_BxGxT.reshape(-1), B * G * T, eps=eps, ddof=ddof,
                             std_normalize=std_normalize)
  return (adv_e_BxG, jax.lax.stop_gradient(adv_s.reshape(B, G, T)), size_BxGxT)


@functools.partial(jax.jit, static_argnames=("std_normalize", "ddof"))
def gigpo_advantages(step_rewards_BxGxT, mask_BxGxT, state_id_BxGxT, *, gamma=0.95,
                     w=1.0, std_normalize=True, eps=1e-6, ddof=1):
  """GiGPO (arXiv 2505.10978): `A = A_E + w * A_S` on active steps, 0 elsewhere.

  Args:
    step_rewards_BxGxT: reward received at each step (sparse tasks: the outcome on the
      last step, 0 before).
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
  return jnp.where(as_mask(mask_BxGxT), adv_e_BxG[..., None] + w * adv_s_BxGxT, 0.0)


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_gigpo_advantages(step_rewards_BxGxT, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *,
                         lam=0.5, gamma=0.95, w=1.0, eps=1e-6, ddof=1):
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
  return jnp.where(mask, adv_e_BxG[..., None] + lam * csa_s_BxGxT + w * gig_s_BxGxT,
                   0.0)


# ------------------------------------------------------------------------------------
# CSA over anchor-state groups.
# ------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_state_components(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *, eps=1e-6,
                         ddof=1):
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
  state_id_BxGxT = _check_state_id(state_id_BxGxT)
  check_steps(mask_BxGxT, logp_BxGxT=logp_BxGxT, state_id_BxGxT=state_id_BxGxT)
  _check_same("rewards_BxG", f32(rewards_BxG).shape, "mask_BxGxT[..., 0]",
              mask_BxGxT.shape[:2])
  _check_ddof(ddof)
  B, G, T = mask_BxGxT.shape
  adv_e_BxG = episode_advantages(rewards_BxG, valid_BxG=mask_BxGxT.any(-1), eps=eps,
                                 ddof=ddof)
  seg_N = step_groups(state_id_BxGxT, mask_BxGxT)[0].reshape(-1)
  act_N, n_seg = mask_BxGxT.reshape(-1), B * G * T
  seg_max = lambda v: jax.ops.segment_max(jnp.where(act_N, v, 0.0), seg_N,
                                          num_segments=n_seg)[seg_N]
  logp_N = logp_BxGxT.reshape(-1)
  dev_N = _segment_normalize(logp_N, act_N, seg_N, n_seg, eps=eps, ddof=0,
                             std_normalize=False)
  ae_N = jnp.broadcast_to(adv_e_BxG[..., None], (B, G, T)).reshape(-1)
  # l is known only to about 1e-7 * max|A_E| * max|logp| over its group (see CSA's
  # _L_TIE_ATOL): a smaller spread is float32 noise, not a difference.
  atol_N = _L_TIE_ATOL * seg_max(jnp.abs(ae_N)) * seg_max(jnp.abs(
      jnp.clip(logp_N, -_MAX_ABS, _MAX_ABS)))
  adv_s_N = _segment_normalize(ae_N * dev_N, act_N, seg_N, n_seg, eps=eps, ddof=ddof,
                               std_normalize=True, atol=atol_N)
  return (jax.lax.stop_gradient(adv_e_BxG),
          jax.lax.stop_gradient(adv_s_N.reshape(B, G, T)))


@functools.partial(jax.jit, static_argnames=("ddof",))
def csa_state_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, state_id_BxGxT, *, lam=0.5,
                         eps=1e-6, ddof=1):
  """csa_state: `A = A_E + lam * A_S` with CSA's step term taken over anchor-state groups
  instead of step indices (`csa_state_components`); 0 on padded steps. lam = 0 is GRPO."""
  adv_e_BxG, adv_s_BxGxT = csa_state_components(rewards_BxG, logp_BxGxT, mask_BxGxT,
                                                state_id_BxGxT, eps=eps, ddof=ddof)
  return jnp.where(as_mask(mask_BxGxT), adv_e_BxG[..., None] + lam * adv_s_BxGxT, 0.0)


# ------------------------------------------------------------------------------------
# Registry: one keyword signature for the trainer.
# ------------------------------------------------------------------------------------

_INPUTS = ("rewards_BxG", "logp_BxGxT", "mask_BxGxT", "step_rewards_BxGxT",
           "state_id_BxGxT", "invalid_BxGxT")


@dataclasses.dataclass(frozen=True)
class Estimator:
  """An advantage estimator callable with the trainer's uniform keyword signature.

  `est(rewards_BxG=..., logp_BxGxT=..., mask_BxGxT=..., step_rewards_BxGxT=...,
  state_id_BxGxT=..., **hparams) -> adv_BxGxT`. Arrays it does not use may be given or
  left out; `requires` lists those it needs. `hparams` lists the keywords it accepts
  (an unknown one is an error: a typo must not silently fall back to a default).
  """

  name: str
  fn: Callable[..., Array]
  requires: tuple[str, ...]
  hparams: tuple[str, ...]

  def __call__(self, **kwargs: Any) -> Array:
    arrays = {k: kwargs.pop(k) for k in _INPUTS if k in kwargs}
    unknown = sorted(set(kwargs) - set(self.hparams))
    if unknown:
      raise ValueError(f"estimator {self.name!r} got unknown hparams {unknown}; it "
                       f"accepts {list(self.hparams)}")
    missing = [k for k in self.requires if arrays.get(k) is None]
    if missing:
      raise ValueError(f"estimator {self.name!r} needs {missing}; it uses "
                       f"{list(self.requires)}")
    return self.fn(**{k: arrays[k] for k in self.requires}, **kwargs)


def _grpo(rewards_BxG, mask_BxGxT, *, eps=1e-6, ddof=1, std_normalize=True):
  mask = as_mask(mask_BxGxT)
  adv = episode_advantages(rewards_BxG, valid_BxG=mask.any(-1), eps=eps, ddof=ddof,
                           std_normalize=std_normalize)
  return broadcast_episode(adv, mask)


def _dr_grpo(rewards_BxG, mask_BxGxT):
  return _grpo(rewards_BxG, mask_BxGxT, std_normalize=False)


def _rloo(rewards_BxG, mask_BxGxT):
  mask = as_mask(mask_BxGxT)
  return broadcast_episode(rloo_advantages(rewards_BxG, valid_BxG=mask.any(-1)), mask)


_REGISTRY: dict[str, Estimator] = {}
# Checks every estimator must pass when it registers (`add_registration_check`): the
# trainer's one adds that each declared hparam is a config field, so a knob cannot be
# declared and then silently never set.
_CHECKS: list[Callable[[Estimator], None]] = []


def register_estimator(est: Estimator) -> Estimator:
  if est.name in _REGISTRY:
    raise ValueError(f"estimator {est.name!r} is registered twice")
  unknown = sorted(set(est.requires) - set(_INPUTS))
  if unknown:
    raise ValueError(f"estimator {est.name!r} requires unknown inputs {unknown}; "
                     f"valid: {list(_INPUTS)}")
  for check in _CHECKS:
    check(est)
  _REGISTRY[est.name] = est
  return est


def add_registration_check(check: Callable[[Estimator], None]) -> None:
  """Runs `check(est)` on every estimator registered so far and on each one after."""
  for est in _REGISTRY.values():
    check(est)
  _CHECKS.append(check)


register_estimator(Estimator("grpo", _grpo, ("rewards_BxG", "mask_BxGxT"),
                             ("eps", "ddof", "std_normalize")))
register_estimator(Estimator("dr_grpo", _dr_grpo, ("rewards_BxG", "mask_BxGxT"), ()))
register_estimator(Estimator("rloo", _rloo, ("rewards_BxG", "mask_BxGxT"), ()))
register_estimator(Estimator("csa", csa_advantages,
                             ("rewards_BxG", "logp_BxGxT", "mask_BxGxT"),
                             ("lam", "eps", "ddof")))
register_estimator(Estimator("csa_valid", csa_valid_advantages,
                             ("rewards_BxG", "logp_BxGxT", "mask_BxGxT", "invalid_BxGxT"),
                             ("lam", "eps", "ddof")))
register_estimator(Estimator("csa_state", csa_state_advantages,
                             ("rewards_BxG", "logp_BxGxT", "mask_BxGxT", "state_id_BxGxT"),
                             ("lam", "eps", "ddof")))
register_estimator(Estimator("gigpo", gigpo_advantages,
                             ("step_rewards_BxGxT", "mask_BxGxT", "state_id_BxGxT"),
                             ("gamma", "w", "std_normalize", "eps", "ddof")))
register_estimator(Estimator("csa_gigpo", csa_gigpo_advantages,
                             ("step_rewards_BxGxT", "logp_BxGxT", "mask_BxGxT",
                              "state_id_BxGxT"),
                             ("lam", "gamma", "w", "eps", "ddof")))


def list_estimators() -> list[str]:
  return sorted(_REGISTRY)


def get_estimator(name: str) -> Estimator:
  """The estimator registered as `name`; see `Estimator` for the call signature.

  Estimators, inputs they use and hparams they accept (defaults):
    grpo:      rewards, mask; eps=1e-6, ddof=1, std_normalize=True.
    dr_grpo:   rewards, mask; none.
    rloo:      rewards, mask; none.
    csa:       rewards, logp, mask; lam=0.5, eps=1e-6, ddof=1.
    csa_valid: rewards, logp, mask, invalid; lam=0.5, eps=1e-6, ddof=1.
    csa_state: rewards, logp, mask, state_id; lam=0.5, eps=1e-6, ddof=1.
    gigpo:     step_rewards, mask, state_id; gamma=0.95, w=1.0, std_normalize=True,
               eps=1e-6, ddof=1.
    csa_gigpo: step_rewards, logp, mask, state_id; lam=0.5, gamma=0.95, w=1.0,
               eps=1e-6, ddof=1.
  GiGPO and CSA+GiGPO take the episode return from step_rewards (sum over steps);
  the others take rewards_BxG.
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown advantage estimator {name!r}; known: "
                     f"{', '.join(list_estimators())}")
  return _REGISTRY[name]
