"""The embedded default: a tiny policy learns TextWorldExpress "coin" on CPU.

    python launch.py                      # == python launch.py --exp quickstart

Behaviour cloning on 100 expert (gold-path) episodes of the train fold, then RL with CSA
(lambda 0.5, G=8 rollouts per task), then greedy evaluation on 100 tasks of the test fold
that training never saw. Everything is built from scratch (tokenizer and decoder), so
nothing is downloaded. Runs in under 10 minutes on 2 CPU cores; README.md shows the table
it printed.
"""

import dataclasses

from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments import register

COIN = "numLocations=4,numDistractorItems=0,includeDoors=0,limitInventorySize=0"


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="quickstart",
      seed=0,
      env=EnvConfig(name="twx", kwargs={"game": "coin", "game_params": COIN, "step_limit": 15},
                    train_split="train", eval_split="test", num_train_tasks=1000),
      tokenizer=TokenizerConfig(kind="bpe", vocab_size=1024),
      # Two layers, two query heads sharing one key/value head: on CPU the attention
      # softmax over the prompt dominates the cost, so few heads and a short window pay.
      model=ModelConfig.tiny(vocab_size=1024, hidden_size=96, intermediate_size=256,
                             num_layers=2, num_heads=2, num_kv_heads=1, head_dim=48,
                             max_seq_len=160),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=15, history_turns=3,
                            max_prompt_tokens=128, max_action_tokens=8, num_envs=32),
      algo=AlgoConfig(estimator="csa", lam=0.5, clip_low=0.2, clip_high=0.28,
                      loss_agg="token-mean", epochs=1, minibatch_size=64),
      optim=OptimConfig(learning_rate=3e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=100, epochs=10, batch_size=64, learning_rate=2e-3),
      eval=EvalConfig(num_episodes=100, greedy=True, sampled=True, every=10),
      rl_iterations=40,
      checkpoint_every=5,
  )


@register("quickstart")
def quickstart() -> ExperimentConfig:
  """TWX coin, tiny decoder from scratch: SFT on gold paths, then CSA (lam 0.5); ~8 min CPU."""
  return base()


@register("quickstart_grpo")
def quickstart_grpo() -> ExperimentConfig:
  """The quickstart with GRPO (CSA's lam=0 twin) for a side-by-side comparison."""
  return dataclasses.replace(base(), algo=dataclasses.replace(base().algo, estimator="grpo"))
