"""Critic-free advantage estimators over padded [B, G, T] rollout arrays, as pure jitted
functions, and the registry that names them for `algo.estimator`.

- stats.py: the statistics every estimator shares (group standardisation and its tie
  rule, anchor-state step groups, input checks) and `combine`, the one form
  `A = A_E + coef * A_S` under the mask;
- episode.py: GRPO, Dr.GRPO, RLOO (one advantage per rollout);
- csa.py: CSA and its variants (csa_valid, csa_decisive, csa_routine, csa_state);
- gigpo.py: GiGPO and CSA+GiGPO;
- registry.py: `@register`, beside each definition; `get_estimator`, `list_estimators`;
- dapo.py: DAPO's reward-side parts (dynamic sampling, overlong shaping) over the same
  arrays; its clip-higher and token-level loss are in csa_jax/losses.py.
The method that calls an estimator
(reward shaping, knobs from the config, rows) is csa_jax/algorithms/estimator.py.

Shapes: B task groups, G rollouts per group, T max steps. Every output is 0 where the
mask is 0, never NaN or inf for finite inputs, and carries no gradient (advantages are
constants of the policy update). Each estimator's knobs (lam, eps, ...) have no default
in its signature: their one home is `AlgoConfig` (csa_jax/algo_config.py).
"""

# The modules register their estimators when imported: importing the package fills the
# registry.
from csa_jax.estimators.registry import Estimator, get_estimator, list_estimators, register
from csa_jax.estimators.stats import combine, step_groups
from csa_jax.estimators.episode import episode_advantages, rloo_advantages
from csa_jax.estimators.csa import (csa_advantages, csa_components, csa_decisive_advantages,
                                    csa_routine_advantages, csa_state_advantages,
                                    csa_state_components, csa_valid_advantages)
from csa_jax.estimators.gigpo import (csa_gigpo_advantages, discounted_returns,
                                      gigpo_advantages, gigpo_components)

__all__ = ["Estimator", "combine", "csa_advantages", "csa_components",
           "csa_decisive_advantages", "csa_gigpo_advantages", "csa_routine_advantages",
           "csa_state_advantages", "csa_state_components", "csa_valid_advantages",
           "discounted_returns", "episode_advantages", "get_estimator", "gigpo_advantages",
           "gigpo_components", "list_estimators", "register", "rloo_advantages",
           "step_groups"]
