"""VirtualHome (EAI scene 1: 26 household activities, gold programs 2-54 lines), binary
completion of every goal condition.

    python launch.py --exp virtualhome_csa --set model_path=/ckpt/Qwen2.5-1.5B-Instruct
    python launch.py --exp virtualhome_csa --set env.eval_split=unseen   # unseen categories

Train on the `train` tasks of 21 categories, evaluate on their `test` tasks; the
generalisation metric is `--set env.eval_split=unseen` (five activity categories never seen
in training). The oracle step label is the change in the number of satisfied goal conditions,
so `credit/*` measures step-level credit against the task's own goals. The step limit is 3x
the gold program's length (6-162 steps); `max_turns=60` cuts the longest few episodes
short (every gold program but one, 54 lines, fits). The prompt budget (1024 tokens with the
2048-entry BPE trained on the demonstrations) holds the task line and the whole action list at
most of the expert's steps (measured need: median 664 tokens, 90th percentile 1300, longest
3.8k); a longer list loses its tail (`actions_dropped`).
"""

from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, RolloutConfig,
                            SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="virtualhome",
      env=EnvConfig(name="virtualhome", kwargs={"step_limit_factor": 3},
                    train_split="train", eval_split="test", num_train_tasks=232,
                    pool_backend="process"),  # the simulator is Python: one process each
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=1056),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=60, history_turns=2,
                            max_prompt_tokens=1024, max_action_tokens=24, num_envs=32),
      sft=SFTConfig(num_demos=232, epochs=8, batch_size=32, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=48, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


register_family("virtualhome", base, "VirtualHome (EAI scene 1, test tasks of seen categories)")
