"""Llama 3 / Qwen2 decoder-only transformer in Flax NNX, with a KV-cache path.

The block is the one of Llama 3 (arXiv 2407.21783) and Qwen2 (arXiv
2407.10671): pre-RMSNorm, rotary position embeddings (half-split "rotate_half"
layout as in Hugging Face transformers, with optional Llama 3.1 frequency
scaling), grouped-query attention (optional q/k/v biases for Qwen2), SwiGLU MLP,
final RMSNorm and a tied or untied LM head.

Parameter names mirror the Hugging Face module tree so that checkpoint loading
is a rename plus a transpose/reshape:

  embed_tokens.embedding [V, D]           = embed_tokens.weight
  layers[i].self_attn.q_proj.kernel [D, H, Dh]  = q_proj.weight.T.reshape
  layers[i].self_attn.{k,v}_proj.kernel [D, K, Dh]
  layers[i].self_attn.{q,k,v}_proj.bias [H|K, Dh]  (Qwen2 only)
  layers[i].self_attn.o_proj.kernel [H, Dh, D]  = o_proj.weight.T.reshape
  layers[i].mlp.{gate,up}_proj.kernel [D, F], mlp.down_proj.kernel [F, D]
  layers[i].{input,post_attention}_layernorm.weight [D], norm.weight [D]
  lm_head.kernel [D, V]                   = lm_head.weight.T  (untied only)

Every parameter carries logical axis names in its `out_sharding` metadata
(created with eager_sharding=False, so nothing is placed at construction);
`csa_jax.distributed.mesh` maps those names to mesh axes.

Scanned layers (`ModelConfig.scan_layers`, as MaxText and Tunix do for deep models):
`layers` is then one DecoderLayer whose parameters are stacked along a leading
"layers" axis [L, ...], and the forward pass is a `lax.scan` over it, so XLA compiles
one layer body whatever the depth (compile time stays flat from 2 to 80 layers). The
KV cache is then two stacked arrays [L, B, K, S, Dh]. A scanned and an unscanned model
made from the same seed hold the same numbers (layer i of the stack is layer i).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from csa_jax.model.config import ModelConfig
from csa_jax.model.kv_cache import KVCache, LayerKV, cache_shape
from csa_jax.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

# A large finite negative (not -inf) so fully masked rows (padding queries)
# give a finite uniform softmax instead of NaN.
_MASK_VALUE = -1e30


def _param(value: jax.Array, axes: Sequence[str | None]) -> nnx.Param:
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


# The logical axis of a LoRA adapter's rank (in no rules table: replicated).
LORA_RANK_AXIS = "lora_rank"


class Dense(nnx.Module):
  """y = x . kernel (+ bias), contracting the last len(in_shape) axes of x.

  With `lora` (ModelConfig.lora enabled for this projection), also + (alpha / r) (x . A) . B:
  lora_a [in..., r] and lora_b [r, out...] are nnx.LoRAParam (csa_jax/model/lora.py: the
  trainable part), A drawn from the kernel's key folded (so the base weights of a seed do
  not depend on the adapters) and B zero.
  """

  def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
               in_axes: tuple[str, ...], out_axes: tuple[str, ...], *,
               cfg: ModelConfig, use_bias: bool, rngs: nnx.Rngs, lora: bool = False):
    init = nnx.initializers.normal(stddev=0.02)
    key = rngs.params()
    self.kernel = _param(init(key, in_shape + out_shape, cfg.jnp_param_dtype),
                         in_axes + out_axes)
    self.bias = (_param(jnp.zeros(out_shape, cfg.jnp_param_dtype), out_axes)
                 if use_bias else None)
    self.n_in = len(in_shape)
    self.dtype = cfg.jnp_dtype
    lora_a = lora_b = None
    if lora:
      lc = cfg.lora
      dtype = lc.jnp_param_dtype
      bound = 1.0 / math.sqrt(math.prod(in_shape))  # PEFT's kaiming_uniform(a=sqrt(5))
      lora_a = nnx.LoRAParam(
          jax.random.uniform(jax.random.fold_in(key, 1), in_shape + (lc.rank,), dtype,
                             -bound, bound),
          out_sharding=tuple(in_axes) + (LORA_RANK_AXIS,), eager_sharding=False)
      lora_b = nnx.LoRAParam(jnp.zeros((lc.rank,) + out_shape, dtype),
                             out_sharding=(LORA_RANK_AXIS,) + tuple(out_axes),
                             eager_sharding=False)
    self.lora_a, self.lora_b = lora_a, lora_b
    self.lora_scale = cfg.lora.scale if lora else 0.0

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    y = jnp.tensordot(x, self.kernel[...].astype(self.dtype), axes=self.n_in)
    if self.lora_a is not None:
      xa = jnp.tensordot(x, self.lora_a[...].astype(self.dtype), axes=self.n_in)
      y = y + self.lora_scale * jnp.tensordot(xa, self.lora_b[...].astype(self.dtype), axes=1)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class RMSNorm(nnx.Module):
  """RMSNorm computed in float32, scaled in the compute dtype (as HF does)."""

  def __init__(self, cfg: ModelConfig):
    self.weight = _param(jnp.ones((cfg.hidden_size,), cfg.jnp_param_dtype),
                         ("norm",))
    self.eps = cfg.rms_norm_eps
    self.dtype = cfg.jnp_dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return self.weight[...].astype(self.dtype) * x32.astype(self.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with optional q/k/v biases and a KV cache."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    kw = dict(cfg=cfg, rngs=rngs)
    on = cfg.lora.on
    self.q_proj = Dense((d,), (h, dh), ("embed",), ("q_heads", "head_dim"),
                        use_bias=cfg.qkv_bias, lora=on("q_proj"), **kw)
    self.k_proj = Dense((d,), (k, dh), ("embed",), ("kv_heads", "head_dim"),
                        use_bias=cfg.qkv_bias, lora=on("k_proj"), **kw)
    self.v_proj = Dense((d,), (k, dh), ("embed",), ("kv_heads", "head_dim"),
                        use_bias=cfg.qkv_bias, lora=on("v_proj"), **kw)
    self.o_proj = Dense((h, dh), (d,), ("q_heads", "head_dim"), ("embed",),
                        use_bias=False, lora=on("o_proj"), **kw)
    self.num_kv_heads, self.num_groups = k, cfg.num_groups
    self.dtype = cfg.jnp_dtype

  def __call__(self, x_BxTxD, cos, sin, mask_BxTxS, kv=None, cache_index=None):
    """mask_BxTxS: True where query t may attend key s.

    Without a cache the keys are this call's tokens [B, S, K, Dh] (S == T). With kv (a
    `LayerKV`) this call's keys/values are written at slots cache_index .. cache_index+T-1
    first and attention reads the layer's cache [B, K, S, Dh]; the updated view is returned.
    """
    q = apply_rope(self.q_proj(x_BxTxD), cos, sin)
    k = apply_rope(self.k_proj(x_BxTxD), cos, sin)
    v = self.v_proj(x_BxTxD)
    keys = "bskd"  # the layout of k and v below
    if kv is not None:
      kv = kv.write(k.swapaxes(1, 2), v.swapaxes(1, 2), cache_index)
      (k, v), keys = kv.read(), "bksd"
    b, t = q.shape[:2]
    q = q.reshape(b, t, self.num_kv_heads, self.num_groups, q.shape[-1])
    if t == 1 and kv is not None:
      out = decode_attention(q[:, 0], k, v, mask_BxTxS[:, 0], self.dtype)
      return self.o_proj(out.reshape(b, 1, -1, out.shape[-1])), kv
    scores = jnp.einsum(f"btkgd,{keys}->bkgts", q, k.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    scores = jnp.where(mask_BxTxS[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    out = jnp.einsum(f"bkgts,{keys}->btkgd", probs, v.astype(self.dtype))
    out = out.reshape(b, t, -1, out.shape[-1])
    return self.o_proj(out), kv


def decode_attention(q_BxKxGxDh, k_BxKxSxDh, v_BxKxSxDh, mask_BxS, dtype):
  """One query per row over a KV cache [B, K, S, Dh]: the output [B, K, G, Dh].

  The general path's softmax attention for T = 1: two matmuls batched over (B, K), the
  cache's leading axes, so they read it in place. (With the cache [B, S, K, Dh] XLA CPU
  either transposed it at every token or, written as broadcast products, ran loop
  reductions that took most of a decode step at the tiny shape.)
  """
  scores_BxKxGxS = jnp.einsum("bkgd,bksd->bkgs", q_BxKxGxDh, k_BxKxSxDh.astype(dtype),
                              preferred_element_type=jnp.float32)
  scores_BxKxGxS = scores_BxKxGxS / math.sqrt(q_BxKxGxDh.shape[-1])
  scores_BxKxGxS = jnp.where(mask_BxS[:, None, None], scores_BxKxGxS, _MASK_VALUE)
  probs_BxKxGxS = jax.nn.softmax(scores_BxKxGxS, axis=-1).astype(dtype)
  return jnp.einsum("bkgs,bksd->bkgd", probs_BxKxGxS, v_BxKxSxDh.astype(dtype))


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    kw = dict(cfg=cfg, use_bias=False, rngs=rngs)
    on = cfg.lora.on
    self.gate_proj = Dense((d,), (f,), ("embed",), ("mlp",), lora=on("gate_proj"), **kw)
    self.up_proj = Dense((d,), (f,), ("embed",), ("mlp",), lora=on("up_proj"), **kw)
    self.down_proj = Dense((f,), (d,), ("mlp",), ("embed",), lora=on("down_proj"), **kw)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg)
    self.self_attn = Attention(cfg, rngs)
    self.post_attention_layernorm = RMSNorm(cfg)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, cos, sin, mask, kv=None, cache_index=None):
    attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv,
                              cache_index)
    x = x + attn
    x = x + self.mlp(self.post_attention_layernorm(x))
    return x, kv


class Embedding(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.embedding = _param(
        nnx.initializers.normal(stddev=0.02)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size),
            cfg.jnp_param_dtype), ("vocab", "embed"))


def _run_layer(layer, x, cos, sin, mask, kv, cache_index):
  return layer(x, cos, sin, mask, kv, cache_index)


def _run_layer_remat(layer, x, cos, sin, mask, kv, cache_index):
  """The layer under jax.checkpoint as a pure function of its parameters: its activations
  are recomputed in the backward pass. (nnx.remat writes back into the module's
  Variables, which fails when they were made at another trace level: a KL reference
  merged outside a value_and_grad, a model read by lax.scan's micro-batches.)"""
  del kv, cache_index  # the cached path never rematerialises
  graphdef, state = nnx.split(layer)

  def pure(state, x, cos, sin, mask):
    return nnx.merge(graphdef, state)(x, cos, sin, mask)[0]

  return jax.checkpoint(pure)(state, x, cos, sin, mask), None


def stack_layers(layers: Sequence[DecoderLayer]) -> DecoderLayer:
  """One DecoderLayer holding the parameters of `layers` stacked on a new leading axis,
  named "layers" in each parameter's logical axes (replicated by every rules table)."""
  graphdef, _ = nnx.split(layers[0])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.split(l)[1] for l in layers])
  module = nnx.merge(graphdef, stacked)
  for _, var in nnx.to_flat_state(nnx.state(module)):
    axes = var.get_metadata().get("out_sharding") or ()
    var.set_metadata(out_sharding=("layers",) + tuple(axes))
  return module


def _scan_remat(fn):
  # prevent_cse=False: inside a scan the common-subexpression hazard jax.checkpoint
  # guards against cannot arise, and keeping it would block XLA's fusion (jax docs).
  return jax.checkpoint(fn, prevent_cse=False)


class Decoder(nnx.Module):
  """The policy model: tokens -> float32 logits, plain or with a KV cache."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed_tokens = Embedding(cfg, rngs)
    # Made one by one from the same stream either way: scanned or not, a seed gives the
    # same weights.
    layers = [DecoderLayer(cfg, rngs) for _ in range(cfg.num_layers)]
    self.layers = stack_layers(layers) if cfg.scan_layers else nnx.List(layers)
    self.norm = RMSNorm(cfg)
    self.lm_head = None if cfg.tie_embeddings else Dense(
        (cfg.hidden_size,), (cfg.vocab_size,), ("embed",), ("vocab",),
        cfg=cfg, use_bias=False, rngs=rngs)

  def __call__(self, tokens_BxT: jax.Array, *,
               positions_BxT: jax.Array | None = None,
               attention_mask_BxT: jax.Array | None = None,
               logit_positions_BxK: jax.Array | None = None) -> jax.Array:
    """Causal forward pass; attention_mask_BxT is 1 on real tokens, 0 on pads.

    Works for left and right padding: keys on pads are masked, and positions
    default to cumsum(mask) - 1 so a padded row gives the same logits on its
    real tokens as the unpadded row. Logits on pad slots are meaningless.
    Returns logits [B, T, V] in float32, or [B, K, V] at logit_positions_BxK
    only: an RL row's loss covers a few action tokens after a long prompt, and
    the vocabulary projection and softmax then cost K/T of the full ones.
    """
    return self._logits(self.hidden_states(
        tokens_BxT, positions_BxT=positions_BxT, attention_mask_BxT=attention_mask_BxT,
        at_BxK=logit_positions_BxK))

  def hidden_states(self, tokens_BxT: jax.Array, *,
                    positions_BxT: jax.Array | None = None,
                    attention_mask_BxT: jax.Array | None = None,
                    segment_ids_BxT: jax.Array | None = None,
                    at_BxK: jax.Array | None = None) -> jax.Array:
    """The last layer's output after the final norm, [B, T, D] (or [B, K, D] at
    positions at_BxK), in the compute dtype: what the LM head reads, and what a
    value or progress head on top of the policy reads (SPA-RL's estimator).

    segment_ids_BxT (packed rows, csa_jax/update/data.py): a query attends only keys of its
    own segment (a block-diagonal causal mask); pass positions that restart per segment.
    """
    if attention_mask_BxT is None:
      attention_mask_BxT = jnp.ones(tokens_BxT.shape, jnp.int32)
    valid_BxT = attention_mask_BxT.astype(bool)
    if positions_BxT is None:
      positions_BxT = default_positions(attention_mask_BxT)
    t = tokens_BxT.shape[1]
    causal_TxT = jnp.tril(jnp.ones((t, t), bool))
    mask_BxTxT = causal_TxT[None] & valid_BxT[:, None, :]
    if segment_ids_BxT is not None:
      mask_BxTxT &= segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
    x, _ = self._layers(tokens_BxT, positions_BxT, mask_BxTxT, None, None)
    if at_BxK is not None:
      x = jnp.take_along_axis(x, at_BxK[..., None].astype(jnp.int32), axis=1)
    return x

  def hidden_states_prefixed(self, prefix_1xP: jax.Array, tokens_BxS: jax.Array, *,
                             attention_mask_BxS: jax.Array | None = None,
                             at_BxK: jax.Array | None = None) -> jax.Array:
    """`hidden_states` of B right-padded rows that all start with the P tokens prefix_1xP,
    given what follows it (tokens_BxS): [B, S, D], or [B, K, D] at positions at_BxK of S.
    The prefix goes through the layers once and every row attends to its keys/values (the
    sampler's shared prefill, here under a gradient, which reaches the parameters through
    both passes): the same numbers up to float rounding for (B - 1) x P fewer tokens."""
    p, (b, s) = prefix_1xP.shape[1], tokens_BxS.shape
    if attention_mask_BxS is None:
      attention_mask_BxS = jnp.ones(tokens_BxS.shape, jnp.int32)
    causal_1xPxP = jnp.tril(jnp.ones((p, p), bool))[None]
    _, prefix_kv = self._layers_after(prefix_1xP, jnp.arange(p)[None], causal_1xPxP, None,
                                      keep_kv=True)
    # Slot j < P holds prefix token j, slot P + j the row's token j; query q sits at P + q.
    positions_BxS = p + default_positions(attention_mask_BxS)
    causal_SxPS = jnp.arange(p + s)[None, :] <= p + jnp.arange(s)[:, None]
    valid_BxPS = jnp.concatenate([jnp.ones((b, p), bool), attention_mask_BxS.astype(bool)], 1)
    x, _ = self._layers_after(tokens_BxS, positions_BxS, causal_SxPS[None] & valid_BxPS[:, None],
                              prefix_kv, keep_kv=False)
    if at_BxK is not None:
      x = jnp.take_along_axis(x, at_BxK[..., None].astype(jnp.int32), axis=1)
    return x

  def forward_cached(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
                     cache: KVCache, cache_index: jax.Array,
                     kv_mask_BxS: jax.Array, *, last_only: bool = False
                     ) -> tuple[jax.Array, KVCache]:
    """Forward over tokens written at cache slots cache_index .. +T-1.

    cache_index is one (traced) int for the whole batch, so prompts must be
    left-padded (the sampler does that). kv_mask_BxS is True on cache slots
    holding real tokens, including this call's slots. Query slot q attends
    slot s iff s <= q and kv_mask[b, s]. Returns (logits [B,T,V] f32, cache);
    with last_only, logits [B,1,V] of the last slot alone (a prefill needs no
    more, and [B,P,V] float32 logits of a 150k vocabulary would dwarf the model).
    """
    t, s = tokens_BxT.shape[1], kv_mask_BxS.shape[1]
    q_slots_T = cache_index + jnp.arange(t)
    causal_TxS = jnp.arange(s)[None, :] <= q_slots_T[:, None]
    mask_BxTxS = causal_TxS[None] & kv_mask_BxS.astype(bool)[:, None, :]
    x, cache = self._layers(tokens_BxT, positions_BxT, mask_BxTxS, cache,
                            cache_index)
    return self._logits(x[:, -1:] if last_only else x), cache

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """Zero KV cache of max_len slots (prompt + new tokens)."""
    c = self.cfg
    shape = cache_shape(c, batch_size, max_len)
    if c.scan_layers:
      zeros = jnp.zeros((c.num_layers,) + shape, c.jnp_dtype)
      return KVCache(k=zeros, v=zeros)
    zeros = tuple(jnp.zeros(shape, c.jnp_dtype) for _ in range(c.num_layers))
    return KVCache(k=zeros, v=zeros)

  def _embed(self, tokens_BxT, positions_BxT):
    """(the token embeddings in the compute dtype, rotary cos, sin) of the layers' input."""
    x = jnp.take(self.embed_tokens.embedding[...], tokens_BxT, axis=0)
    x = x.astype(self.cfg.jnp_dtype)
    c = self.cfg
    # A trace-time NumPy constant, not state.
    inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
    cos, sin = rope_cos_sin(positions_BxT, inv_freq)
    return x, cos, sin

  def _layers(self, tokens_BxT, positions_BxT, mask, cache, cache_index):
    x, cos, sin = self._embed(tokens_BxT, positions_BxT)
    c = self.cfg
    if c.scan_layers:
      x, new_cache = self._scan(x, cos, sin, mask, cache, cache_index)
      return self.norm(x), new_cache
    # Remat trades activations for recomputation in a backward pass; the cached
    # (sampling) path has none.
    run = _run_layer_remat if self.cfg.remat and cache is None else _run_layer
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      kv = None if cache is None else LayerKV(cache.k[i], cache.v[i])
      x, kv = run(layer, x, cos, sin, mask, kv, cache_index)
      if kv is not None:
        new_k.append(kv.k)
        new_v.append(kv.v)
    x = self.norm(x)
    new_cache = None if cache is None else KVCache(k=tuple(new_k),
                                                   v=tuple(new_v))
    return x, new_cache

  def _scan(self, x, cos, sin, mask, cache, cache_index):
    """The stacked layers as one lax.scan (see the module docstring)."""
    graphdef, state = nnx.split(self.layers)
    if cache is None:
      def body(x, layer_state):
        return nnx.merge(graphdef, layer_state)(x, cos, sin, mask)[0], None

      x, _ = jax.lax.scan(_scan_remat(body) if self.cfg.remat else body, x, state)
      return x, None

    # The stacked cache rides in the carry and each layer writes its new slots into it in
    # place (LayerKV); as a scanned output it would be a fresh copy.
    def cached_body(carry, xs):
      x, k_all, v_all = carry
      layer_state, i = xs
      x, kv = nnx.merge(graphdef, layer_state)(x, cos, sin, mask, LayerKV(k_all, v_all, i),
                                               cache_index)
      return (x, kv.k, kv.v), None

    (x, k_all, v_all), _ = jax.lax.scan(
        cached_body, (x, cache.k, cache.v), (state, jnp.arange(self.cfg.num_layers)))
    return x, KVCache(k=k_all, v=v_all)

  def _layers_after(self, tokens_BxT, positions_BxT, mask_BxTxS, prefix_kv, *, keep_kv):
    """(x after the final norm, with keep_kv each layer's keys/values as a KVCache) of
    tokens after a prefix: each layer attends through the cached path over S = P + T fresh
    slots, the prefix's keys/values (prefix_kv, one row: [1, K, P, Dh] a layer; None: P =
    0) shared by every row, then its own. Under a gradient, unlike the sampler's: a layer's
    cache is its own (scanned, xs and ys: in the carry, the backward pass would keep the
    whole stack for every layer), and layers are rematerialised as cfg.remat says."""
    x, cos, sin = self._embed(tokens_BxT, positions_BxT)
    c, (b, t) = self.cfg, tokens_BxT.shape
    p = 0 if prefix_kv is None else prefix_kv.k[0].shape[-2]
    empty_BxKxTxDh = jnp.zeros(cache_shape(c, b, t), c.jnp_dtype)

    def slots(prefix_1xKxPxDh):  # one layer's cache: the prefix (every row's), T empty slots
      if prefix_1xKxPxDh is None:
        return empty_BxKxTxDh
      every_row = jnp.broadcast_to(prefix_1xKxPxDh, (b,) + prefix_1xKxPxDh.shape[1:])
      return jnp.concatenate([every_row, empty_BxKxTxDh], axis=2)

    def layer_fn(graphdef):
      def run(state, x, k, v):
        x, kv = nnx.merge(graphdef, state)(x, cos, sin, mask_BxTxS,
                                           LayerKV(slots(k), slots(v)), p)
        return x, ((kv.k, kv.v) if keep_kv else None)
      return run

    if c.scan_layers:
      graphdef, state = nnx.split(self.layers)
      run = layer_fn(graphdef)
      body = lambda x, xs: run(xs[0], x, *xs[1:])  # xs: (a layer's state, its prefix k, v)
      prefix = (None, None) if prefix_kv is None else (prefix_kv.k, prefix_kv.v)
      x, kv = jax.lax.scan(_scan_remat(body) if c.remat else body, x, (state, *prefix))
    else:
      kvs = []
      for i, layer in enumerate(self.layers):
        graphdef, state = nnx.split(layer)
        run = jax.checkpoint(layer_fn(graphdef)) if c.remat else layer_fn(graphdef)
        x, kv = run(state, x, *((None, None) if prefix_kv is None else
                                (prefix_kv.k[i], prefix_kv.v[i])))
        kvs.append(kv)
      kv = tuple(zip(*kvs)) if keep_kv else None  # ((k of each layer), (v of each layer))
    return self.norm(x), (KVCache(k=kv[0], v=kv[1]) if keep_kv else None)

  def logits(self, x_BxTxD: jax.Array) -> jax.Array:
    """The LM head on hidden states of `hidden_states` (any leading shape [..., D])."""
    return self._logits(x_BxTxD)

  def _logits(self, x_BxTxD):
    # float32 accumulation: log-probs of sampled tokens feed the PPO ratio.
    dtype = self.cfg.jnp_dtype
    if self.lm_head is None:
      w_VxD = self.embed_tokens.embedding[...].astype(dtype)
      return jnp.einsum("btd,vd->btv", x_BxTxD.astype(dtype), w_VxD,
                        preferred_element_type=jnp.float32)
    w_DxV = self.lm_head.kernel[...].astype(dtype)
    return jnp.einsum("btd,dv->btv", x_BxTxD.astype(dtype), w_DxV,
                      preferred_element_type=jnp.float32)


def default_positions(attention_mask_BxT: jax.Array) -> jax.Array:
  """cumsum(mask) - 1, clipped at 0: position 0 is each row's first token."""
  mask = attention_mask_BxT.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)


def token_logprobs(logits_BxTxV: jax.Array, targets_BxT: jax.Array
                   ) -> jax.Array:
  """log softmax(logits)[target] in float32, [B, T]."""
  logp = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, targets_BxT[..., None].astype(jnp.int32),
                             axis=-1)[..., 0]
