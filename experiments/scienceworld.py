"""ScienceWorld (30 science-experiment task types, long horizons; median gold path 26).

    python launch.py --exp scienceworld_csa --set model_path=/ckpt/Qwen2.5-1.5B-Instruct

Train on the engine's train variations, evaluate on its test variations. The prompt lists
the 25 action templates and visible objects (`admissible="objects"`): the full list of
valid actions runs to thousands of strings and costs 4-5x the step time. Each environment
is a JVM of about 760 MB, so the pool stays at 16.
"""

from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, RolloutConfig,
                            SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="scienceworld",
      env=EnvConfig(name="scienceworld",
                    kwargs={"task": "all", "step_limit": 60, "admissible": "objects"},
                    train_split="train", eval_split="test", num_train_tasks=1000),
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=544),
      rollout=RolloutConfig(tasks_per_iter=2, group_size=8, max_turns=60, history_turns=2,
                            max_prompt_tokens=512, max_action_tokens=16, num_envs=16),
      sft=SFTConfig(num_demos=100, epochs=8, batch_size=32, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=100, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


register_family("scienceworld", base, "ScienceWorld (all 30 tasks, test variations)")
