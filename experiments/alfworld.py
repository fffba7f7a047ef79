"""ALFWorld (household tasks in TextWorld, six task types), the proposal's embodied benchmark,
sized for a CPU: a small decoder trained from scratch.

    python launch.py --exp alfworld_tiny_csa
    python launch.py --exp alfworld_tiny_grpo ...   # and _dapo, _csa_dapo, _gigpo, _rloo, ...

The full-size presets for pretrained models (`alfworld_*` with Llama-3.1-8B-Instruct,
`alfworld_qwen1p5b_*`, `alfworld_qwen7b_*`) are in experiments/full_size.py.

Tasks are generated offline in the ALFWorld format from what the `alfworld` wheel ships
(`source="generated"`, every game checked solvable by the planner); with the official data
downloaded (`ALFWORLD_DATA`), `--set env.kwargs.source=official` uses the standard splits.
Evaluation is on `eval_unseen`: floor plans never used for training (the proposal's
generalisation metric). The oracle step label is the decrease of the exact shortest distance to
the goal, so `credit/spearman` is the proposal's step-level credit accuracy.

The policy is a small decoder trained from scratch (a few hours on 2 cores).
"""

from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="alfworld_tiny",
      env=EnvConfig(name="alfworld",
                    kwargs={"source": "generated", "num_train": 1000, "num_eval": 140,
                            "step_limit": 50, "oracle_labels": True},
                    train_split="train", eval_split="eval_unseen", num_train_tasks=1000,
                    pool_backend="process"),
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=544),
      rollout=RolloutConfig(tasks_per_iter=8, group_size=8, max_turns=50, history_turns=2,
                            max_prompt_tokens=512, max_action_tokens=16, num_envs=64),
      algo=AlgoConfig(),
      optim=OptimConfig(learning_rate=1e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=100, epochs=8, batch_size=32, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=140, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


register_family("alfworld_tiny", base,
                "ALFWorld, CPU-sized decoder from scratch (eval on unseen floor plans)")
