"""The estimator methods: GRPO, Dr.GRPO, RLOO, CSA and its variants, GiGPO, CSA+GiGPO (and
DAPO's knobs).

The simplest case of the seam: no auxiliary state; the episodes' padded [B, G, T]
arrays, after the reward-side knobs (DAPO's overlong shaping, the invalid-action
penalty), go through the jitted estimator named by `algo.estimator`
(csa_jax/estimators/); one row per step carries its advantage into the clipped update.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from csa_jax.algorithms.base import Algorithm, Prepared, skip_update
from csa_jax.estimators import Estimator, get_estimator
from csa_jax.estimators import dapo
from csa_jax.rollout import groups
from csa_jax.rollout.groups import GroupArrays
from csa_jax.update import oracle_rows


def shaped_rewards(arrays: GroupArrays, algo, rollout
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(rewards_BxG, step_rewards_BxGxT) after the reward-side knobs that are on:

  - DAPO's overlong penalty: an episode's penalty is added to its return and to its last
    step's reward (for step-reward estimators such as GiGPO);
  - verl-agent's invalid-action penalty: each rejected step costs `invalid_penalty`, in
    the episode's return and in that step's own reward.
  Returns the arrays themselves when every knob is off.
  """
  rewards, step_rewards = arrays.rewards_BxG, arrays.step_rewards_BxGxT
  if algo.overlong_cache_frac > 0:
    max_len = rollout.max_action_tokens * (rollout.max_turns if algo.overlong_per == "episode"
                                           else 1)
    cache_len = max(1, round(algo.overlong_cache_frac * max_len))
    shaped = np.asarray(dapo.shape_overlong_rewards(
        rewards, arrays.action_len_BxGxT, arrays.mask_BxGxT, max_len=max_len,
        cache_len=cache_len, factor=algo.overlong_factor, per=algo.overlong_per))
    step_rewards = step_rewards.copy()
    last = arrays.mask_BxGxT.sum(-1) - 1
    b, g = np.nonzero(last >= 0)
    step_rewards[b, g, last[b, g]] += shaped[b, g] - rewards[b, g]
    rewards = shaped
  if algo.invalid_penalty > 0:
    invalid_BxGxT = (arrays.invalid_BxGxT & arrays.mask_BxGxT).astype(np.float32)
    rewards = rewards - algo.invalid_penalty * invalid_BxGxT.sum(-1)
    step_rewards = step_rewards - algo.invalid_penalty * invalid_BxGxT
  return rewards, step_rewards


def compute_advantages(arrays: GroupArrays, algo, rollout,
                       est: Estimator | None = None) -> np.ndarray:
  """adv_BxGxT of `algo.estimator` (or of `est`, a registered estimator or its step term)
  on the arrays, after the reward-side knobs (`shaped_rewards`)."""
  est = est if est is not None else get_estimator(algo.estimator)
  # Each estimator takes the config fields named by the knobs it declares.
  hp = {k: getattr(algo, k) for k in est.hparams}
  rewards, step_rewards = shaped_rewards(arrays, algo, rollout)
  adv = est(rewards_BxG=jnp.asarray(rewards), logp_BxGxT=jnp.asarray(arrays.logp_BxGxT),
            mask_BxGxT=jnp.asarray(arrays.mask_BxGxT),
            step_rewards_BxGxT=jnp.asarray(step_rewards),
            state_id_BxGxT=jnp.asarray(arrays.state_id_BxGxT),
            invalid_BxGxT=jnp.asarray(arrays.invalid_BxGxT), **hp)
  return np.asarray(adv)


class EstimatorAlgorithm(Algorithm):
  name = "estimator"
  multiprocess = True

  def prepare(self, ctx, it, batch, params, aux) -> Prepared:
    c = ctx.cfg
    adv_BxGxT = compute_advantages(batch.arrays, c.algo, c.rollout)
    classes = (oracle_rows.step_classes(batch.arrays.oracle_BxGxT, batch.arrays.mask_BxGxT)
               if c.algo.update_rows != "all" or c.algo.log_row_classes else None)
    keep = classes[c.algo.update_rows] if c.algo.update_rows != "all" else None
    rows = groups.rl_rows(batch, adv_BxGxT, c.algo.row_weight, keep)
    metrics = {"perf/aux_s": 0.0}
    if c.algo.log_row_classes:
      by_class = {k: groups.rl_rows(batch, adv_BxGxT, c.algo.row_weight,
                                    v if keep is None else v & keep)
                  for k, v in classes.items()}
      metrics |= self._row_metrics(ctx)(params, by_class, len(rows))
    skip = skip_update(adv_BxGxT if keep is None else np.where(keep, adv_BxGxT, 0.0), c.algo)
    return Prepared(rows=rows, aux=aux, metrics=metrics, adv_BxGxT=adv_BxGxT, skip=skip)

  def _row_metrics(self, ctx) -> oracle_rows.RowClassMetrics:
    """One jitted diagnostic per run (ctx), built on first use."""
    if getattr(self, "_row_metrics_ctx", None) is not ctx:
      r = ctx.cfg.rollout
      self._row_metrics_ctx = ctx
      self._row_metrics_fn = oracle_rows.RowClassMetrics(
          ctx.graphdef, ctx.cfg.algo, ctx.sampling_cfg,
          seq_len=r.max_prompt_tokens + r.max_action_tokens, action_len=r.max_action_tokens,
          pad_id=ctx.pad_id)
    return self._row_metrics_fn
