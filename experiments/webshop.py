"""WebShop (Yao et al., 2022), the proposal's web-navigation benchmark, in text mode.

    python launch.py --exp webshop_csa            # and _grpo, _dapo, _gigpo, _rloo, ...
    python launch.py --exp webshop_csa --set env.kwargs.source=real \
        --set env.kwargs.data_dir=DIR             # WebShop's published JSON files

By default the catalogue is generated offline (`source="generated"`: 3,000 products in
WebShop's schema with near-duplicate distractors, synthetic goals), so scores are not
comparable with published WebShop numbers; with the real files the goals are the human
instructions. Train on the "train" goals (1500+), evaluate on "test" (goals 0-499); 15 steps
per episode as in verl-agent's WebShop runs. The oracle step label is the decrease of the
expert's distance to a win (environments/webshop/env.py).
"""

from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, OptimConfig,
                            RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="webshop",
      env=EnvConfig(name="webshop", kwargs={"source": "generated", "step_limit": 15},
                    train_split="train", eval_split="test", num_train_tasks=1000,
                    pool_backend="thread"),  # one shared catalogue; pure Python
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=800),
      rollout=RolloutConfig(tasks_per_iter=8, group_size=8, max_turns=15, history_turns=2,
                            max_prompt_tokens=768, max_action_tokens=32, num_envs=64),
      optim=OptimConfig(learning_rate=1e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=100, epochs=8, batch_size=32, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=100, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


register_family("webshop", base, "WebShop (generated catalogue unless source=real; test goals)")
