"""Full-size presets: the proposal's recipe on pretrained models, for GPUs and TPU slices.

    python launch.py --exp alfworld_csa --mesh 4x2 --set model_path=DIR      # Llama-3.1-8B-Instruct
    python launch.py --exp alfworld_qwen1p5b_csa --set model_path=DIR        # Qwen2.5-1.5B-Instruct
    python launch.py --exp alfworld_qwen7b_gigpo --mesh 4x2 --set model_path=DIR
    # before renting anything: compile on simulated devices, print the memory plan
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python launch.py --exp alfworld_csa --mesh 4x2 --dry-run --set device_memory_gb=16

Every method of the registry (`_grpo`, `_csa`, `_gigpo`, `_dapo`, `_istar`, ...) on the
same budget. `DIR` is a local copy of the checkpoint the preset names (`pretrained`);
training refuses to start without it (the from-scratch CPU family is `alfworld_tiny_*`).

The protocol is the proposal's: SFT on 100 expert demonstrations, G = 8 rollouts per task,
10,000 environment steps of RL (`rl_env_steps`; `rl_iterations` is only an upper bound),
the same for every method. The RL hyperparameters are verl-agent's ALFWorld recipe
(github.com/langfengQ/verl-agent, examples/gigpo_trainer/run_alfworld.sh and the GRPO
script beside it, for Qwen2.5-1.5B/7B-Instruct), mapped onto this trainer:

  train_batch_size=16, env.rollout.n=8        -> rollout.tasks_per_iter=16, group_size=8
  env.max_steps=50, history_length=2          -> rollout.max_turns=50, history_turns=2
  max_prompt_length=2048, max_response_length=512
                                              -> max_prompt_tokens=2048, max_action_tokens=512
  actor.optim.lr=1e-6                         -> optim.learning_rate=1e-6 (constant)
  use_kl_loss, kl_loss_coef=0.01, low_var_kl  -> algo.kl_coef=0.01, kl_kind="k3" (verl's
                                                 low_var_kl is k3, clamped to [-10, 10])
  invalid_action_penalty_coef=0.1             -> algo.invalid_penalty=0.1
  algorithm.gamma=0.95 (GiGPO's step returns) -> algo.gamma=0.95
  ppo_mini_batch_size=256, one PPO epoch      -> algo.minibatch_size=256, epochs=1
  ppo_micro_batch_size_per_gpu                -> optim.micro_batch_size (sized here by
                                                 the dry run for the preset's mesh)
  enable_gradient_checkpointing=True          -> model.remat=True
  rollout temperature 1.0, val temperature 0.4 -> rollout.temperature=1.0,
                                                 eval.temperature=0.4
  test_freq=5, save_freq=5                    -> eval.every=5, checkpoint_every=5
  verl's actor defaults (not overridden by the scripts): clip_ratio 0.2, token-mean
  loss, grad_clip 1.0, AdamW betas (0.9, 0.999), weight_decay 0.01, entropy_coeff
  0.001 -> clip 0.2, loss_agg="token-mean", grad_clip=1.0, b2=0.999,
  weight_decay=0.01, entropy_coef=0.001.
  verl-agent's prompt asks for reasoning in <think> and the action in <action>...</action>
                                              -> rollout.action_format="think"
  Each method's own definition (experiments/variants.py) then applies on top: GRPO's
  per-sequence loss mean replaces token-mean, multi-turn DPO drops the KL term, and so on.
  The model-based baselines' authors' values (../shared/research/baselines.md): iStar's PRM
  AdamW at 1e-6 with gradient clip 10; SPA-RL's progress estimator at 3e-6, 10
  exploration rollouts per task on ALFWorld.

Not from a published recipe (verl-agent has no SFT stage; the proposal does): SFT at
learning rate 1e-5 for 2 epochs in batches of 32, our choice within the usual range for
full-parameter SFT of 1.5-8B models; demonstrations carry no reasoning, so SFT teaches the
<action> wrapper with an empty thought and the model's own instruction tuning supplies
the reasoning. Parameters are float32 master weights computed in bfloat16
(verl's FSDP mixed precision does the same).

Memory (the dry run's numbers are in docs/scale.md, "Running at full size"): the 8B model
with float32 weights and AdamW state is 8.0e9 x 16 bytes = 120 GiB before activations, so
it needs a mesh like 4x2 of 16 GiB devices with FSDP over 'data' and tensor parallelism
over 'model' (csa_jax/distributed/mesh.py); the 1.5B model fits on one large GPU. The full-parameter
presets keep AdamW's first moment in bfloat16 (`optim.mu_dtype`; the master weights and
the second moment stay float32), and the 8B one updates in micro-batches of 4 rows: that
is what brings its RL step under a 32 GiB device (TPU v6e-8). `algo.ref_dtype=bfloat16`
stores the KL reference in bfloat16 (its logits are unchanged: the model computes in
bfloat16, so every parameter is cast to it before use anyway); it is off in the presets
because XLA's plan came out larger with it (LEAN_REFERENCE below).

LoRA presets (`alfworld_lora_*` for Llama-3.1-8B-Instruct, `alfworld_qwen1p5b_lora_*`,
`alfworld_qwen7b_lora_*`): the same recipe with the policy trained as low-rank adapters
on a frozen bfloat16 base (csa_jax/model/lora.py), sized for 16 GiB devices (TPU v5e-8).
The adapter settings are verl's LoRA RL recipe (github.com/volcengine/verl,
docs/advance/ppo_lora.rst, "RL(HF) algorithms with LoRA Support": its reference GRPO
configuration, and its best practices of rank >= 32 and a learning rate an order of
magnitude above full-parameter training):

  actor_rollout_ref.model.lora_rank=32        -> model.lora.rank=32
  actor_rollout_ref.model.lora_alpha=32       -> model.lora.alpha=32
  actor_rollout_ref.model.target_modules=all-linear
                                              -> model.lora.targets = q, k, v, o, gate, up,
                                                 down (every linear layer but the LM head)
  actor_rollout_ref.actor.optim.lr=3e-5       -> optim.learning_rate=3e-5

SFT of the adapters at 1e-4 (the full-parameter SFT rate, 1e-5, raised by the same order
of magnitude: our choice, not from the recipe). The KL reference is the SFT adapters over
the shared base, so no second copy of the model exists; iStar's PRM and SPA's estimator
keep a copy of the base each and train adapters of their own.
"""

from __future__ import annotations

import dataclasses

from csa_jax.algo_config import IStarConfig, SPAConfig
from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig, OptimConfig,
                            RolloutConfig, SFTConfig)
from csa_jax.model.config import LoRAConfig, preset
from experiments.variants import register_family

# verl-agent's ALFWorld recipe (module docstring), as this trainer's config.
RECIPE_ROLLOUT = RolloutConfig(tasks_per_iter=16, group_size=8, max_turns=50, history_turns=2,
                               max_prompt_tokens=2048, max_action_tokens=512,
                               temperature=1.0, num_envs=128, action_format="think")
RECIPE_ALGO = AlgoConfig(kl_coef=0.01, kl_kind="k3", entropy_coef=0.001, invalid_penalty=0.1,
                         gamma=0.95, clip_low=0.2, clip_high=0.2, loss_agg="token-mean",
                         minibatch_size=256, epochs=1,
                         istar=IStarConfig(learning_rate=1e-6, grad_clip=10.0),
                         spa=SPAConfig(learning_rate=3e-6, explore_k=10))
RECIPE_OPTIM = OptimConfig(learning_rate=1e-6, warmup_steps=0, weight_decay=0.01,
                           grad_clip=1.0, b1=0.9, b2=0.999)
# The full-parameter presets' memory saver (module docstring): AdamW's first moment in
# bfloat16. A bfloat16 KL reference (algo.ref_dtype) is built too but left off: the dry run
# on the 8B preset measured it 1.87 GiB lighter in arguments and 3.37 GiB heavier in XLA's
# temporaries (docs/scale.md, "LoRA policies, and full-parameter runs that fit a 32 GiB slice").
LEAN_REFERENCE, LEAN_MU = "", "bfloat16"
# LoRA presets on a 4x2 mesh: rows per update pass and prompt rows per prefill pass that the
# dry run fits in 16 GiB devices.
LORA_MICRO, LORA_PREFILL = 4, 8
# verl's LoRA RL recipe (module docstring).
RECIPE_LORA = LoRAConfig(rank=32, alpha=32.0)
RECIPE_LORA_LR = 3e-5
LORA_SFT_LR = 1e-4
PROTOCOL_SFT = SFTConfig(num_demos=100, epochs=2, batch_size=32, learning_rate=1e-5)
PROTOCOL_ENV_STEPS = 10_000

# preset name -> (model shape, checkpoint, default mesh, rows per forward/backward pass,
# prompt rows per prefill pass): the last two bound the update's and the sampler's
# activations, sized by the dry run for the preset's mesh (docs/scale.md, "Running at full size").
SIZES = {
    "alfworld": ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "4x2", 4, 16),
    "alfworld_qwen1p5b": ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "1x1", 8, 8),
    "alfworld_qwen7b": ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "4x2", 8, 16),
}


def alfworld_full(prefix: str) -> ExperimentConfig:
  shape, checkpoint, mesh, micro, prefill = SIZES[prefix]
  r = dataclasses.replace(RECIPE_ROLLOUT, prefill_chunk=prefill)
  return ExperimentConfig(
      name=prefix,
      mesh=mesh,
      env=EnvConfig(name="alfworld",
                    kwargs={"source": "generated", "num_train": 1000, "num_eval": 140,
                            "step_limit": 50, "oracle_labels": True},
                    train_split="train", eval_split="eval_unseen", num_train_tasks=1000,
                    pool_backend="process"),
      pretrained=checkpoint,
      model=preset(shape, max_seq_len=r.seq_len),
      rollout=r,
      algo=dataclasses.replace(RECIPE_ALGO, ref_dtype=LEAN_REFERENCE),
      optim=dataclasses.replace(RECIPE_OPTIM, micro_batch_size=micro, mu_dtype=LEAN_MU),
      sft=PROTOCOL_SFT,
      eval=EvalConfig(num_episodes=140, every=5, temperature=0.4),
      rl_iterations=150,
      rl_env_steps=PROTOCOL_ENV_STEPS,
      checkpoint_every=5,
  )


def alfworld_lora(prefix: str) -> ExperimentConfig:
  """`alfworld_full(prefix)` with the policy as LoRA adapters on a frozen bfloat16 base."""
  cfg = alfworld_full(prefix)
  micro, prefill = cfg.optim.micro_batch_size, cfg.rollout.prefill_chunk
  if cfg.mesh == "4x2":
    micro, prefill = min(micro, LORA_MICRO), min(prefill, LORA_PREFILL)
  return dataclasses.replace(
      cfg, name=f"{prefix}_lora",
      rollout=dataclasses.replace(cfg.rollout, prefill_chunk=prefill),
      model=cfg.model.replace(param_dtype="bfloat16", lora=RECIPE_LORA),
      algo=dataclasses.replace(cfg.algo, ref_dtype=""),
      optim=dataclasses.replace(cfg.optim, learning_rate=RECIPE_LORA_LR, mu_dtype="",
                                micro_batch_size=micro),
      sft=dataclasses.replace(cfg.sft, learning_rate=LORA_SFT_LR))


for _prefix, (_shape, _ckpt, *_) in SIZES.items():
  register_family(_prefix, lambda p=_prefix: alfworld_full(p),
                  f"ALFWorld at full size, {_ckpt} (needs model_path)")
  register_family(f"{_prefix}_lora", lambda p=_prefix: alfworld_lora(p),
                  f"ALFWorld at full size, LoRA on {_ckpt} (needs model_path)")
