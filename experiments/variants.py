"""The algorithms the proposal compares, as config transforms of one base experiment.

`register_family("alfworld", base)` registers alfworld_grpo, alfworld_csa, ... so every
environment gets the same baselines with the same budget (proposal, "Baselines"):
GRPO, Dr.GRPO, RLOO, GiGPO, DAPO, CSA-GRPO, CSA-DAPO and CSA's lambda ablations, and the
model-based baselines iStar, SPA-RL and multi-turn DPO (csa_jax/algorithms/). A variant sets
only what differs from the config's defaults (csa_jax/config.py: lam 0.5, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from csa_jax.config import ExperimentConfig

# GRPO as in DeepSeekMath: symmetric clip, per-sequence mean of token losses.
GRPO = dict(estimator="grpo", clip_low=0.2, clip_high=0.2, loss_agg="seq-mean-token-mean",
            dynamic_sampling=False, overlong_cache_frac=0.0)
# DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-level loss, overlong
# shaping (its 4096-of-20480 window is 20% of the limit; here per agent step).
DAPO = dict(estimator="grpo", clip_low=0.2, clip_high=0.28, loss_agg="token-mean",
            dynamic_sampling=True, overlong_cache_frac=0.2, overlong_per="step")

VARIANTS: dict[str, dict] = {
    "grpo": GRPO,
    "dr_grpo": GRPO | dict(estimator="dr_grpo", loss_agg="seq-mean-token-sum-norm"),
    "rloo": GRPO | dict(estimator="rloo"),
    "gigpo": GRPO | dict(estimator="gigpo"),
    "dapo": DAPO,
    "csa": GRPO | dict(estimator="csa"),
    "csa_dapo": DAPO | dict(estimator="csa"),
    # CSA whose step term compares steps taken in the same anchor state (GiGPO's step
    # groups), not at the same step index: csa_jax/estimators/csa.py, csa_state_advantages.
    "csa_state": GRPO | dict(estimator="csa_state"),
    # CSA whose step term leaves out the actions the environment rejected
    # (reports/invalid_credit): csa_jax/estimators/csa.py, csa_valid_advantages.
    "csa_valid": GRPO | dict(estimator="csa_valid"),
    # CSA's step term on the decisive step only (the first: KeyDoor's key room), or on the
    # routine steps only: the mechanism of CSA's short-horizon gain (csa_jax/estimators/csa.py,
    # csa_decisive_advantages). The first step is named here, not left to the default.
    "csa_t0": GRPO | dict(estimator="csa_decisive", decisive_steps=(0,)),
    "csa_routine": GRPO | dict(estimator="csa_routine", decisive_steps=(0,)),
    "csa_lam0": GRPO | dict(estimator="csa", lam=0.0),
    "csa_lam1": GRPO | dict(estimator="csa", lam=1.0),
    "csa_gigpo": GRPO | dict(estimator="csa_gigpo"),
    # The ablation behind the defaults (docs/methods.md, "What makes RL learn here"): GRPO
    # as the trainer ran it before, with no KL anchor, no invalid-action penalty and every
    # agent step weighted alike.
    "grpo_unanchored": GRPO | dict(kl_coef=0.0, invalid_penalty=0.0, row_weight="step"),
    # The model-based baselines (csa_jax/algorithms/), on GRPO's update and defaults.
    # iStar: an implicit PRM; its episode term is RLOO (`estimator` only names it in logs).
    "istar": GRPO | dict(method="istar", estimator="rloo"),
    # SPA-RL: its grounding term (algo.spa.grounding_mode) takes the invalid penalty's place.
    "spa": GRPO | dict(method="spa", invalid_penalty=0.0),
    # SPA-RL with the paper's literal grounding term, +grounding per executed action: the
    # form that made every coin_doors seed worse (issue 26; reports/spa_grounding/).
    "spa_bonus": GRPO | dict(method="spa", invalid_penalty=0.0, spa=dict(grounding_mode="bonus")),
    # Multi-turn DPO: the DPO loss alone, whose beta anchors it to the SFT reference.
    "mtdpo": GRPO | dict(method="mtdpo", kl_coef=0.0, entropy_coef=0.0),
    # Two probes of why CSA beats GRPO at a short horizon (reports/horizon_matched): GRPO
    # taking larger steps (twice the family's learning rate), and GRPO trained on the
    # decisive rows alone, its routine rows' noise left out (oracle labels needed:
    # csa_jax/update/oracle_rows.py).
    "grpo_lr2x": GRPO | dict(lr_scale=2.0),
    "grpo_decisive": GRPO | dict(update_rows="decisive"),
}


def variant(base: ExperimentConfig, name: str, algo: str) -> ExperimentConfig:
  """`base` with the fields of VARIANTS[algo]; a dict value sets fields of a nested config
  (algo.spa), so the family's other settings of that config are kept; `lr_scale` scales
  the family's learning rate (optim.learning_rate) rather than naming one."""
  spec = dict(VARIANTS[algo])
  optim = dataclasses.replace(base.optim, learning_rate=base.optim.learning_rate
                              * spec.pop("lr_scale", 1.0))
  fields = {k: dataclasses.replace(getattr(base.algo, k), **v) if isinstance(v, dict) else v
            for k, v in spec.items()}
  return dataclasses.replace(base, name=name, optim=optim,
                             algo=dataclasses.replace(base.algo, **fields))


def register_family(prefix: str, base: Callable[[], ExperimentConfig], doc: str) -> None:
  """Registers `{prefix}_{algo}` for every algorithm in VARIANTS."""
  from experiments import register

  for algo in VARIANTS:
    name = f"{prefix}_{algo}"

    def make(algo=algo, name=name) -> ExperimentConfig:
      return variant(base(), name, algo)

    make.__doc__ = f"{doc}: {algo}"
    register(name)(make)

