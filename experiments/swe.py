"""Software-engineering tasks (`swe`, source=synth: bugs injected into toolz, graded by its tests).

    python launch.py --exp swe_csa --set model_path=/ckpt/Qwen2.5-Coder-1.5B-Instruct
    python launch.py --exp swe_grpo ...     # and _dapo, _gigpo, _rloo, ...

Prompts are long (the issue holds a traceback) and so are actions (a replacement block
holds the hunk's old and new lines): 2048 + 512 tokens. Train on bugs in toolz's
itertoolz/dicttoolz/recipes, evaluate on bugs in functoolz (code no training task touched).
Actions are whole commands, so a useful policy is a pretrained code model; the tiny model
here only exercises the pipeline. A graded step runs a test file (~2 s), so the pool is a
process pool of 8. This is not SWE-bench: see environments/swe/synth.py. For
SWE-bench-format instances a user has on disk: --set env.kwargs.source=swebench
--set env.kwargs.instances=PATH --set env.kwargs.repos_dir=PATH.
"""

from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, RolloutConfig,
                            SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family


def base() -> ExperimentConfig:
  return ExperimentConfig(
      name="swe",
      env=EnvConfig(name="swe",
                    kwargs={"source": "synth", "num_train": 100, "num_test": 10,
                            "step_limit": 10, "max_obs_chars": 1500},
                    train_split="train", eval_split="test", num_train_tasks=100,
                    pool_backend="process"),
      tokenizer=TokenizerConfig(vocab_size=2048),
      model=ModelConfig.tiny(vocab_size=2048, hidden_size=128, intermediate_size=384,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                             max_seq_len=2560),
      rollout=RolloutConfig(tasks_per_iter=2, group_size=8, max_turns=10, history_turns=1,
                            max_prompt_tokens=2048, max_action_tokens=512, num_envs=8,
                            step_timeout_s=600.0),
      sft=SFTConfig(num_demos=100, epochs=8, batch_size=16, learning_rate=1e-3),
      eval=EvalConfig(num_episodes=10, every=25),
      rl_iterations=200,
      checkpoint_every=10,
  )


register_family("swe", base, "SWE tasks (synth bugs in toolz, eval on unseen modules)")
