"""csa_jax.model.hf against Hugging Face transformers (PyTorch, CPU).

Tiny random LlamaForCausalLM (Llama 3.1 rope scaling, untied) and
Qwen2ForCausalLM (q/k/v biases, tied, sharded safetensors) are saved with
`save_pretrained` and loaded with our `from_pretrained`: fp32 logits agree to
1e-4 of the logits' scale, and 32 greedy tokens from our KV-cache sampler equal
transformers' `generate`. torch and transformers are imported only by the tests
that compare against them (tests/conftest.py stops the run if they are missing).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax.model import (Decoder, HFCheckpointError, Llama3RopeScaling,
                           ModelConfig, config_from_hf, from_pretrained,
                           load_model, save_pretrained)
from csa_jax.model.sampling import SamplingConfig, left_pad, sample
from csa_jax.model.tokenizer import train_bpe

V = 320
REL_TOL = 1e-4
N_NEW = 32


@pytest.fixture(scope="module")
def hf():
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(1)
  return torch, transformers


def _write_tokenizer(path):
  tok = train_bpe(["go north", "take the coin", "open the door"] * 10, 280)
  tok.save(path)
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<eos>", "pad_token": "<pad>",
               "tokenizer_class": "PreTrainedTokenizerFast"}, f)
  return tok


def _hf_model(hf, arch, seed, **kw):
  torch, transformers = hf
  common = dict(vocab_size=V, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, initializer_range=0.1)
  common.update(kw)
  torch.manual_seed(seed)
  if arch == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
  else:
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
  with torch.no_grad():  # non-trivial norms and biases, so they are checked
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.2 * torch.randn_like(p))
      elif name.endswith(".bias"):
        p.copy_(0.2 * torch.randn_like(p))
  return model.eval()


LLAMA_KW = dict(rope_theta=10_000.0, tie_word_embeddings=False, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
QWEN_KW = dict(rope_theta=10_000.0, tie_word_embeddings=True)


def _rel_err(ours, ref):
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("arch,kw,shard", [("llama", LLAMA_KW, None),
                                           ("qwen2", QWEN_KW, "40KB")])
def test_logits_and_greedy_match_transformers(hf, tmp_path, arch, kw, shard):
  torch, _ = hf
  ref_model = _hf_model(hf, arch, seed=1, **kw)
  path = str(tmp_path / arch)
  ref_model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
  assert (os.path.exists(os.path.join(path, "model.safetensors.index.json"))
          == bool(shard))
  tok = _write_tokenizer(path)
  model, ours_tok = from_pretrained(path)
  assert ours_tok.eos_id == tok.eos_id and ours_tok.pad_id == tok.pad_id
  assert model.cfg.tie_embeddings == kw["tie_word_embeddings"]
  assert model.cfg.qkv_bias == (arch == "qwen2")
  assert (model.cfg.rope_scaling is not None) == (arch == "llama")

  rng = np.random.default_rng(0)
  ids = rng.integers(0, V, (3, 48))
  with torch.no_grad():
    ref = ref_model(torch.tensor(ids)).logits.numpy()
  assert _rel_err(np.asarray(model(jnp.asarray(ids))), ref) < REL_TOL
  assert _rel_err(np.asarray(jax.jit(lambda m, x: m(x))(model, ids)),
                  ref) < REL_TOL

  # Left padding: HF with explicit positions = ours with the default ones.
  mask = np.ones_like(ids)
  mask[0, :10] = 0
  mask[2, :3] = 0
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    ref = ref_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(pos)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), attention_mask_BxT=mask))
  real = mask.astype(bool)
  assert _rel_err(ours[real], ref[real]) < REL_TOL

  prompts = [list(rng.integers(3, V, n)) for n in (5, 12, 9, 1)]
  tokens, pmask = left_pad(prompts, pad_id=0, bucket=16)
  with torch.no_grad():
    gen = ref_model.generate(
        torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(pmask, dtype=torch.long), do_sample=False,
        max_new_tokens=N_NEW, min_new_tokens=N_NEW, pad_token_id=0,
        eos_token_id=None)
  ref_new = gen[:, tokens.shape[1]:].numpy()
  out = sample(model, tokens, pmask, rng=jax.random.key(0),
               cfg=SamplingConfig(max_new_tokens=N_NEW, greedy=True),
               pad_id=0)
  assert ref_new.shape == (4, N_NEW)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), ref_new)
  # Not a degenerate repetition of one token (the check has some bite).
  assert len(np.unique(ref_new)) > 8


def test_bfloat16_weights_load_bit_exact(hf, tmp_path):
  torch, _ = hf
  ref_model = _hf_model(hf, "qwen2", seed=2, **QWEN_KW).to(torch.bfloat16)
  ref_model.save_pretrained(str(tmp_path))
  model = load_model(str(tmp_path), dtype="bfloat16")
  sd = {k: v.float().numpy() for k, v in ref_model.state_dict().items()}
  attn = model.layers[1].self_attn
  assert attn.q_proj.kernel[...].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(attn.q_proj.kernel[...], np.float32),
      sd["model.layers.1.self_attn.q_proj.weight"].T.reshape(64, 4, 16))
  np.testing.assert_array_equal(
      np.asarray(attn.o_proj.kernel[...], np.float32),
      sd["model.layers.1.self_attn.o_proj.weight"].T.reshape(4, 16, 64))
  np.testing.assert_array_equal(
      np.asarray(attn.k_proj.bias[...], np.float32),
      sd["model.layers.1.self_attn.k_proj.bias"].reshape(2, 16))
  with torch.no_grad():
    ids = torch.tensor(np.random.default_rng(1).integers(0, V, (2, 24)))
    ref = ref_model(ids).logits.float().numpy()
  # bf16 compute: a loose sanity bound (fp32 parity is the exact check).
  assert _rel_err(np.asarray(model(jnp.asarray(ids.numpy()))), ref) < 5e-2


def test_export_loads_in_transformers(hf, tmp_path):
  torch, transformers = hf
  cfg = ModelConfig.tiny(V, hidden_size=64, intermediate_size=96, head_dim=16,
                         rope_scaling=Llama3RopeScaling(
                             original_max_position_embeddings=32))
  model = Decoder(cfg, rngs=nnx.Rngs(3))
  save_pretrained(model, str(tmp_path), max_shard_bytes=60_000)
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path)).eval()
  assert type(ref_model).__name__ == "LlamaForCausalLM"
  ids = np.random.default_rng(2).integers(0, V, (2, 30))
  with torch.no_grad():
    ref = ref_model(torch.tensor(ids)).logits.numpy()
  assert _rel_err(np.asarray(model(jnp.asarray(ids))), ref) < REL_TOL


# ------------------------------------------------ torch-free tests ----------

def _params(model):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))


@pytest.mark.parametrize("overrides,shard", [
    (dict(qkv_bias=True, tie_embeddings=True), None),
    (dict(rope_scaling=Llama3RopeScaling()), 30_000)])
def test_save_load_round_trip(tmp_path, overrides, shard):
  cfg = ModelConfig.tiny(V, hidden_size=64, intermediate_size=96, head_dim=16,
                         **overrides)
  model = Decoder(cfg, rngs=nnx.Rngs(4))
  save_pretrained(model, str(tmp_path), max_shard_bytes=shard)
  back = load_model(str(tmp_path))
  assert back.cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, _params(back), _params(model))
  back16 = load_model(str(tmp_path), dtype="bfloat16", max_seq_len=64)
  assert back16.cfg.param_dtype == "bfloat16" and back16.cfg.max_seq_len == 64


def test_load_with_mesh_places_shards(tmp_path):
  from csa_jax.distributed import mesh as mesh_lib
  cfg = ModelConfig.tiny(V, hidden_size=64, intermediate_size=96, head_dim=16)
  model = Decoder(cfg, rngs=nnx.Rngs(5))
  save_pretrained(model, str(tmp_path))
  mesh = mesh_lib.make_mesh(f"1x{jax.device_count()}")
  back = load_model(str(tmp_path), mesh=mesh)
  kernel = back.layers[0].mlp.gate_proj.kernel[...]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  ids = np.arange(20).reshape(2, 10)
  np.testing.assert_allclose(np.asarray(back(ids)), np.asarray(model(ids)),
                             rtol=1e-5, atol=1e-5)


LEGACY = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"}}


def test_config_legacy_spelling():
  # Llama-3.2-1B's config.json fields (older transformers spelling).
  cfg = config_from_hf(LEGACY, dtype="bfloat16")
  assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_theta) == (64, 8, 5e5)
  assert cfg.rope_scaling == Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
  assert cfg.tie_embeddings and not cfg.qkv_bias
  assert cfg.dtype == cfg.param_dtype == "bfloat16"
  qwen = dict(LEGACY, architectures=["Qwen2ForCausalLM"], rope_scaling=None,
              use_sliding_window=False, sliding_window=32768)
  cfg = config_from_hf(qwen, param_dtype="float32")
  assert cfg.qkv_bias and cfg.rope_scaling is None and cfg.dtype == "float32"


@pytest.mark.parametrize("change,needle", [
    ({"architectures": ["MistralForCausalLM"]}, "unsupported architectures"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "unsupported rope type 'yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "'low_freq_factor'"),
    ({"hidden_size": "2048"}, "'hidden_size' must be int"),
    ({"vocab_size": None}, "missing field 'vocab_size'"),
    ({"num_key_value_heads": 5}, "multiple of num_kv_heads"),
    ({"hidden_act": "gelu"}, "unsupported hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_config_errors(change, needle):
  with pytest.raises(HFCheckpointError, match=needle) as e:
    config_from_hf({**LEGACY, **change}, source="x/config.json")
  assert "\n" not in str(e.value) and "x/config.json" in str(e.value)


def _saved(tmp_path, shard=None):
  cfg = ModelConfig.tiny(V, hidden_size=32, intermediate_size=64, head_dim=8,
                         num_layers=1)
  save_pretrained(Decoder(cfg, rngs=nnx.Rngs(6)), str(tmp_path),
                  max_shard_bytes=shard)
  return str(tmp_path)


def _edit_weights(path, fn):
  import safetensors.numpy
  f = os.path.join(path, "model.safetensors")
  tensors = fn(dict(safetensors.numpy.load_file(f)))
  safetensors.numpy.save_file(tensors, f)


def _fails(path, needle, **kw):
  with pytest.raises((HFCheckpointError, FileNotFoundError, ValueError),
                     match=needle) as e:
    from_pretrained(path, **kw)
  assert "\n" not in str(e.value)


def test_load_errors(tmp_path):
  _fails(str(tmp_path / "nope"), "not a directory")
  path = _saved(tmp_path / "a")
  _fails(path, "missing file .*tokenizer.json")  # no tokenizer files
  _fails(path, "dtype must be one of", dtype="float16", load_tokenizer=False)
  os.remove(os.path.join(path, "model.safetensors"))
  _fails(path, "no model.safetensors or model.safetensors.index.json",
         load_tokenizer=False)
  open(os.path.join(path, "pytorch_model.bin"), "w").close()
  _fails(path, "convert PyTorch .bin", load_tokenizer=False)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write("{not json")
  _fails(path, "malformed JSON in .*config.json", load_tokenizer=False)
  os.remove(os.path.join(path, "config.json"))
  _fails(path, "missing file .*config.json", load_tokenizer=False)


@pytest.mark.parametrize("edit,needle", [
    (lambda t: {k: v for k, v in t.items() if "o_proj" not in k},
     "missing tensor 'model.layers.0.self_attn.o_proj.weight'"),
    (lambda t: {**t, "model.layers.1.mlp.up_proj.weight": np.zeros((2, 2))},
     "unexpected tensor 'model.layers.1.mlp.up_proj.weight'"),
    (lambda t: {**t, "model.norm.weight": np.ones(33, np.float32)},
     r"'model.norm.weight' in model.safetensors has shape \[33\], "
     r"expected \[32\]"),
    (lambda t: {**t, "model.layers.0.self_attn.rotary_emb.inv_freq":
                np.ones(4, np.float32)}, None),
])
def test_weight_errors(tmp_path, edit, needle):
  path = _saved(tmp_path)
  _edit_weights(path, edit)
  if needle is None:  # an ignorable buffer loads fine
    load_model(path)
  else:
    _fails(path, needle, load_tokenizer=False)


def test_index_errors(tmp_path):
  path = _saved(tmp_path, shard=20_000)
  index_file = os.path.join(path, "model.safetensors.index.json")
  with open(index_file) as f:
    index = json.load(f)
  first = sorted(set(index["weight_map"].values()))[0]
  os.remove(os.path.join(path, first))
  _fails(path, f"missing file .*{first} \\(listed in", load_tokenizer=False)
  with open(index_file, "w") as f:
    json.dump({"weight_map": {}}, f)
  _fails(path, "missing or empty 'weight_map'", load_tokenizer=False)
