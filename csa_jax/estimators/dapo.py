"""DAPO (Yu et al., 2025, arXiv 2503.14476) on the reward side: dynamic sampling
(`dynamic_sampling_keep`) and overlong reward shaping (`overlong_penalty`,
`shape_overlong_rewards`), with the multi-turn meaning of "length". DAPO's other two parts,
clip-higher and the token-level loss, are in losses.py. Pure functions over the padded
[B, G, T] arrays of the estimators, with their tie rule (csa_jax/estimators/stats.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from csa_jax.estimators.stats import as_mask, center, check_steps, f32, rewards_and_valid


@jax.jit
def dynamic_sampling_keep(rewards_BxG, *, valid_BxG=None):
  """DAPO dynamic sampling: which groups to keep (true where rewards are not all equal).

  A group whose real rollouts all got the same reward (all solved, all failed), or that
  has fewer than 2 real rollouts, has zero GRPO advantage everywhere and only dilutes the
  batch. "All equal" uses the same tie rule as `episode_advantages`, so a kept group is
  exactly one with a non-zero GRPO advantage. Under CSA such groups also get A_S = 0
  (l = A_E * dev = 0); under GiGPO they may still carry step-level signal, so filter
  them on episode rewards only where that is intended.

  The host loop around it (DAPO Algorithm 1): sample B' groups, keep those with
  `keep_B`, append to a buffer, repeat until the buffer holds B groups, train on the
  first B. Returns keep_B (bool).
  """
  rewards_BxG, valid_BxG = rewards_and_valid(rewards_BxG, valid_BxG)
  c, _ = center(rewards_BxG, valid_BxG, -1, ddof=1)
  return jnp.any(c != 0, axis=-1)


def overlong_penalty(length, *, max_len, cache_len, factor=1.0):
  """DAPO's soft overlong punishment (its Eq. 13), elementwise, scaled by `factor`.

      0                                      if length <= max_len - cache_len
      ((max_len - cache_len) - length) / cache_len   inside the cache window
      -1                                     if length > max_len

  Multi-turn meaning of "length" (the policy's own generated tokens; observations and
  prompts are written by the environment and never count):
  - per step: the action tokens generated at that step, with max_len = the sampler's
    per-turn limit (max_new_tokens). A step inside the window was nearly or actually
    cut off, so its action text is likely incomplete. Add the result to the step's
    reward (step-reward estimators such as GiGPO), or fold it into the episode reward
    with `shape_overlong_rewards(per="step")`.
  - per episode: the action tokens summed over the episode's steps, with max_len = the
    episode's generation budget; penalises rambling across turns. Add it to the
    episode reward (`shape_overlong_rewards(per="episode")`).
  DAPO's single-turn setting is max_len 20480, cache_len 4096.
  """
  if not 0 < cache_len <= max_len:
    raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                     f"max_len={max_len}")
  length = f32(length)
  start = max_len - cache_len
  pen = jnp.where(length <= start, 0.0, (start - length) / cache_len)
  return factor * jnp.where(length > max_len, -1.0, pen)


def shape_overlong_rewards(rewards_BxG, action_len_BxGxT, mask_BxGxT, *, max_len,
                           cache_len, factor=1.0, per="step"):
  """Episode rewards plus DAPO's overlong penalty, for episode-level estimators.

  per="step": each active step is judged on its own action length against the per-turn
    limit, and the mean penalty over the episode's steps is added (in [-factor, 0],
    the same range as single-turn DAPO, whatever the number of steps).
  per="episode": the total action length over the active steps is judged against an
    episode budget.
  See `overlong_penalty` for max_len / cache_len in each case.
  """
  mask_BxGxT = as_mask(mask_BxGxT)
  action_len_BxGxT = jnp.where(mask_BxGxT, f32(action_len_BxGxT), 0.0)
  check_steps(mask_BxGxT, action_len_BxGxT=action_len_BxGxT)
  kw = dict(max_len=max_len, cache_len=cache_len, factor=factor)
  if per == "step":
    pen = jnp.where(mask_BxGxT, overlong_penalty(action_len_BxGxT, **kw), 0.0)
    n = jnp.sum(mask_BxGxT, axis=-1)
    pen_BxG = jnp.sum(pen, axis=-1) / jnp.maximum(n, 1)
  elif per == "episode":
    pen_BxG = overlong_penalty(jnp.sum(action_len_BxGxT, axis=-1), **kw)
  else:
    raise ValueError(f"per must be 'step' or 'episode', got {per!r}")
  return f32(rewards_BxG) + pen_BxG


