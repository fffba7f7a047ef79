"""tau2-bench (customer service with tools and a user): retail, and the held-out domain.

    python launch.py --exp taubench_csa                   # retail train -> retail test
    python launch.py --exp taubench_heldout_csa           # retail train -> all 50 airline tasks
    python launch.py --exp taubench_csa --set model_path=/ckpt/Qwen2.5-7B-Instruct \\
        --set env.kwargs.system_prompt=full --set rollout.max_prompt_tokens=7680 \\
        --set env.kwargs.user_model_path=/ckpt/Qwen2.5-7B-Instruct   # tau2's setting

An agent turn is one JSON tool call or one message to the user; the reward is tau2's grade at
the end (DB hash replay x required communicated outputs; the LLM-judged NL assertions of 112
retail tasks are not graded, see environments/taubench_env.py). The defaults fit a policy
trained from scratch on CPU: a brief system prompt (tool names, call format) instead of the
2-3k-token policy and schemas, and the scripted user. No step-level oracle label exists, so
`credit/*` stays empty here.
"""

import dataclasses

from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, RolloutConfig,
                            SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="taubench",
      env=EnvConfig(name="taubench",
                    kwargs={"domain": "retail", "system_prompt": "brief", "step_limit": 30},
                    train_split="train", eval_split="test", num_train_tasks=74,
                    pool_backend="process"),  # Python tools and JSON hashing: one process each
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=832),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=30, history_turns=2,
                            max_prompt_tokens=704, max_action_tokens=128, num_envs=32),
      sft=SFTConfig(num_demos=74, epochs=8, batch_size=32, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=40, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


def heldout() -> ExperimentConfig:
  """Train on retail, evaluate on every airline task (the proposal's held-out domain)."""
  cfg = base()
  env = dataclasses.replace(cfg.env, eval_split="heldout",
                            kwargs={**cfg.env.kwargs, "heldout_domain": "airline"})
  return dataclasses.replace(cfg, name="taubench_heldout", env=env,
                             eval=dataclasses.replace(cfg.eval, num_episodes=50))


register_family("taubench", base, "tau2-bench retail (test tasks), scripted user")
register_family("taubench_heldout", heldout, "tau2-bench: train retail, evaluate airline")
