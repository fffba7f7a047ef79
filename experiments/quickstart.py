"""The embedded default: a tiny policy learns the delayed-credit KeyDoor task on CPU.

    python launch.py                      # == python launch.py --exp quickstart

KeyDoor at horizon 4 (environments/keydoor.py, experiments/keydoor.py): the task line names
the vault's key, the first step takes one of four keys, four routine steps follow, the
reward comes at the end. Behaviour cloning on 100 episodes of a noisy expert (it takes the
right key with probability 0.45), then CSA (lambda 0.5, 4 tasks x G = 8 rollouts, the
proposal's 10,000 environment steps), then evaluation with greedy and with sampled actions
on 400 tasks of the test split that training never saw. Tokenizer and decoder are built
from scratch, so nothing is downloaded. CSA because it is the method this project is
for; on this short horizon its step term adds little to GRPO's episode term, and both
learn the decisive choice (reports/quickstart.md: 4 seeds, each paired with its SFT
start). `quickstart_coin` is the earlier default (TextWorldExpress "coin", where RL did
not improve on SFT over 4 seeds: reports/quickstart_coin.md).
"""

import dataclasses

from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments import keydoor, register
from experiments.variants import register_family, variant

COIN = "numLocations=4,numDistractorItems=0,includeDoors=0,limitInventorySize=0"


def base() -> ExperimentConfig:
  """KeyDoor at horizon 4: experiments/keydoor.py's family keydoor_h4."""
  return dataclasses.replace(keydoor.base(4), name="quickstart")


def coin_base() -> ExperimentConfig:
  """TextWorldExpress "coin" in a 4-room open house (the default until 2026-12)."""
  return ExperimentConfig(
      name="quickstart_coin",
      seed=0,
      env=EnvConfig(name="twx", kwargs={"game": "coin", "game_params": COIN, "step_limit": 15},
                    train_split="train", eval_split="test", num_train_tasks=1000),
      tokenizer=TokenizerConfig(vocab_size=1024),
      # Two layers, two query heads sharing one key/value head: on CPU the attention
      # softmax over the prompt dominates the cost, so few heads and a short window pay.
      model=ModelConfig.tiny(vocab_size=1024, hidden_size=96, intermediate_size=256,
                             num_layers=2, num_heads=2, num_kv_heads=1, head_dim=48,
                             max_seq_len=160),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=15, history_turns=3,
                            max_prompt_tokens=128, max_action_tokens=8, num_envs=32),
      algo=AlgoConfig(epochs=1, minibatch_size=64),
      optim=OptimConfig(learning_rate=1e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=200, epochs=12, batch_size=64, learning_rate=2e-3),
      eval=EvalConfig(num_episodes=200, greedy=True, sampled=True, every=10),
      rl_iterations=40,
      checkpoint_every=5,
  )


@register("quickstart")
def quickstart() -> ExperimentConfig:
  """KeyDoor h4, tiny decoder from scratch: SFT on a noisy expert, then CSA (lam 0.5); CPU."""
  return variant(base(), "quickstart", "csa")


@register("quickstart_coin")
def quickstart_coin() -> ExperimentConfig:
  """TWX coin, tiny decoder from scratch: SFT on gold paths, then CSA (lam 0.5); CPU."""
  return variant(coin_base(), "quickstart_coin", "csa")


# twx_coin_grpo, twx_coin_csa, twx_coin_dapo, ...: the same task and budget per algorithm.
register_family("twx_coin", coin_base, "TWX coin, tiny decoder, quickstart_coin budget")
