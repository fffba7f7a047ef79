"""Tests for csa_jax.model: an independent NumPy decoder, padding, KV cache."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax.model import (Decoder, Llama3RopeScaling, LoRAConfig, ModelConfig,
                           token_logprobs)
from csa_jax.model.decoder import rope_inv_freq

V = 61


def _model(seed=0, **overrides):
  cfg = ModelConfig.tiny(V, **overrides)
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  # Non-trivial norm weights and biases, so the reference checks them too.
  rng = np.random.default_rng(seed + 100)
  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Param) and path[-1] in ("weight", "bias"):
      var[...] = jnp.asarray(
          (path[-1] == "weight") + 0.1 * rng.standard_normal(var.shape),
          var[...].dtype)
  return model


def _np_params(model):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))


# ---------- Independent NumPy reference (float64) ----------

def _np_inv_freq(cfg):
  dh = cfg.head_dim
  freqs = [1.0 / cfg.rope_theta ** (2 * i / dh) for i in range(dh // 2)]
  sc = cfg.rope_scaling
  if sc is None:
    return np.array(freqs)
  out = []
  for f in freqs:  # Meta's per-frequency rule from the Llama 3.1 release
    wavelen = 2 * math.pi / f
    low = sc.original_max_position_embeddings / sc.low_freq_factor
    high = sc.original_max_position_embeddings / sc.high_freq_factor
    if wavelen < high:
      out.append(f)
    elif wavelen > low:
      out.append(f / sc.factor)
    else:
      s = ((sc.original_max_position_embeddings / wavelen - sc.low_freq_factor)
           / (sc.high_freq_factor - sc.low_freq_factor))
      out.append((1 - s) * f / sc.factor + s * f)
  return np.array(out)


def _np_rms(x, w, eps):
  return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _np_rope(x_TxNxDh, pos_T, inv_freq):
  half = x_TxNxDh.shape[-1] // 2
  ang = pos_T[:, None] * inv_freq[None]
  cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
  x1, x2 = x_TxNxDh[..., :half], x_TxNxDh[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _np_forward(params, cfg, tokens_T):
  """One unpadded sequence, float64, straight from the definitions."""
  p = jax.tree.map(lambda a: a.astype(np.float64), params)
  t = len(tokens_T)
  pos = np.arange(t, dtype=np.float64)
  inv = _np_inv_freq(cfg)
  x = p["embed_tokens"]["embedding"][tokens_T]
  g = cfg.num_heads // cfg.num_kv_heads
  for i in range(cfg.num_layers):
    lp = p["layers"][i]
    a = lp["self_attn"]
    h = _np_rms(x, lp["input_layernorm"]["weight"], cfg.rms_norm_eps)
    q = np.einsum("td,dhk->thk", h, a["q_proj"]["kernel"])
    k = np.einsum("td,dhk->thk", h, a["k_proj"]["kernel"])
    v = np.einsum("td,dhk->thk", h, a["v_proj"]["kernel"])
    if cfg.qkv_bias:
      q, k, v = (q + a["q_proj"]["bias"], k + a["k_proj"]["bias"],
                 v + a["v_proj"]["bias"])
    q, k = _np_rope(q, pos, inv), _np_rope(k, pos, inv)
    out = np.zeros_like(q)
    for head in range(cfg.num_heads):
      kv = head // g
      s = q[:, head] @ k[:, kv].T / math.sqrt(cfg.head_dim)
      s = np.where(np.tril(np.ones((t, t))) > 0, s, -np.inf)
      w = np.exp(s - s.max(-1, keepdims=True))
      w /= w.sum(-1, keepdims=True)
      out[:, head] = w @ v[:, kv]
    x = x + np.einsum("thk,hkd->td", out, a["o_proj"]["kernel"])
    m = lp["mlp"]
    h = _np_rms(x, lp["post_attention_layernorm"]["weight"], cfg.rms_norm_eps)
    gate = h @ m["gate_proj"]["kernel"]
    x = x + ((gate / (1 + np.exp(-gate))) * (h @ m["up_proj"]["kernel"])
             ) @ m["down_proj"]["kernel"]
  x = _np_rms(x, p["norm"]["weight"], cfg.rms_norm_eps)
  if cfg.tie_embeddings:
    return x @ p["embed_tokens"]["embedding"].T
  return x @ p["lm_head"]["kernel"]


CONFIGS = {
    "gqa": {},
    "mha_bias_tied": dict(num_kv_heads=4, qkv_bias=True, tie_embeddings=True),
    "mqa_rope_scaling": dict(
        num_kv_heads=1, rope_theta=500_000.0,
        rope_scaling=Llama3RopeScaling(factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0,
                                       original_max_position_embeddings=64)),
}


@pytest.mark.parametrize("name,use_jit", [(n, True) for n in sorted(CONFIGS)]
                         + [("gqa", False)])
def test_forward_matches_numpy_reference(name, use_jit):
  model = _model(**CONFIGS[name])
  tokens = np.random.default_rng(1).integers(0, V, (2, 11))
  fwd = (nnx.jit(lambda m, t: m(t)) if use_jit else (lambda m, t: m(t)))
  logits = np.asarray(fwd(model, jnp.asarray(tokens)))
  assert logits.dtype == np.float32 and logits.shape == (2, 11, V)
  params = _np_params(model)
  for b in range(2):
    ref = _np_forward(params, model.cfg, tokens[b])
    np.testing.assert_allclose(logits[b], ref, atol=1e-4, rtol=1e-4)


def test_param_names_follow_hf_layout():
  model = _model(**CONFIGS["mha_bias_tied"])
  params = nnx.to_pure_dict(nnx.state(model))
  assert "lm_head" not in params or params["lm_head"] is None
  attn = params["layers"][0]["self_attn"]
  assert set(attn) == {"q_proj", "k_proj", "v_proj", "o_proj"}
  assert attn["q_proj"]["bias"].shape == (4, 32)
  assert set(params["layers"][0]["mlp"]) == {"gate_proj", "up_proj",
                                             "down_proj"}
  untied = nnx.to_pure_dict(nnx.state(_model()))
  assert untied["lm_head"]["kernel"].shape == (128, V)
  assert "bias" not in untied["layers"][1]["self_attn"]["k_proj"] or (
      untied["layers"][1]["self_attn"]["k_proj"]["bias"] is None)


def test_rope_llama3_scaling_matches_numpy_loop():
  sc = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=8192)
  cfg = ModelConfig.tiny(V, head_dim=128, rope_theta=500_000.0,
                         rope_scaling=sc)
  got = rope_inv_freq(128, 500_000.0, sc)
  np.testing.assert_allclose(got, _np_inv_freq(cfg), rtol=1e-6)
  plain = rope_inv_freq(128, 500_000.0, None)
  assert (got < plain).any() and (got == plain).any()  # both bands present


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_gives_unpadded_logits(side):
  model = _model(**CONFIGS["mha_bias_tied"])
  rng = np.random.default_rng(2)
  lengths = [7, 4, 1]
  p = 9
  seqs = [rng.integers(1, V, n) for n in lengths]
  tokens = np.zeros((3, p), np.int32)
  mask = np.zeros((3, p), np.int32)
  for i, s in enumerate(seqs):
    sl = slice(p - len(s), p) if side == "left" else slice(0, len(s))
    tokens[i, sl], mask[i, sl] = s, 1
  jitted = nnx.jit(lambda m, t, k: m(t, attention_mask_BxT=k))
  eager = lambda m, t, k: m(t, attention_mask_BxT=k)
  alone = [np.asarray(jitted(model, jnp.asarray(s)[None], None))[0]
           for s in seqs]
  for fwd in (eager, jitted) if side == "left" else (jitted,):
    logits = np.asarray(fwd(model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.isfinite(logits).all()
    for i, s in enumerate(seqs):
      np.testing.assert_allclose(logits[i][mask[i] > 0], alone[i], atol=1e-5,
                                 rtol=1e-5)


@pytest.mark.parametrize("name", ["gqa", "mha_bias_tied"])
def test_kv_cache_decode_matches_full_forward(name):
  model = _model(**CONFIGS[name])
  rng = np.random.default_rng(3)
  b, p, n = 2, 6, 5
  tokens = rng.integers(1, V, (b, p + n)).astype(np.int32)
  mask = np.ones((b, p + n), np.int32)
  mask[1, :3] = 0  # row 1 left-padded by 3
  full = np.asarray(model(jnp.asarray(tokens), attention_mask_BxT=mask))
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  cache = model.init_cache(b, p + n)
  kv_mask = np.concatenate([mask[:, :p], np.zeros((b, n), np.int32)], 1)
  step = jax.jit(lambda g, s, *a: nnx.merge(g, s).forward_cached(*a))
  g, s = nnx.split(model)
  logits, cache = step(g, s, tokens[:, :p], positions[:, :p], cache, 0,
                       kv_mask)
  got = [np.asarray(logits)]
  for t in range(p, p + n):
    kv_mask[:, t] = 1
    logits, cache = step(g, s, tokens[:, t:t + 1], positions[:, t:t + 1],
                         cache, t, kv_mask)
    got.append(np.asarray(logits))
  got = np.concatenate(got, 1)
  real = mask > 0
  np.testing.assert_allclose(got[real], full[real], atol=1e-5, rtol=1e-5)


def test_token_logprobs_matches_numpy():
  rng = np.random.default_rng(4)
  logits = rng.standard_normal((2, 3, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, (2, 3))
  ref = np.zeros((2, 3))
  for b in range(2):
    for t in range(3):
      z = logits[b, t].astype(np.float64)
      ref[b, t] = z[targets[b, t]] - np.log(np.exp(z - z.max()).sum()) - z.max()
  for fn in (token_logprobs, jax.jit(token_logprobs)):
    got = fn(jnp.asarray(logits), jnp.asarray(targets))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5)


def test_remat_gives_same_gradients():
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, V, (2, 8)))

  def grads(remat):
    g, s = nnx.split(_model(remat=remat))
    loss = lambda s: token_logprobs(nnx.merge(g, s)(tokens), tokens).mean()
    return jax.jit(jax.grad(loss))(s)

  for a, b in zip(jax.tree.leaves(grads(False)), jax.tree.leaves(grads(True))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_bf16_compute_runs_and_tracks_fp32():
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, V, (2, 8)))
  f32 = _model()
  bf16 = _model(dtype="bfloat16", param_dtype="bfloat16")
  nnx.update(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                nnx.state(f32)))
  assert bf16.layers[0].mlp.up_proj.kernel[...].dtype == jnp.bfloat16
  fwd = nnx.jit(lambda m, t: m(t))
  out = fwd(bf16, tokens)
  assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
  # Same weights up to bf16 rounding; logits close in absolute terms
  # (bf16 keeps ~3 significant digits; logits here are O(1)).
  np.testing.assert_allclose(np.asarray(out), np.asarray(fwd(f32, tokens)),
                             atol=0.1)
  mixed = _model(dtype="bfloat16")  # fp32 params, bf16 compute
  assert mixed.layers[0].mlp.up_proj.kernel[...].dtype == jnp.float32
  assert np.isfinite(np.asarray(fwd(mixed, tokens))).all()


@pytest.mark.parametrize("bad", [
    dict(num_kv_heads=3), dict(head_dim=7), dict(dtype="float16"),
    dict(num_layers=0), dict(rope_scaling={"factor": 8.0}),
    dict(param_dtype="fp32"),
])
def test_config_rejects_bad_values(bad):
  with pytest.raises(ValueError, match="ModelConfig"):
    ModelConfig.tiny(V, **bad)


def test_tiny_config_size():
  model = Decoder(ModelConfig.tiny(256), rngs=nnx.Rngs(0))
  n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert 300_000 <= n <= 1_000_000


@pytest.mark.parametrize("tied", [False, True])
def test_logit_positions_select_rows_of_the_full_logits(tied):
  model = _model(tie_embeddings=tied)
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (3, 10)), jnp.int32)
  mask = jnp.asarray(np.array([[1] * 10, [1] * 7 + [0] * 3, [0] * 2 + [1] * 8]), jnp.int32)
  pos_BxK = np.array([[0, 9], [3, 6], [2, 2]], np.int32)
  full = np.asarray(model(tokens, attention_mask_BxT=mask))
  part = np.asarray(jax.jit(lambda t, m, p: model(t, attention_mask_BxT=m, logit_positions_BxK=p))(
      tokens, mask, jnp.asarray(pos_BxK)))
  assert part.shape == (3, 2, model.cfg.vocab_size)
  for b in range(3):
    for k in range(2):
      np.testing.assert_allclose(part[b, k], full[b, pos_BxK[b, k]], rtol=1e-5, atol=1e-5)



def _prefixed_rows(p, seed=7):
  """Three rows that start with the same p tokens (right-padded to 11 slots, row 1 by 4),
  and what follows the prefix in each."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, V, (3, 11)).astype(np.int32)
  tokens[:, :p] = tokens[0, :p]
  mask = np.ones((3, 11), np.int32)
  mask[1, -4:] = 0
  tokens[mask == 0] = 0
  return tokens, mask, tokens[:, p:], mask[:, p:]


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("p", [1, 4])
def test_a_shared_prefix_gives_the_whole_rows_hidden_states_and_gradients(scan, remat, p):
  """hidden_states_prefixed (the prefix through the layers once, its keys/values read by
  every row) against hidden_states of the whole rows, with trained-looking LoRA adapters
  (B non-zero): the same hidden states on every real token after the prefix, at given
  positions too, and the same gradient of a loss over them with respect to every
  parameter, adapters and base (the prefix's keys/values carry gradient). P = 1 sends the
  prefix pass through the attention's one-query branch. The tolerance is float32 rounding
  of two computations of one function: hidden states (of size 1-3) as for the scanned
  layers against the unrolled ones (test_scan_layers), a gradient to 1e-5 of its largest
  entry. (The whole-row forward of each row alone differs from the batched one by about
  2e-6 in hidden states and 1.5e-6 of a gradient's largest entry, as the prefixed one
  does.)"""
  cfg = ModelConfig.tiny(V, num_layers=2, qkv_bias=True, scan_layers=scan, remat=remat,
                         lora=LoRAConfig(rank=4, alpha=8.0))
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(8)
  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.LoRAParam) and path[-1] == "lora_b":
      var[...] = jnp.asarray(0.1 * rng.standard_normal(var.shape), var[...].dtype)
  tokens, mask, rest, rest_mask = map(jnp.asarray, _prefixed_rows(p))
  at_BxK = jnp.asarray([[0, 11 - p - 1], [2, 11 - p - 5], [1, 3]], jnp.int32)
  w = jnp.asarray(rng.standard_normal((3, 11 - p, cfg.hidden_size)), jnp.float32)
  w = w * rest_mask[..., None]  # the loss reads real tokens only

  def whole(m):
    return m.hidden_states(tokens, attention_mask_BxT=mask)[:, p:]

  def prefixed(m):
    return m.hidden_states_prefixed(tokens[:1, :p], rest, attention_mask_BxS=rest_mask)

  g, state = nnx.split(model)
  run = jax.jit(lambda fn, s: fn(nnx.merge(g, s)), static_argnums=0)
  grad = jax.jit(jax.grad(lambda s, fn: (fn(nnx.merge(g, s)) * w).sum()), static_argnums=1)
  want, got = np.asarray(run(whole, state)), np.asarray(run(prefixed, state))
  real = np.asarray(rest_mask) > 0
  np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
  at = np.asarray(run(lambda m: m.hidden_states_prefixed(
      tokens[:1, :p], rest, attention_mask_BxS=rest_mask, at_BxK=at_BxK), state))
  np.testing.assert_array_equal(at, np.take_along_axis(got, np.asarray(at_BxK)[..., None], 1))
  want_g, got_g = grad(state, whole), grad(state, prefixed)
  lora_a = [x for path, x in nnx.to_flat_state(got_g) if path[-1] == "lora_a"]
  assert lora_a and all(np.abs(np.asarray(x.get_value())).max() > 0 for x in lora_a)
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    b = np.asarray(b)
    np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-5 * np.abs(b).max())
