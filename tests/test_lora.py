"""LoRA policies (csa_jax/model/lora.py): a fresh adapter leaves the model unchanged, the
updates move the adapters alone and keep optimizer state for them alone, the base is
never copied (the KL reference is the SFT adapters over the policy's own base buffers),
checkpoints hold the adapters, and the merged export computes what the adapted model does.
Also the full-parameter memory savers: a bfloat16 KL reference and first moment."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax.config import AlgoConfig, ConfigError, OptimConfig, apply_overrides
from csa_jax.model import Decoder, LoRAConfig, ModelConfig, hf, lora
from csa_jax.model.sampling import SamplingConfig
from csa_jax.run.checkpoint import Checkpointer
from csa_jax.update import train_step as ts

BASE = ModelConfig.tiny(vocab_size=64, max_seq_len=32, hidden_size=32, intermediate_size=64,
                        head_dim=8)
LORA = LoRAConfig(rank=4, alpha=8.0)


def _tokens(b=3, t=10, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 64, (b, t)))


def _batch(seed=0, n=4, L=12, A=4):
  rng = np.random.default_rng(seed)
  toks = rng.integers(2, 64, (n, L))
  return {"inputs": jnp.asarray(toks), "attn_mask": jnp.ones((n, L), jnp.int32),
          "act_pos": jnp.asarray(np.tile(np.arange(L - A - 1, L - 1), (n, 1))),
          "targets": jnp.asarray(toks[:, L - A:]), "loss_mask": jnp.ones((n, A)),
          "old_logp": jnp.full((n, A), -4.0), "adv": jnp.asarray(rng.normal(size=(n, A)),
                                                                 jnp.float32)}


def _flat(params):
  return dict(nnx.to_flat_state(params))


def _randomise_b(params, seed=1):
  """Adapters with a non-zero B (a trained adapter), so they change the logits."""
  key = jax.random.key(seed)
  out = []
  for i, (p, v) in enumerate(nnx.to_flat_state(params)):
    if p[-1] == "lora_b":
      v = v.replace(0.3 * jax.random.normal(jax.random.fold_in(key, i), v.get_value().shape))
    out.append((p, v))
  return nnx.from_flat_state(out)


@pytest.mark.parametrize("scan", [False, True])
def test_a_zero_initialised_adapter_gives_the_base_models_logits(scan):
  base = Decoder(BASE.replace(scan_layers=scan), rngs=nnx.Rngs(0))
  adapted = Decoder(BASE.replace(scan_layers=scan, lora=LORA), rngs=nnx.Rngs(0))
  toks = _tokens()
  np.testing.assert_array_equal(np.asarray(adapted(toks)), np.asarray(base(toks)))
  flat = _flat(nnx.state(adapted, nnx.LoRAParam))
  # Every one of the seven projections of every layer carries an adapter; B is zero, A not.
  names = {p[-2] for p in flat}
  assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
  for p, v in flat.items():
    x = np.asarray(v.get_value())
    assert (x == 0).all() if p[-1] == "lora_b" else (x != 0).all()
  # The base weights of a seed do not depend on the adapters.
  base_flat = _flat(nnx.state(base, nnx.Param))
  for p, v in _flat(nnx.split_state(nnx.state(adapted, nnx.Param), nnx.LoRAParam, ...)[1]).items():
    np.testing.assert_array_equal(np.asarray(v.get_value()), np.asarray(base_flat[p].get_value()))


def test_targets_rank_and_alpha_are_config_fields():
  cfg = BASE.replace(lora=LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj")))
  m = Decoder(cfg, rngs=nnx.Rngs(0))
  flat = _flat(nnx.state(m, nnx.LoRAParam))
  assert {p[-2] for p in flat} == {"q_proj", "v_proj"}
  assert flat[("layers", 0, "self_attn", "q_proj", "lora_a")].get_value().shape == (32, 2)
  assert flat[("layers", 0, "self_attn", "q_proj", "lora_b")].get_value().shape == (2, 4, 8)
  assert m.layers[0].self_attn.q_proj.lora_scale == 2.0
  import experiments
  exp = apply_overrides(experiments.get_experiment("quickstart"), [
      "model.lora.rank=8", "model.lora.alpha=16", "model.lora.targets=q_proj,down_proj"])
  assert exp.model.lora == LoRAConfig(rank=8, alpha=16.0, targets=("q_proj", "down_proj"))
  with pytest.raises(ConfigError, match="targets"):
    apply_overrides(exp, ["model.lora.targets=lm_head"])
  with pytest.raises(ConfigError, match="rank"):
    apply_overrides(exp, ["model.lora.rank=-1"])


def _lora_model(scan=False):
  g, p = nnx.split(Decoder(BASE.replace(scan_layers=scan, lora=LORA), rngs=nnx.Rngs(0)),
                   nnx.Param)
  return g, p


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_gradients_reach_only_the_adapters_and_the_base_is_never_donated(kind):
  g, p = _lora_model()
  before = {k: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(p)}
  base_arrays = {k: v.get_value() for k, v in nnx.to_flat_state(lora.split(p)[1][""])}
  tx = optax.adam(1e-2)
  state = ts.init_state(lora.merge(jax.tree.map(jnp.copy, lora.trainable(p)),
                                   lora.split(p)[1]), tx)
  if kind == "sft":
    step, extra = ts.make_sft_step(g, tx), ()
  else:
    step = ts.make_rl_step(g, tx, AlgoConfig(kl_coef=0.1), SamplingConfig(max_new_tokens=4))
    extra = (p,)  # the reference: the initial adapters over the same base
  for i in range(3):
    state, m = step(state, _batch(i), *extra)
  assert float(m["grad_norm"]) > 0
  moved = set()
  for k, v in nnx.to_flat_state(state.params):
    if not np.array_equal(np.asarray(v.get_value()), before[k]):
      moved.add(k)
  adapters = {k for k, v in nnx.to_flat_state(p) if isinstance(v, nnx.LoRAParam)}
  assert moved == adapters  # every adapter moved (B from zero), nothing else
  for k, v in nnx.to_flat_state(lora.split(state.params)[1][""]):
    assert v.get_value() is base_arrays[k]  # the very buffers: not copied, not donated
    assert not v.get_value().is_deleted()


def _count(tree):
  leaves = jax.tree.leaves(tree)
  return len(leaves), sum(x.size * x.dtype.itemsize for x in leaves)


def test_the_train_state_holds_no_second_base_and_no_moments_for_it(tmp_path):
  """The arrays a LoRA run holds while it trains: the base once, the policy's adapters,
  AdamW's two moments of the adapters alone, and the KL reference as SFT adapters restored
  from the SFT checkpoint over the very same base buffers (csa_jax/run/trainer.py,
  `_kl_reference`)."""
  g, p = _lora_model(scan=True)
  adapters, frozen = lora.split(p)
  n_ad, bytes_ad = _count(adapters)
  n_base, bytes_base = _count(frozen)
  tx = ts.make_optimizer(OptimConfig())
  state = ts.init_state(p, tx)
  n_opt, bytes_opt = _count(state.opt_state)
  assert n_opt == 2 * n_ad + 1 and bytes_opt == 2 * bytes_ad + 4  # mu, nu; Adam's count
  sft = Checkpointer(str(tmp_path / "sft"))
  sft.save(0, state.params, {})
  sft.wait()
  saved, _ = sft.read()
  assert _count(saved) == (n_ad, bytes_ad)  # the checkpoint holds the adapters alone
  ref, _ = sft.restore(ts.reference_params(state.params, "bfloat16"))
  buffers = {}
  for x in jax.tree.leaves((state, ref)):
    buffers[x.unsafe_buffer_pointer()] = x.size * x.dtype.itemsize
  # Distinct buffers: the base once, the adapters twice (policy, reference), the moments.
  assert len(buffers) == n_base + 2 * n_ad + n_opt + 1  # + the step counter
  assert sum(buffers.values()) == bytes_base + 2 * bytes_ad + bytes_opt + 4
  assert bytes_base > 5 * bytes_ad
  # The RL step reads that reference: a policy equal to it has KL 0.
  step = ts.make_rl_step(g, tx, AlgoConfig(kl_coef=0.1), SamplingConfig(max_new_tokens=4))
  _, m = step(state, _batch(), ref)
  assert float(m["kl_ref"]) == 0.0


def test_a_bfloat16_reference_and_first_moment_for_full_parameter_runs(tmp_path):
  """Under bfloat16 compute a bfloat16 copy of float32 weights gives the same logits (each
  weight is cast to bfloat16 before use either way), in half the bytes; optim.mu_dtype
  stores AdamW's first moment in bfloat16."""
  cfg = BASE.replace(dtype="bfloat16")
  g, p = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  ck = Checkpointer(str(tmp_path / "sft"))
  ck.save(0, p, {})
  ck.wait()
  ref, _ = ck.restore(ts.reference_params(p, "bfloat16"))
  assert {x.dtype for x in jax.tree.leaves(ref)} == {jnp.dtype(jnp.bfloat16)}
  assert _count(ref)[1] * 2 == _count(p)[1]
  toks = _tokens()
  np.testing.assert_array_equal(np.asarray(nnx.merge(g, ref)(toks)),
                                np.asarray(nnx.merge(g, p)(toks)))
  tx = ts.make_optimizer(OptimConfig(mu_dtype="bfloat16"))
  state = ts.init_state(p, tx)
  adam = state.opt_state[1][0]
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float32)}
  step = ts.make_rl_step(g, tx, AlgoConfig(kl_coef=0.1), SamplingConfig(max_new_tokens=4))
  state, m = step(state, _batch(), ref)
  assert float(m["kl_ref"]) == 0.0 and np.isfinite(float(m["grad_norm"]))


@pytest.mark.parametrize("scan", [False, True])
def test_the_merged_export_equals_the_adapted_models_logits(tmp_path, scan):
  g, p = _lora_model(scan)
  model = nnx.merge(g, _randomise_b(p))
  toks = _tokens()
  want = np.asarray(model(toks))
  assert np.abs(want - np.asarray(Decoder(BASE.replace(scan_layers=scan),
                                          rngs=nnx.Rngs(0))(toks))).max() > 1e-2
  merged = lora.merged_model(model)
  assert not merged.cfg.lora.enabled
  assert not nnx.state(merged, nnx.LoRAParam)
  np.testing.assert_allclose(np.asarray(merged(toks)), want, rtol=1e-5, atol=1e-5)
  hf.save_pretrained(model, str(tmp_path / "merged"))  # merges on the way out
  back = hf.load_model(str(tmp_path / "merged"))
  np.testing.assert_allclose(np.asarray(back(toks)), want, rtol=1e-5, atol=1e-5)


def test_adapters_on_a_loaded_checkpoint_and_the_peft_files(tmp_path):
  hf.save_pretrained(Decoder(BASE, rngs=nnx.Rngs(3)), str(tmp_path / "base"))
  plain = hf.load_model(str(tmp_path / "base"))
  model = hf.load_model(str(tmp_path / "base"), lora=LORA, seed=5)
  toks = _tokens()
  np.testing.assert_array_equal(np.asarray(model(toks)), np.asarray(plain(toks)))
  # The adapters are those of Decoder(cfg, seed 5): A drawn, B zero.
  want = _flat(nnx.state(Decoder(BASE.replace(lora=LORA), rngs=nnx.Rngs(5)), nnx.LoRAParam))
  for k, v in _flat(nnx.state(model, nnx.LoRAParam)).items():
    np.testing.assert_array_equal(np.asarray(v.get_value()), np.asarray(want[k].get_value()))
  hf.save_peft(model, str(tmp_path / "peft"), base_model_name_or_path="tiny")
  import json
  import safetensors.numpy
  with open(tmp_path / "peft" / hf.ADAPTER_CONFIG) as f:
    conf = json.load(f)
  assert (conf["peft_type"], conf["r"], conf["lora_alpha"]) == ("LORA", 4, 8.0)
  tensors = safetensors.numpy.load_file(str(tmp_path / "peft" / hf.ADAPTER_WEIGHTS))
  assert len(tensors) == 2 * 7 * BASE.num_layers
  q = "base_model.model.model.layers.1.self_attn.q_proj"
  assert tensors[f"{q}.lora_A.weight"].shape == (4, 32)  # [r, in]
  assert tensors[f"{q}.lora_B.weight"].shape == (32, 4)  # [out = heads x head_dim, r]
  assert tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"].shape == (
      4, 32)


def test_sizes_and_the_dry_run_plan_count_adapters_and_base_apart():
  import experiments
  from csa_jax.run import dry_run
  cfg = apply_overrides(experiments.get_experiment("coin_doors_csa"), [
      "rollout.num_envs=4", "algo.minibatch_size=8", "sft.batch_size=8",
      "rollout.max_prompt_tokens=64", "model.lora.rank=4", "model.param_dtype=bfloat16"])
  lines = []
  plan = dry_run.plan(cfg, log=lines.append)
  m = cfg.model
  abstract = nnx.eval_shape(lambda: Decoder(m, rngs=nnx.Rngs(0)))
  adapters, frozen = lora.split(nnx.split(abstract, nnx.Param)[1])
  n_ad, b_ad = _count(adapters)
  _, b_base = _count(frozen)
  assert b_ad == 4 * sum(x.size for x in jax.tree.leaves(adapters))  # float32 adapters
  assert b_base == 2 * sum(x.size for x in jax.tree.leaves(frozen))  # bfloat16 base
  assert any("LoRA rank 4" in l and "base" in l and "adapters" in l for l in lines), lines
  sampler, sft, rl = plan.programs
  seq, act = 64 + cfg.rollout.max_action_tokens, cfg.rollout.max_action_tokens
  sft_batch, rl_batch = 8 * (2 * seq + 3 * act) * 4, 8 * (2 * seq + 5 * act) * 4
  state = b_base + 3 * b_ad + 4 + 4  # the base once; adapters, mu, nu; two counters
  assert sft.argument == state + sft_batch
  assert sft.alias == 3 * b_ad + 8  # only the trainable state is donated
  assert rl.argument == state + rl_batch + b_ad  # + the reference's adapters
  assert sampler.resident == 2 * b_ad + 4 + b_ad  # moments + the reference's adapters
  assert "fits" in dry_run.verdict(plan)
