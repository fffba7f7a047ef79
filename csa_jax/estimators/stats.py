"""The statistics every estimator shares: group standardisation with one tie rule, anchor-state
step groups, input checks, and `combine`, the form `A = A_E + coef * A_S` under the mask.

Shapes: B task groups, G rollouts per group, T max steps. `mask_BxGxT` is true where
rollout i of group b has a step t; a rollout with no active step is padding.

Degenerate groups. A standardisation `(x - mean) / (std + eps)` over a set of active
entries is defined as 0 when the set has fewer than `max(2, ddof + 1)` members or when
its spread is 0. "Spread 0" is tested as `max - min <= TIE_RTOL * max(|max|, |min|)`,
so that values equal up to float32 rounding (e.g. a mean that is off by one ulp) count
as equal (for CSA's l also `max - min <= L_TIE_ATOL * max|A_E| * max|logp|` at that
step); otherwise `ulp / eps` would turn rounding noise into O(0.1..1) advantages.
Inputs are clipped to +-MAX_ABS and statistics are taken on values scaled by their
largest magnitude, so nothing overflows. DAPO's dynamic sampling (csa_jax/estimators/dapo.py) uses
the same tie rule, so a group it keeps is exactly one with a non-zero GRPO advantage.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Relative spread under which a set of values counts as all-equal (about 8 float32 ulps).
TIE_RTOL = 1e-6
# CSA's l = A_E * dev has zero spread at a step when its spread is at most
# L_TIE_ATOL * max_j |A_E_j| * max_j |logp_j| over the rollouts active there: below the
# float32 resolution of its inputs (log-probs from a bf16 sampler are far coarser).
L_TIE_ATOL = 1e-5
# Inputs are clipped to +-MAX_ABS first: XLA on CPU flushes subnormals to 0, so 1 / s
# must stay a normal float32 for every scale s used below.
MAX_ABS = 1e30


# ------------------------------------------------------------------------------------
# Inputs.


def as_mask(mask):
  """A bool mask from any 0/1 array."""
  return jnp.asarray(mask) != 0


def f32(x):
  """float32: every statistic here is computed in it, whatever the caller passes."""
  return jnp.asarray(x, jnp.float32)


def check_ndim(name: str, x: Array, ndim: int, layout: str):
  if x.ndim != ndim:
    raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got {x.shape}")


def check_same(name_a: str, a: tuple, name_b: str, b: tuple):
  if tuple(a) != tuple(b):
    raise ValueError(f"{name_a} has shape {tuple(a)} but {name_b} has shape {tuple(b)}")


def check_ddof(ddof: int):
  if not isinstance(ddof, int) or ddof < 0:
    raise ValueError(f"ddof must be a non-negative int, got {ddof!r}")


def check_steps(mask_BxGxT, **arrays):
  """Refuses a mask that is not [B, G, T] or a per-step array of another shape."""
  check_ndim("mask_BxGxT", mask_BxGxT, 3, "[B, G, T]")
  for name, x in arrays.items():
    if x is not None:
      check_same(name, x.shape, "mask_BxGxT", mask_BxGxT.shape)


def check_state_id(state_id_BxGxT):
  state_id_BxGxT = jnp.asarray(state_id_BxGxT)
  if not jnp.issubdtype(state_id_BxGxT.dtype, jnp.integer):
    raise ValueError("state_id_BxGxT must hold integer ids (hash anchor states on "
                     f"the host), got dtype {state_id_BxGxT.dtype}")
  return state_id_BxGxT


def rewards_and_valid(rewards_BxG, valid_BxG):
  """float32 rewards [B, G] and a bool mask of real rollouts (all real when None)."""
  rewards_BxG = f32(rewards_BxG)
  check_ndim("rewards_BxG", rewards_BxG, 2, "[B, G]")
  if valid_BxG is None:
    valid_BxG = jnp.ones(rewards_BxG.shape, bool)
  valid_BxG = as_mask(valid_BxG)
  check_same("valid_BxG", valid_BxG.shape, "rewards_BxG", rewards_BxG.shape)
  return rewards_BxG, valid_BxG


# ------------------------------------------------------------------------------------
# Standardisation along an axis.


def _scaled(x, active, axis):
  """x / s with s = max |x| over the active entries (1 where that is 0), and s.

  Statistics of x / s cannot overflow; the standardisations below are written so that
  the scaling cancels exactly (in real arithmetic), which keeps every output finite for
  any finite input.
  """
  x = jnp.clip(jnp.where(active, x, 0.0), -MAX_ABS, MAX_ABS)
  s = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
  s = jnp.where(s > 0, s, 1.0)
  return x / s, s


def center(x, active, axis, *, ddof, atol=0.0):
  """(x - mean) / s over active entries along axis, and s (see `_scaled`).

  0 where degenerate: fewer than max(2, ddof + 1) active entries, or no spread
  (max - min <= TIE_RTOL * max(|max|, |min|), or max - min <= atol).
  """
  y, s = _scaled(x, active, axis)
  n = jnp.sum(active, axis=axis, keepdims=True)
  mean = jnp.sum(y, axis=axis, keepdims=True) / jnp.maximum(n, 1)
  hi = jnp.max(jnp.where(active, y, -jnp.inf), axis=axis, keepdims=True)
  lo = jnp.min(jnp.where(active, y, jnp.inf), axis=axis, keepdims=True)
  ok = (n >= max(2, ddof + 1)) & (hi - lo > TIE_RTOL * jnp.maximum(hi, -lo))
  ok &= (hi - lo) * s > atol
  return jnp.where(active & ok, y - mean, 0.0), s


def standardize(x, active, axis, *, eps, ddof, x_scale=1.0, atol=0.0):
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


# ------------------------------------------------------------------------------------
# Anchor-state step groups (GiGPO's, and csa_state's comparison sets).


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


def segment_normalize(x, active, seg, num_segments, *, eps, ddof, std_normalize,
                      atol=None):
  """`center` / `standardize` over segments instead of an axis (flat arrays); `atol`
  (per entry, optional) is a spread of the true values at or below which a segment
  counts as tied, as in `center`."""
  ssum = lambda v: jax.ops.segment_sum(v, seg, num_segments=num_segments)
  x = jnp.clip(jnp.where(active, x, 0.0), -MAX_ABS, MAX_ABS)
  s = jax.ops.segment_max(jnp.abs(x), seg, num_segments=num_segments)
  s = jnp.where(s > 0, s, 1.0)[seg]
  y = x / s
  n = ssum(active.astype(jnp.float32))[seg]
  mean = ssum(y)[seg] / jnp.maximum(n, 1)
  hi = jax.ops.segment_max(jnp.where(active, y, -jnp.inf), seg,
                           num_segments=num_segments)[seg]
  lo = jax.ops.segment_min(jnp.where(active, y, jnp.inf), seg,
                           num_segments=num_segments)[seg]
  ok = active & (n >= max(2, ddof + 1)) & (hi - lo > TIE_RTOL * jnp.maximum(hi, -lo))
  if atol is not None:
    ok &= (hi - lo) * s > atol
  c = jnp.where(ok, y - mean, 0.0)
  if not std_normalize:
    return c * s
  std = jnp.sqrt(ssum(c**2)[seg] / jnp.maximum(n - ddof, 1))
  denom = std + eps / s
  return jnp.where(denom > 0, c / jnp.where(denom > 0, denom, 1.0), 0.0)


# ------------------------------------------------------------------------------------
# The advantage's one form.


def combine(mask_BxGxT, adv_e_BxG, *weighted_step_terms):
  """`A = A_E + sum_k coef_k * A_S_k` on active steps, 0 elsewhere.

  `weighted_step_terms` are (coef, A_S [B, G, T]) pairs, added in order: CSA and its
  variants (lam, CSA's step term), GiGPO (w, its step-group term), CSA+GiGPO (both),
  iStar (alpha, its implicit step reward). With none, the episode advantage on every
  active step (GRPO, Dr.GRPO, RLOO).
  """
  adv_BxGxT = adv_e_BxG[..., None]
  for coef, adv_s_BxGxT in weighted_step_terms:
    adv_BxGxT = adv_BxGxT + coef * adv_s_BxGxT
  return jnp.where(as_mask(mask_BxGxT), adv_BxGxT, 0.0)
