"""csa-jax: multi-turn LLM agent RL with Counterfactual Step Advantage, in JAX."""
