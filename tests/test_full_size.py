"""Full-size presets and the dry run: the presets carry the published recipe they cite,
training refuses them without weights, and `launch.py --dry-run` compiles a run's
programs on a (simulated) mesh and reports per-device memory that matches the arrays'
sizes counted by hand."""

import os
import subprocess
import sys

import numpy as np
import pytest

import experiments
from csa_jax.config import apply_overrides
from csa_jax.run import dry_run
from tests import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The checkpoints' own config.json values (Hugging Face model cards' files).
HF_SHAPES = {
    "alfworld": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                     rope_theta=500000.0, rms_norm_eps=1e-5, tie_embeddings=False,
                     qkv_bias=False),
    "alfworld_qwen1p5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                              num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                              rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                              qkv_bias=True),
    "alfworld_qwen7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                            num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=False,
                            qkv_bias=True),
}
CHECKPOINTS = {"alfworld": "meta-llama/Llama-3.1-8B-Instruct",
               "alfworld_qwen1p5b": "Qwen/Qwen2.5-1.5B-Instruct",
               "alfworld_qwen7b": "Qwen/Qwen2.5-7B-Instruct"}


@pytest.mark.parametrize("prefix", sorted(HF_SHAPES))
def test_full_size_presets_carry_the_cited_recipe(prefix):
  cfg = experiments.get_experiment(f"{prefix}_csa")
  assert cfg.pretrained == CHECKPOINTS[prefix] and not cfg.model_path
  m = cfg.model
  for k, v in HF_SHAPES[prefix].items():
    assert getattr(m, k) == v, k
  assert (m.param_dtype, m.dtype, m.remat) == ("float32", "bfloat16", True)
  if prefix == "alfworld":  # Llama 3.1's rope scaling
    rs = m.rope_scaling
    assert (rs.factor, rs.low_freq_factor, rs.high_freq_factor,
            rs.original_max_position_embeddings) == (8.0, 1.0, 4.0, 8192)
  # verl-agent's ALFWorld scripts (experiments/full_size.py maps each value).
  r, a, o = cfg.rollout, cfg.algo, cfg.optim
  assert (r.tasks_per_iter, r.group_size, r.max_turns, r.history_turns) == (16, 8, 50, 2)
  assert (r.max_prompt_tokens, r.max_action_tokens, r.temperature) == (2048, 512, 1.0)
  assert r.action_format == "think" and m.max_seq_len >= 2048 + 512
  assert (a.kl_coef, a.kl_kind, a.entropy_coef, a.invalid_penalty, a.gamma) == (
      0.01, "k3", 0.001, 0.1, 0.95)
  assert (a.minibatch_size, a.epochs, a.clip_low, a.clip_high) == (256, 1, 0.2, 0.2)
  assert (o.learning_rate, o.weight_decay, o.grad_clip, o.b1, o.b2, o.warmup_steps) == (
      1e-6, 0.01, 1.0, 0.9, 0.999, 0)
  assert (cfg.eval.temperature, cfg.eval.every, cfg.checkpoint_every) == (0.4, 5, 5)
  # The proposal's protocol: 100 demonstrations, G = 8, 10,000 environment steps.
  assert cfg.sft.num_demos == 100 and cfg.rl_env_steps == 10_000
  # The model-based baselines' authors' values.
  assert (a.istar.learning_rate, a.istar.grad_clip) == (1e-6, 10.0)
  assert (a.spa.learning_rate, a.spa.explore_k) == (3e-6, 10)
  # Each method's own definition applies on top of the recipe.
  grpo, mtdpo = (experiments.get_experiment(f"{prefix}_{x}") for x in ("grpo", "mtdpo"))
  assert grpo.algo.loss_agg == "seq-mean-token-mean" and grpo.optim == cfg.optim
  assert mtdpo.algo.kl_coef == 0.0 and mtdpo.algo.method == "mtdpo"


def _launch(*args, env=None):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=900, env=env)


def test_a_full_size_preset_refuses_to_train_without_its_weights(tmp_path):
  work = tmp_path / "w"
  out = _launch("--exp", "alfworld_csa", "--workdir", str(work), "--mesh", "1x1")
  assert out.returncode == 2, out.stderr[-2000:]
  assert "sized for meta-llama/Llama-3.1-8B-Instruct" in out.stderr
  assert "--set model_path=DIR" in out.stderr and "--dry-run" in out.stderr
  assert not work.exists()


TINY = ["--set", "rollout.num_envs=8", "--set", "algo.minibatch_size=16",
        "--set", "sft.batch_size=16", "--set", "rollout.max_prompt_tokens=64"]


def test_dry_run_on_a_simulated_4x2_mesh_prints_a_plan_and_a_verdict(tmp_path):
  env = xla_env.env_with_devices(8)
  work = tmp_path / "never_written"
  base = ["--exp", "coin_doors_csa", "--mesh", "4x2", "--dry-run", "--workdir", str(work), *TINY]
  out = _launch(*base, "--set", "device_memory_gb=1", env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert "mesh {'data': 4, 'model': 2} on 8 x cpu" in lines[0]
  for name in ("sampler (8 x 64 + 8 tokens)", "SFT step (16 rows x 72)", "RL step (16 rows x 72)"):
    assert any(l.strip().startswith(name) and "peak" in l for l in lines), name
  assert "fits in 1 GiB devices" in lines[-1]
  out = _launch(*base, "--set", "device_memory_gb=0.0001", env=env)
  assert out.returncode == 1 and "does NOT fit" in out.stdout, out.stdout[-2000:]
  assert not work.exists()


def test_dry_run_memory_is_what_the_arrays_hold(tmp_path):
  """One device: the SFT step's arguments are the train state (params, AdamW's two
  moments, counters) and the batch, counted here from the shapes alone; the sampler runs
  with the optimizer state resident; a model_path's config.json gives the shape."""
  cfg = apply_overrides(experiments.get_experiment("coin_doors_csa"), [
      "rollout.num_envs=4", "algo.minibatch_size=8", "sft.batch_size=8",
      "rollout.max_prompt_tokens=64"])
  plan = dry_run.plan(cfg, log=lambda _: None)
  m = cfg.model
  d, f, v = m.hidden_size, m.intermediate_size, m.vocab_size
  q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
  per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d + (q + 2 * kv) * m.qkv_bias
  n_params = m.num_layers * per_layer + v * d * (1 if m.tie_embeddings else 2) + d
  assert plan.num_params == n_params
  seq, act = 64 + cfg.rollout.max_action_tokens, cfg.rollout.max_action_tokens
  # inputs, attn_mask [N, L]; act_pos, targets, loss_mask, old_logp, adv [N, A]; 4 bytes
  # each. SFT reads neither old_logp nor adv, and jit drops unused arguments.
  rl_batch, sft_batch = 8 * (2 * seq + 5 * act) * 4, 8 * (2 * seq + 3 * act) * 4
  state = 3 * 4 * n_params + 4 + 4  # fp32 params, mu, nu; the step and Adam's count
  sampler, sft, rl = plan.programs
  assert sft.argument == state + sft_batch
  assert sft.alias == state  # the donated state is updated in place
  assert cfg.algo.kl_coef > 0  # AdamW's state and the KL reference, while sampling:
  assert sampler.resident == 2 * 4 * n_params + 4 + 4 * n_params
  assert rl.argument == state + rl_batch + 4 * n_params  # + the KL reference
  assert plan.fits is None and "device_memory_gb" in dry_run.verdict(plan)

  from flax import nnx
  from csa_jax.model import Decoder, ModelConfig, hf
  shape = ModelConfig.tiny(vocab_size=96, hidden_size=32, intermediate_size=64, head_dim=8,
                           num_heads=2, num_kv_heads=1, qkv_bias=True, tie_embeddings=True)
  hf.save_pretrained(Decoder(shape, rngs=nnx.Rngs(0)), str(tmp_path / "ckpt"))
  got, source = dry_run.model_config(apply_overrides(cfg, [f"model_path={tmp_path / 'ckpt'}"]))
  assert source.endswith("config.json")
  assert (got.vocab_size, got.hidden_size, got.num_layers, got.qkv_bias) == (96, 32, 2, True)
  assert np.isclose(got.rope_theta, shape.rope_theta)
