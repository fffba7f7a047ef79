"""Batched autoregressive sampling with a KV cache: prefill + decode in one jit.

The loop follows the usual JAX LLM samplers (MaxText / Tunix / gemma's
sampler): the prompt batch is left-padded to a static length P, one prefill
pass fills the cache, then `lax.while_loop`s decode one token per step and exit
early once every row has emitted a stop token. The decode runs in segments of
`decode_segment` steps, each with a cache just long enough for the prompt and
the tokens up to its end, so attention reads the filled part of the cache (up
to a segment's slack) instead of all P + N slots; the last token is drawn
without a forward pass. Identical prompt rows share one prefill
(`prefill_groups`). Everything is compiled once per (B, P, N, SamplingConfig,
decode_segment, model structure), plus once per number of distinct prompts
rounded up to a power of two.

Log-probs (a documented choice). `logprobs_BxN` is the log-probability of each
sampled token under the distribution it was actually drawn from: the model's
logits divided by the temperature, restricted to the top-k / top-p set and
renormalised. With temperature 1 and no truncation this is the raw model
distribution; with `greedy=True` it is the raw model distribution (log softmax
of the untempered logits). The update's importance ratio must use the same
transform: `sampling_logprobs(logits, targets, cfg)` applies it to
teacher-forced logits. Under truncation a token outside the new policy's
top-k/top-p set gets -inf, so for RL prefer temperature-only sampling.

Padding: prompts may be left- or right-padded (each row's real tokens must be
one contiguous run); they are moved to left padding inside the jit. Use
`left_pad` to build a bucketed batch from token lists so few shapes compile.
Stop strings are host-side: `truncate_at_stop` on the decoded text.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model.decoder import Decoder, default_positions, token_logprobs
from csa_jax.model.kv_cache import CACHE_AXES, cache_batch_axis, cache_shape, cache_shardings


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """max_new_tokens N; temperature > 0; top_p in (0, 1] (1 = off); top_k >= 0
  (0 = off); greedy = argmax; stop_token_ids end a row (the stop token is kept
  and counted in the mask)."""
  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = False
  stop_token_ids: tuple[int, ...] = ()

  def __post_init__(self):
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
      raise ValueError(f"SamplingConfig.max_new_tokens must be a positive int, "
                       f"got {self.max_new_tokens!r}")
    if not self.temperature > 0:
      raise ValueError(f"SamplingConfig.temperature must be > 0 (use "
                       f"greedy=True for argmax), got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p must be in (0, 1], "
                       f"got {self.top_p}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k must be an int >= 0 (0 = off), "
                       f"got {self.top_k!r}")
    object.__setattr__(self, "stop_token_ids",
                       tuple(int(t) for t in self.stop_token_ids))


@flax.struct.dataclass
class SampleOutput:
  """tokens_BxN (pad_id after the stop), logprobs_BxN (0 after the stop),
  mask_BxN (1 on generated tokens up to and including the stop token),
  lengths_B (= mask_BxN.sum(1))."""
  tokens_BxN: jax.Array
  logprobs_BxN: jax.Array
  mask_BxN: jax.Array
  lengths_B: jax.Array


def transform_logits(logits_xV: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """Logits of the sampling distribution: / temperature, top-k, then top-p.

  Entries outside the kept set are -inf. Ties at the top-k threshold are all
  kept. Top-p keeps the smallest prefix of the sorted distribution whose
  mass reaches top_p (always at least the most likely token).
  """
  logits = logits_xV.astype(jnp.float32) / cfg.temperature
  if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if cfg.top_p < 1.0:
    sorted_desc = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.sum(mass_before < cfg.top_p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(sorted_desc, n_keep - 1, axis=-1)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def sampling_logprobs(logits_BxTxV: jax.Array, targets_BxT: jax.Array,
                      cfg: SamplingConfig) -> jax.Array:
  """Teacher-forced log-probs under the same distribution `sample` reports."""
  if cfg.greedy:
    return token_logprobs(logits_BxTxV, targets_BxT)
  return token_logprobs(transform_logits(logits_BxTxV, cfg), targets_BxT)


def _draw(logits_BxV, key, cfg: SamplingConfig):
  if cfg.greedy:
    tok_B = jnp.argmax(logits_BxV, axis=-1)
    dist = logits_BxV
  else:
    dist = transform_logits(logits_BxV, cfg)
    tok_B = jax.random.categorical(key, dist, axis=-1)
  tok_B = tok_B.astype(jnp.int32)
  logp_B = token_logprobs(dist[:, None], tok_B[:, None])[:, 0]
  return tok_B, logp_B


def to_left_padding(tokens_BxP, mask_BxP, pad_id):
  """Moves each row's contiguous run of real tokens to the right end."""
  p = tokens_BxP.shape[1]
  mask = mask_BxP.astype(jnp.int32)
  n_B = mask.sum(1)
  start_B = jnp.argmax(mask, axis=1)
  j_P = jnp.arange(p)
  src_BxP = j_P[None] - (p - n_B)[:, None] + start_B[:, None]
  valid_BxP = j_P[None] >= (p - n_B)[:, None]
  moved = jnp.take_along_axis(tokens_BxP, jnp.clip(src_BxP, 0, p - 1), axis=1)
  return (jnp.where(valid_BxP, moved, pad_id).astype(jnp.int32),
          valid_BxP.astype(jnp.int32))


@flax.struct.dataclass
class _Loop:
  step: jax.Array
  cache: object
  kv_mask_BxS: jax.Array
  logits_BxV: jax.Array
  tokens_BxN: jax.Array
  logprobs_BxN: jax.Array
  mask_BxN: jax.Array
  done_B: jax.Array


def _prefill(model, tokens_BxP, positions_BxP, kv_mask_BxS, s, chunk, start=None):
  """Logits of each row's last prompt slot [B, 1, V] and the filled cache of S slots.

  With `chunk` (< B, dividing it) the rows go through in B / chunk passes one after
  another (lax.map): a prompt's attention scores are [P, S] per head, so the prefill's
  temporaries scale with the rows in flight. Pass k takes rows k, k + C, ... (C passes),
  so every pass keeps the batch's sharding over 'data'.

  start: (cache of one row with slots 0 .. l-1 filled, l): every row's cache starts as a
  copy of it (a shared prefix, `_prefix_cache`) and the tokens go to slots l .. S-1."""
  b = tokens_BxP.shape[0]
  ax = cache_batch_axis(model.cfg)

  def first_cache(n):
    if start is None:
      return model.init_cache(n, s)
    return jax.tree.map(lambda c: jnp.repeat(c, n, axis=c.ndim - 4), start[0])

  index = 0 if start is None else start[1]
  if not chunk or chunk >= b:
    return model.forward_cached(tokens_BxP, positions_BxP, first_cache(b), index,
                                kv_mask_BxS, last_only=True)
  if b % chunk:
    raise ValueError(f"prefill_chunk {chunk} does not divide the batch of {b} prompts")
  c = b // chunk
  split = lambda x: jnp.moveaxis(x.reshape(chunk, c, *x.shape[1:]), 1, 0)
  merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, *x.shape[2:])
  # lax.map stacks each pass's cache on a new axis 0 (before the batch axis `ax`).

  def merge_cache(x):  # [c, ..., chunk (at ax + 1), ...] -> [..., b (at ax), ...]
    x = jnp.moveaxis(x, 0, ax + 1)
    return x.reshape(*x.shape[:ax], b, *x.shape[ax + 2:])

  def one(args):
    tok, pos, kvm = args
    return model.forward_cached(tok, pos, first_cache(chunk), index, kvm, last_only=True)

  logits, cache = jax.lax.map(one, (split(tokens_BxP), split(positions_BxP),
                                    split(kv_mask_BxS)))
  return merge(logits), jax.tree.map(merge_cache, cache)


def decode_segments(n: int, segment: int) -> tuple[int, ...]:
  """Ends of the decode segments of `segment` steps over n new tokens (0: one)."""
  if segment <= 0 or segment >= n:
    return (n,)
  return tuple(range(segment, n, segment)) + (n,)


def _grow(x, slots, axis):
  """Appends `slots` zero slots along `axis`."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, slots)
  return jnp.pad(x, pad)


# A KV cache leaf is [..., B, K, S, Dh] (a leading layer axis when the layers are stacked),
# so its batch and slot axes count from the end.
def _cache_rows(c, index_B):
  return jnp.take(c, index_B, axis=c.ndim - 4)


def _cache_grow(c, slots):
  return _grow(c, slots, c.ndim - 2)


def prefill_groups(tokens_BxP: np.ndarray, mask_BxP: np.ndarray, chunk: int = 0
                   ) -> tuple[np.ndarray, np.ndarray] | None:
  """Rows to prefill and, per row, which of them holds its cache; None: no saving.

  Identical prompt rows (the G rollouts of a task start from one prompt; the rows that
  policy.SamplerPolicy adds to reach its row bucket repeat one) need one prefill between
  them. Returns (rows_U, index_B): rows_U
  indexes the batch's rows to prefill, index_B the entry of rows_U whose cache row b
  takes. U is rounded up to a power of two (repeating a row) so few shapes compile, and
  to a multiple of `chunk`; None when that leaves U no smaller than B.
  """
  b = mask_BxP.shape[0]
  key = np.concatenate([np.where(mask_BxP > 0, tokens_BxP, 0), mask_BxP], 1)
  _, first_U, index_B = np.unique(key, axis=0, return_index=True, return_inverse=True)
  u = 1 << int(len(first_U) - 1).bit_length()
  if chunk and u > chunk:
    u = -(-u // chunk) * chunk
  if u >= b:
    return None
  rows_U = np.concatenate([first_U, np.full(u - len(first_U), first_U[0])])
  return rows_U.astype(np.int32), index_B.reshape(b).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg", "pad_id",
                                              "cache_sharding", "prefill_chunk",
                                              "decode_segment"))
def _sample_jit(graphdef, state, tokens_BxW, mask_BxW, rng, groups=None, prefix_1xL=None, *,
                cfg, pad_id, cache_sharding, prefill_chunk=0, decode_segment=0):
  """tokens_BxW / mask_BxW: the prompts, or with prefix_1xL (a prefix every prompt starts
  with, `split_prefix`) what follows it in each."""
  model = nnx.merge(graphdef, state)
  b, w = tokens_BxW.shape
  n = cfg.max_new_tokens
  tokens_BxW, mask_BxW = to_left_padding(tokens_BxW, mask_BxW, pad_id)
  constrain = ((lambda c: jax.lax.with_sharding_constraint(c, cache_sharding))
               if cache_sharding is not None else (lambda c: c))
  # The cache holds only the slots written so far plus the current segment's: attention
  # at step i reads p + (end of i's segment) slots, not p + n - 1. The prefill's cache is
  # the prompt's p slots (the shared prefix's l, then the rest's w); each segment appends
  # its slots before its loop starts.
  l = 0 if prefix_1xL is None else prefix_1xL.shape[1]
  p = l + w
  start = None
  if l:  # the prefix goes through the model once; every row's cache starts with its slots
    _, cache_1 = model.forward_cached(prefix_1xL, jnp.arange(l)[None], model.init_cache(1, p),
                                      0, jnp.ones((1, p), jnp.int32), last_only=True)
    start = (cache_1, l)
  positions_BxW = l + default_positions(mask_BxW)
  mask_BxP = jnp.concatenate([jnp.ones((b, l), jnp.int32), mask_BxW], 1)
  if groups is None:
    logits_Bx1xV, cache = _prefill(model, tokens_BxW, positions_BxW, mask_BxP, p,
                                   prefill_chunk, start)
  else:  # (rows_U, index_B) of `prefill_groups`: identical rows share one prefill
    rows_U, index_B = groups
    logits_Ux1xV, cache = _prefill(model, tokens_BxW[rows_U], positions_BxW[rows_U],
                                   mask_BxP[rows_U], p, prefill_chunk, start)
    logits_Bx1xV = logits_Ux1xV[index_B]
    cache = jax.tree.map(lambda c: _cache_rows(c, index_B), cache)
  first_pos_B = l + mask_BxW.sum(1)  # position of the first generated token
  stop_ids = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)

  def draw(s: _Loop) -> tuple[_Loop, jax.Array]:
    """Token s.step of every row from s.logits_BxV (pad after a row's stop)."""
    tok_B, logp_B = _draw(s.logits_BxV, jax.random.fold_in(rng, s.step), cfg)
    live_B = ~s.done_B
    tok_B = jnp.where(live_B, tok_B, pad_id)
    logp_B = jnp.where(live_B, logp_B, 0.0)
    return s.replace(
        step=s.step + 1,
        tokens_BxN=s.tokens_BxN.at[:, s.step].set(tok_B),
        logprobs_BxN=s.logprobs_BxN.at[:, s.step].set(logp_B),
        mask_BxN=s.mask_BxN.at[:, s.step].set(live_B.astype(jnp.int32)),
        done_B=s.done_B | (live_B & jnp.isin(tok_B, stop_ids))), tok_B

  def body(s: _Loop) -> _Loop:
    i = s.step
    s, tok_B = draw(s)
    kv_mask = s.kv_mask_BxS.at[:, p + i].set(1)
    logits, cache = model.forward_cached(
        tok_B[:, None], (first_pos_B + i)[:, None], s.cache, p + i, kv_mask)
    return s.replace(cache=constrain(cache), kv_mask_BxS=kv_mask, logits_BxV=logits[:, -1])

  state = _Loop(
      step=jnp.asarray(0, jnp.int32), cache=cache, kv_mask_BxS=mask_BxP,
      logits_BxV=logits_Bx1xV[:, -1],
      tokens_BxN=jnp.full((b, n), pad_id, jnp.int32),
      logprobs_BxN=jnp.zeros((b, n), jnp.float32),
      mask_BxN=jnp.zeros((b, n), jnp.int32),
      done_B=jnp.zeros((b,), bool))
  # Steps 0 .. n-2 draw a token and feed it back; the last token needs no forward pass.
  begin = 0
  for end in (decode_segments(n - 1, decode_segment) if n > 1 else ()):
    state = state.replace(
        cache=constrain(jax.tree.map(lambda c, k=end - begin: _cache_grow(c, k),
                                     state.cache)),
        kv_mask_BxS=_grow(state.kv_mask_BxS, end - begin, 1))
    state = jax.lax.while_loop(
        lambda s, end=end: (s.step < end) & ~jnp.all(s.done_B), body, state)
    begin = end
  # After an early exit (every row stopped) this writes what is already there: pad, 0, 0.
  state, _ = draw(state)
  return SampleOutput(tokens_BxN=state.tokens_BxN,
                      logprobs_BxN=state.logprobs_BxN, mask_BxN=state.mask_BxN,
                      lengths_B=state.mask_BxN.sum(1))


def sample(model: Decoder, prompt_tokens_BxP, prompt_mask_BxP, *,
           rng: jax.Array, cfg: SamplingConfig, pad_id: int,
           mesh: Mesh | None = None,
           rules: mesh_lib.Rules = mesh_lib.SAMPLE_RULES,
           prefill_chunk: int = 0, decode_segment: int = 32,
           share_prefill: bool = True, share_prefix: bool = False) -> SampleOutput:
  """Samples up to cfg.max_new_tokens tokens after each prompt row.

  prompt_mask_BxP is 1 on real prompt tokens (left or right padded, at least
  one per row). With a mesh, the batch is sharded over 'data' and the KV cache
  by `rules`; place the model first with `mesh.shard_model(model, mesh,
  SAMPLE_RULES)`. Uses the functional NNX pattern (nnx.split outside,
  nnx.merge inside one jax.jit). prefill_chunk: prompt rows per prefill pass (0: all
  at once); it bounds the prefill's memory, not its result. decode_segment: new tokens
  per decode segment (0: one segment); a step attends over the prompt and the slots up to
  the end of its segment only, so shorter segments read less cache per token but add a
  compiled loop (and a cache copy) each; it does not change the result. share_prefill:
  identical prompt rows are prefilled once and their cache rows copied
  (`prefill_groups`); it does not change the result either. share_prefix: the prefix every
  prompt row starts with (a chat template's header and system message, a task line), in
  whole blocks of `split_prefix`, goes through the model once and its cache slots are
  copied to every row; the same numbers up to float rounding (the prefix's keys are
  computed in a batch of one row).
  """
  mask_np = np.asarray(prompt_mask_BxP)
  if mask_np.ndim != 2 or np.asarray(prompt_tokens_BxP).shape != mask_np.shape:
    raise ValueError(f"prompt tokens and mask must both be [B, P], got "
                     f"{np.shape(prompt_tokens_BxP)} and {mask_np.shape}")
  if not (mask_np.sum(1) > 0).all():
    raise ValueError("every prompt row needs at least one real token "
                     "(prompt_mask_BxP row of zeros)")
  if not isinstance(decode_segment, int) or decode_segment < 0:
    raise ValueError(f"decode_segment must be an int >= 0 (0: one segment), "
                     f"got {decode_segment!r}")
  b = mask_np.shape[0]
  if prefill_chunk and prefill_chunk < b and b % prefill_chunk:
    raise ValueError(f"prefill_chunk {prefill_chunk} does not divide the batch of {b} "
                     f"prompts")
  total = mask_np.shape[1] + cfg.max_new_tokens
  if total > model.cfg.max_seq_len:
    raise ValueError(f"prompt length {mask_np.shape[1]} + max_new_tokens "
                     f"{cfg.max_new_tokens} exceeds max_seq_len "
                     f"{model.cfg.max_seq_len}")
  tokens = jnp.asarray(prompt_tokens_BxP, jnp.int32)
  mask = jnp.asarray(mask_np, jnp.int32)
  cache_sharding = None
  if mesh is not None:
    tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
    mask = jax.device_put(mask, mesh_lib.batch_sharding(mesh))
    # The cache grows segment by segment, so its slot axis is never split (a slot axis of
    # 1 makes logical_to_spec drop any mesh axis a rule gives cache_seq).
    shape = cache_shape(model.cfg, mask_np.shape[0], 1)
    one = NamedSharding(mesh, mesh_lib.logical_to_spec(CACHE_AXES, rules,
                                                      shape, mesh))
    cache_sharding = cache_shardings(model.cfg, one)
  tokens_np, prefix = np.asarray(prompt_tokens_BxP), None
  if share_prefix:
    prefix, tokens_np, mask_np = split_prefix(tokens_np, mask_np, pad_id)
    if prefix is not None:
      tokens, mask = (jnp.asarray(tokens_np, jnp.int32), jnp.asarray(mask_np, jnp.int32))
      if mesh is not None:
        tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
        mask = jax.device_put(mask, mesh_lib.batch_sharding(mesh))
  put = (jnp.asarray if mesh is None else
         lambda g: jax.device_put(g, mesh_lib.replicated(mesh)))
  groups = prefill_groups(tokens_np, mask_np, prefill_chunk) if share_prefill else None
  if groups is not None:
    groups = tuple(put(g) for g in groups)
  if prefix is not None:
    prefix = put(prefix)
  graphdef, state = nnx.split(model)
  return _sample_jit(graphdef, state, tokens, mask, rng, groups, prefix, cfg=cfg,
                     pad_id=int(pad_id), cache_sharding=cache_sharding,
                     prefill_chunk=int(prefill_chunk),
                     decode_segment=int(decode_segment))


# A shared prefix is split off in blocks of PREFIX_BLOCK tokens, its length rounded down to
# a power-of-two number of blocks, so calls whose prompts share a little more or less text
# compile the same shapes.
PREFIX_BLOCK = 16


def split_prefix(tokens_BxP: np.ndarray, mask_BxP: np.ndarray, pad_id: int
                 ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
  """(prefix [1, l], the rest [B, P - l] left-padded, its mask): l is the longest length
  of PREFIX_BLOCK x 2^k tokens that every row's real tokens start with and that leaves
  each row at least one token of its own; (None, tokens, mask) when no block is shared."""
  rows = [t[m > 0] for t, m in zip(tokens_BxP, mask_BxP)]
  shortest = min(len(r) for r in rows)
  common = shortest - 1
  first = rows[0]
  for r in rows[1:]:
    diff = np.nonzero(r[:common] != first[:common])[0]
    common = int(diff[0]) if len(diff) else common
  if common < PREFIX_BLOCK:
    return None, tokens_BxP, mask_BxP
  l = PREFIX_BLOCK << ((common // PREFIX_BLOCK).bit_length() - 1)
  w = tokens_BxP.shape[1] - l
  tokens = np.full((len(rows), w), pad_id, np.int32)
  mask = np.zeros((len(rows), w), np.int32)
  for i, r in enumerate(rows):
    tokens[i, w - len(r) + l:] = r[l:]
    mask[i, w - len(r) + l:] = 1
  return first[None, :l].astype(np.int32), tokens, mask


def left_pad(token_lists: Sequence[Sequence[int]], pad_id: int,
             bucket: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to a multiple of `bucket` (limits recompiles).

  Returns (tokens_BxP int32, mask_BxP int32).
  """
  if not token_lists or any(len(t) == 0 for t in token_lists):
    raise ValueError("left_pad needs a non-empty list of non-empty token lists")
  if bucket <= 0:
    raise ValueError(f"left_pad bucket must be > 0, got {bucket}")
  longest = max(len(t) for t in token_lists)
  p = -(-longest // bucket) * bucket
  tokens = np.full((len(token_lists), p), pad_id, np.int32)
  mask = np.zeros((len(token_lists), p), np.int32)
  for i, toks in enumerate(token_lists):
    tokens[i, p - len(toks):] = toks
    mask[i, p - len(toks):] = 1
  return tokens, mask


def bucket_length(longest: int, budget: int, smallest: int = 16) -> int:
  """Prompt width for a batch whose longest prompt has `longest` tokens: the smallest
  power of two from `smallest` up that holds it, capped at the prompt budget. A batch of
  short prompts then prefills and attends over a short cache, and a run compiles at
  most log2(budget / smallest) + 2 prompt widths."""
  if longest <= 0 or budget <= 0:
    raise ValueError(f"bucket_length needs positive lengths, got {longest}, {budget}")
  width = max(smallest, 1 << (longest - 1).bit_length())
  return max(longest, min(width, budget))


def truncate_at_stop(text: str, stop_strings: Sequence[str]
                     ) -> tuple[str, bool]:
  """Cuts text before the earliest stop string; returns (text, stopped)."""
  cut = min((i for i in (text.find(s) for s in stop_strings if s) if i >= 0),
            default=-1)
  return (text[:cut], True) if cut >= 0 else (text, False)
