"""The RL method's config (`algo.*` of an experiment): the method, the advantage
estimator's knobs, the update's, and each model-based method's own section.

A leaf module (it imports nothing of the project), so that the estimators' registry
(csa_jax/estimators/registry.py) can check an estimator's knobs against these fields
without importing csa_jax/config.py, whose validation reads the registry.
csa_jax/config.py holds it in `ExperimentConfig.algo`; its one-line help and valid values
are in csa_jax/config_fields.py, as every field's.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class IStarConfig:
  """iStar (csa_jax/algorithms/istar.py): the implicit PRM and its optimizer."""

  beta: float = 0.05  # r_t = beta * (log pi_prm(a_t) - log pi_old(a_t))
  alpha: float = 1.0  # weight of the step term in A = A_E + alpha * A_S
  # The authors' PRM learning rate is twice the policy's (1e-6 vs 5e-7); this default is
  # twice the quickstart's policy rate.
  learning_rate: float = 2e-4
  grad_clip: float = 10.0
  # Rows per PRM forward/backward batch; whole task groups are packed into a batch, so
  # it is raised to group_size * max_turns where that is larger.
  batch_rows: int = 128


@dataclasses.dataclass(frozen=True)
class SPAConfig:
  """SPA-RL (csa_jax/algorithms/spa.py): exploration and the progress estimator."""

  # Exploration after SFT: explore_k rollouts (at rollout.temperature) on each of the
  # first explore_tasks training tasks.
  explore_tasks: int = 100
  explore_k: int = 5
  # With an `rl_env_steps` budget, exploration stops after the chunk (one wave of the
  # environment pool) in which its environment steps reach this share of the budget:
  # they count against the budget like the RL rollouts' steps, so RL gets the rest.
  explore_share: float = 0.25
  learning_rate: float = 1e-4
  grad_clip: float = 1.0
  epochs: int = 4
  # Rows per estimator batch; whole episodes are packed into a batch (raised to
  # max_turns where that is larger).
  batch_rows: int = 128
  # Step reward r_t = progress_coef * c_t + the grounding term: "penalty" (the default)
  # pays -grounding for an action the environment rejected and 0 for an executed one;
  # "bonus" (the paper's literal form) pays +grounding for an executed one and 0 for a
  # rejected one. Both have the same contrast between executed and rejected actions;
  # "bonus" adds a constant +grounding to every step, whose discounted sum pays for
  # episode length (it made every coin_doors seed worse: reports/spa_grounding.md; spa.py).
  progress_coef: float = 1.0
  grounding: float = 0.5
  grounding_mode: str = "penalty"
  gamma: float = 0.99


@dataclasses.dataclass(frozen=True)
class MDPOConfig:
  """Multi-turn DPO (csa_jax/algorithms/mtdpo.py)."""

  beta: float = 0.1
  # The reference policy: "sft" (the SFT weights) or "previous" (the policy at the start
  # of each iteration, the online iterative variant).
  reference: str = "sft"


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  # What drives an RL iteration (csa_jax/algorithms): "estimator" (advantages from the
  # `estimator` below, then the clipped update), "istar", "spa" or "mtdpo".
  method: str = "estimator"
  estimator: str = "csa"
  lam: float = 0.5
  gamma: float = 0.95
  w: float = 1.0
  eps: float = 1e-6
  # Delta degrees of freedom of the estimators' stds (1: unbiased, as torch.std in GRPO).
  ddof: int = 1
  std_normalize: bool = True
  # The step indices of the environment's decisive choices, for csa_decisive (CSA's step
  # term on these steps only) and csa_routine (on all others): KeyDoor's key room is t = 0.
  decisive_steps: tuple[int, ...] = (0,)
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float = 0.0  # 0 disables; DAPO/verl use 3.0
  loss_agg: str = "token-mean"
  # KL to the SFT policy (k3, GRPO's estimator). On by default: without it the tiny CPU
  # policies drifted (more invalid actions, lower held-out success; docs/methods.md, "What makes
  # RL learn here"). DAPO and Dr.GRPO drop it in their papers; here every method keeps
  # the same anchor so that methods differ only in their advantages and losses.
  kl_coef: float = 0.05
  kl_kind: str = "k3"
  # The KL reference's storage dtype ("": the parameters'; "bfloat16": half a float32 copy,
  # the same logits under bfloat16 compute). A LoRA policy's reference is its SFT adapters
  # over the shared base, never a copy (csa_jax/model/lora.py).
  ref_dtype: str = ""
  entropy_coef: float = 0.0
  # DAPO dynamic sampling: drop groups whose rewards are all equal.
  dynamic_sampling: bool = False
  # At most this many rounds of B groups are played per iteration to fill the batch.
  dynamic_sampling_rounds: int = 3
  # DAPO overlong reward shaping: a linear penalty (up to -overlong_factor) for actions
  # whose length falls in the last `overlong_cache_frac` of the limit; "step" judges each
  # action against rollout.max_action_tokens, "episode" the episode's total against
  # max_action_tokens * max_turns. 0 disables it.
  overlong_cache_frac: float = 0.0
  overlong_factor: float = 1.0
  overlong_per: str = "step"
  # verl-agent's invalid-action penalty: every step the environment rejected costs this
  # much reward (the episode's return falls by it, and the step's own reward for
  # step-reward estimators such as GiGPO). 0 disables it.
  invalid_penalty: float = 0.1
  # How much each agent step (one training row) weighs: "step" (every row alike, so a
  # 15-step failure weighs 3-5x a short success) or "episode" (each episode's rows share
  # one episode's weight: the advantage of a row is scaled by mean_len / its episode's len).
  row_weight: str = "episode"
  epochs: int = 1
  minibatch_size: int = 64
  # Which rows the update trains on: "all", or "decisive" (the steps whose oracle label is
  # +1 or -1; routine steps, label 0, are left out): a diagnostic on environments with
  # exact labels (csa_jax/update/oracle_rows.py).
  update_rows: str = "all"
  # Log per iteration the policy gradient's norm, the entropy and the mean |advantage| of
  # the decisive and the routine rows apart (rows/ metrics; needs oracle labels; one more
  # forward and backward pass over the iteration's rows).
  log_row_classes: bool = False
  istar: IStarConfig = IStarConfig()
  spa: SPAConfig = SPAConfig()
  mtdpo: MDPOConfig = MDPOConfig()
