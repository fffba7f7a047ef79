"""The embedded default: a tiny policy learns TextWorldExpress "coin" on CPU.

    python launch.py                      # == python launch.py --exp quickstart

Behaviour cloning on the expert's episodes for 200 train tasks, then 40 iterations of RL
with CSA (lambda 0.5, 4 tasks x G=8 rollouts), then evaluation with greedy and with
sampled actions on 200 tasks of the test fold that training never saw. Tokenizer and
decoder are built from scratch, so nothing is downloaded. About 4 minutes on the quiet 2-core
machine. Over 4 seeds RL does not improve on the SFT start here (reports/quickstart.md:
sampled -0.013 [-0.08, +0.06], SFT already near 0.87); it is the end-to-end check of the
pipeline, and `coin_doors` the testbed where RL gains were measured.
"""

from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments import register
from experiments.variants import register_family, variant

COIN = "numLocations=4,numDistractorItems=0,includeDoors=0,limitInventorySize=0"


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="quickstart",
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
  """TWX coin, tiny decoder from scratch: SFT on gold paths, then CSA (lam 0.5); CPU."""
  return variant(base(), "quickstart", "csa")


# twx_coin_grpo, twx_coin_csa, twx_coin_dapo, ...: the same task and budget per algorithm.
register_family("twx_coin", base, "TWX coin, tiny decoder, quickstart budget")
