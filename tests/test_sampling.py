"""Tests for csa_jax.model.sampling: log-probs vs teacher forcing, greedy, stops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax.model import Decoder, ModelConfig, token_logprobs
from csa_jax.model.sampling import (PREFIX_BLOCK, SamplingConfig, bucket_length,
                                    decode_segments, left_pad, prefill_groups, sample,
                                    sampling_logprobs, split_prefix, transform_logits,
                                    truncate_at_stop)

V, PAD = 53, 0
ATOL_LOGP = 1e-6


@pytest.fixture(scope="module")
def model():
  return Decoder(ModelConfig.tiny(V, qkv_bias=True), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  lists = [rng.integers(1, V, n).tolist() for n in (5, 2, 7, 1)]
  return lists, left_pad(lists, PAD, bucket=8)


def _teacher_forced_logits(model, tokens_BxP, mask_BxP, out):
  """Full forward over prompt + generated tokens; logits predicting each."""
  p = tokens_BxP.shape[1]
  seq = np.concatenate([tokens_BxP, np.asarray(out.tokens_BxN)], 1)
  mask = np.concatenate([mask_BxP, np.asarray(out.mask_BxN)], 1)
  logits = jax.jit(lambda g, s, t, m: nnx.merge(g, s)(
      t, attention_mask_BxT=m))(*nnx.split(model), seq, mask)
  n = out.tokens_BxN.shape[1]
  return logits[:, p - 1:p - 1 + n]


@pytest.mark.parametrize("cfg", [
    SamplingConfig(max_new_tokens=12),
    SamplingConfig(max_new_tokens=12, temperature=0.7, top_k=5),
    SamplingConfig(max_new_tokens=12, temperature=1.3, top_p=0.8),
], ids=["raw", "temp_topk", "temp_topp"])
def test_logprobs_equal_teacher_forced(model, prompts, cfg):
  _, (tokens, mask) = prompts
  out = sample(model, tokens, mask, rng=jax.random.key(1), cfg=cfg,
               pad_id=PAD)
  logits = _teacher_forced_logits(model, tokens, mask, out)
  ref = np.asarray(sampling_logprobs(logits, out.tokens_BxN, cfg))
  m = np.asarray(out.mask_BxN) > 0
  assert m.all()  # no stop ids: every row runs the full N tokens
  np.testing.assert_allclose(np.asarray(out.logprobs_BxN)[m], ref[m],
                             atol=1e-4)
  if cfg.temperature == 1.0 and cfg.top_k == 0 and cfg.top_p == 1.0:
    raw = np.asarray(token_logprobs(logits, out.tokens_BxN))
    np.testing.assert_allclose(np.asarray(out.logprobs_BxN), raw, atol=1e-4)


def test_greedy_equals_argmax_of_repeated_full_forwards(model, prompts):
  lists, (tokens, mask) = prompts
  n = 6
  out = sample(model, tokens, mask, rng=jax.random.key(2),
               cfg=SamplingConfig(max_new_tokens=n, greedy=True), pad_id=PAD)
  # Reference: grow each sequence one argmax at a time with full forwards
  # (right-padded to one fixed length so it compiles once).
  width = max(map(len, lists)) + n
  fwd = nnx.jit(lambda m, t, k: m(t, attention_mask_BxT=k))
  for b, prompt in enumerate(lists):
    seq, logps = list(prompt), []
    for _ in range(n):
      t = np.zeros((1, width), np.int32)
      k = np.zeros((1, width), np.int32)
      t[0, :len(seq)], k[0, :len(seq)] = seq, 1
      logits = np.asarray(fwd(model, t, k))[0, len(seq) - 1].astype(
          np.float64)
      top = int(np.argmax(logits))
      logps.append(logits[top] - logits.max()
                   - np.log(np.sum(np.exp(logits - logits.max()))))
      seq.append(top)
    assert np.asarray(out.tokens_BxN)[b].tolist() == seq[len(prompt):]
    np.testing.assert_allclose(np.asarray(out.logprobs_BxN)[b], logps,
                               atol=1e-4)


def test_right_padding_gives_same_result_as_left(model, prompts):
  lists, (tokens, mask) = prompts
  right_t = np.full_like(tokens, PAD)
  right_m = np.zeros_like(mask)
  for i, toks in enumerate(lists):
    right_t[i, :len(toks)], right_m[i, :len(toks)] = toks, 1
  cfg = SamplingConfig(max_new_tokens=6, greedy=True)
  a = sample(model, tokens, mask, rng=jax.random.key(3), cfg=cfg, pad_id=PAD)
  b = sample(model, right_t, right_m, rng=jax.random.key(3), cfg=cfg,
             pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(a.tokens_BxN),
                                np.asarray(b.tokens_BxN))
  np.testing.assert_allclose(np.asarray(a.logprobs_BxN),
                             np.asarray(b.logprobs_BxN), atol=1e-5)
  # Teacher forcing straight on [right-padded prompt, generation]: the pads
  # in the middle are masked and positions skip them.
  logits = _teacher_forced_logits(model, right_t, right_m, b)
  last = right_m.sum(1) - 1  # logits predicting the first generated token
  seq = np.concatenate([right_t, np.asarray(b.tokens_BxN)], 1)
  msk = np.concatenate([right_m, np.asarray(b.mask_BxN)], 1)
  full = jax.jit(lambda g, s, t, m: nnx.merge(g, s)(
      t, attention_mask_BxT=m))(*nnx.split(model), seq, msk)
  first = token_logprobs(full[np.arange(4), last][:, None],
                         b.tokens_BxN[:, :1])[:, 0]
  np.testing.assert_allclose(np.asarray(first),
                             np.asarray(b.logprobs_BxN)[:, 0], atol=1e-4)
  rest = np.asarray(token_logprobs(logits, b.tokens_BxN))[:, 1:]
  np.testing.assert_allclose(rest, np.asarray(b.logprobs_BxN)[:, 1:],
                             atol=1e-4)


def test_stop_tokens_stop_rows_independently(model, prompts):
  _, (tokens, mask) = prompts
  n = 10
  free = sample(model, tokens, mask, rng=jax.random.key(4),
                cfg=SamplingConfig(max_new_tokens=n), pad_id=PAD)
  free_t = np.asarray(free.tokens_BxN)
  stop_ids = (int(free_t[0, 2]), int(free_t[2, 5]))
  out = sample(model, tokens, mask, rng=jax.random.key(4),
               cfg=SamplingConfig(max_new_tokens=n, stop_token_ids=stop_ids),
               pad_id=PAD)
  for b in range(free_t.shape[0]):
    hits = [j for j in range(n) if free_t[b, j] in stop_ids]
    length = hits[0] + 1 if hits else n
    assert int(out.lengths_B[b]) == length
    np.testing.assert_array_equal(np.asarray(out.mask_BxN)[b],
                                  np.arange(n) < length)
    np.testing.assert_array_equal(
        np.asarray(out.tokens_BxN)[b],
        np.where(np.arange(n) < length, free_t[b], PAD))
    np.testing.assert_allclose(
        np.asarray(out.logprobs_BxN)[b],
        np.where(np.arange(n) < length, np.asarray(free.logprobs_BxN)[b], 0.0),
        atol=1e-6)
  assert int(out.lengths_B[0]) <= 3 and int(out.lengths_B[2]) <= 6


def _np_allowed(logits_V, temperature, top_k, top_p):
  """Independent reference: the set of token ids sampling may return."""
  z = logits_V.astype(np.float64) / temperature
  order = sorted(range(len(z)), key=lambda i: -z[i])
  keep = set(range(len(z)))
  if top_k:
    keep = {i for i in keep if z[i] >= z[order[top_k - 1]]}
  if top_p < 1:
    zk = np.array([z[i] if i in keep else -np.inf for i in range(len(z))])
    probs = np.exp(zk - zk.max())
    probs /= probs.sum()
    kept, mass = set(), 0.0
    for i in sorted(keep, key=lambda i: -z[i]):
      if mass >= top_p:
        break
      kept.add(i)
      mass += probs[i]
    keep = kept
  return keep


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 3, 1.0), (0.5, 0, 0.6), (2.0, 10, 0.5)])
def test_transform_logits_keeps_exactly_the_truncation_set(
    temperature, top_k, top_p):
  logits = np.random.default_rng(5).standard_normal((6, V)).astype(np.float32)
  cfg = SamplingConfig(max_new_tokens=1, temperature=temperature,
                       top_k=top_k, top_p=top_p)
  for fn in (transform_logits, jax.jit(transform_logits, static_argnums=1)):
    got = np.asarray(fn(jnp.asarray(logits), cfg))
    for row in range(6):
      assert set(np.flatnonzero(np.isfinite(got[row]))) == _np_allowed(
          logits[row], temperature, top_k, top_p)


def test_sampled_tokens_respect_top_k_and_top_p(model, prompts):
  _, (tokens, mask) = prompts
  for cfg in (SamplingConfig(max_new_tokens=10, top_k=2),
              SamplingConfig(max_new_tokens=10, top_p=0.3)):
    out = sample(model, tokens, mask, rng=jax.random.key(6), cfg=cfg,
                 pad_id=PAD)
    logits = np.asarray(_teacher_forced_logits(model, tokens, mask, out))
    toks = np.asarray(out.tokens_BxN)
    for b in range(toks.shape[0]):
      for j in range(toks.shape[1]):
        assert toks[b, j] in _np_allowed(logits[b, j], 1.0, cfg.top_k,
                                         cfg.top_p)


def test_compiles_once_per_shape(model, prompts):
  from csa_jax.model import sampling
  _, (tokens, mask) = prompts
  cfg = SamplingConfig(max_new_tokens=4)
  sample(model, tokens, mask, rng=jax.random.key(0), cfg=cfg, pad_id=PAD)
  before = sampling._sample_jit._cache_size()
  sample(model, tokens[::-1], mask[::-1], rng=jax.random.key(9), cfg=cfg,
         pad_id=PAD)
  assert sampling._sample_jit._cache_size() == before


def test_bf16_sampling_runs():
  m = Decoder(ModelConfig.tiny(V, dtype="bfloat16", param_dtype="bfloat16"),
              rngs=nnx.Rngs(0))
  tokens, mask = left_pad([[1, 2, 3], [4]], PAD, bucket=4)
  out = sample(m, tokens, mask, rng=jax.random.key(0),
               cfg=SamplingConfig(max_new_tokens=5), pad_id=PAD)
  assert out.logprobs_BxN.dtype == jnp.float32
  assert np.isfinite(np.asarray(out.logprobs_BxN)).all()
  assert ((np.asarray(out.tokens_BxN) >= 0)
          & (np.asarray(out.tokens_BxN) < V)).all()


def test_a_remat_model_samples_what_the_same_model_without_remat_samples(prompts):
  """Full-size configs rematerialise layers for the backward pass; the sampler's cached
  path must still run (nnx.remat inside its while_loop failed) and agree exactly."""
  cfg = ModelConfig.tiny(V, qkv_bias=True)
  plain = Decoder(cfg, rngs=nnx.Rngs(0))
  remat = Decoder(cfg.replace(remat=True), rngs=nnx.Rngs(0))
  _, (tokens, mask) = prompts
  scfg = SamplingConfig(max_new_tokens=6)
  got = sample(remat, tokens, mask, rng=jax.random.key(3), cfg=scfg, pad_id=PAD)
  want = sample(plain, tokens, mask, rng=jax.random.key(3), cfg=scfg, pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(got.logprobs_BxN), np.asarray(want.logprobs_BxN))
  # (Its gradients under remat: tests/test_model.py, test_remat_gives_same_gradients.)


@pytest.mark.parametrize("chunk", [1, 2])
def test_chunked_prefill_samples_what_one_prefill_samples(model, prompts, chunk):
  _, (tokens, mask) = prompts
  for scfg in (SamplingConfig(max_new_tokens=5, greedy=True), SamplingConfig(max_new_tokens=5)):
    got = sample(model, tokens, mask, rng=jax.random.key(1), cfg=scfg, pad_id=PAD,
                 prefill_chunk=chunk)
    want = sample(model, tokens, mask, rng=jax.random.key(1), cfg=scfg, pad_id=PAD)
    np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN))
    np.testing.assert_allclose(np.asarray(got.logprobs_BxN), np.asarray(want.logprobs_BxN),
                               atol=ATOL_LOGP)
  with pytest.raises(ValueError, match="prefill_chunk 3 does not divide"):
    sample(model, tokens, mask, rng=jax.random.key(1), cfg=scfg, pad_id=PAD, prefill_chunk=3)


def test_left_pad_and_truncate_at_stop():
  tokens, mask = left_pad([[7, 8, 9], [5]], pad_id=0, bucket=4)
  np.testing.assert_array_equal(tokens, [[0, 7, 8, 9], [0, 0, 0, 5]])
  np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
  assert left_pad([[1] * 5], 0, bucket=4)[0].shape == (1, 8)
  assert truncate_at_stop("go north\nObs: x", ["\nObs:", "north"]) == (
      "go ", True)
  assert truncate_at_stop("look", ["\n"]) == ("look", False)
  with pytest.raises(ValueError, match="non-empty"):
    left_pad([[1], []], 0)


def test_bad_inputs_raise(model):
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(max_new_tokens=4, temperature=0.0)
  with pytest.raises(ValueError, match="top_p"):
    SamplingConfig(max_new_tokens=4, top_p=0.0)
  with pytest.raises(ValueError, match="at least one real token"):
    sample(model, np.ones((2, 3), np.int32), np.array([[1, 1, 1], [0, 0, 0]]),
           rng=jax.random.key(0), cfg=SamplingConfig(max_new_tokens=2),
           pad_id=PAD)
  with pytest.raises(ValueError, match="max_seq_len"):
    sample(model, np.ones((1, 3), np.int32), np.ones((1, 3), np.int32),
           rng=jax.random.key(0), cfg=SamplingConfig(max_new_tokens=5000),
           pad_id=PAD)


def _np_logprob(logits_V, token, cfg):
  """Float64 reference: log-softmax of logits / T over the kept (top-k, top-p) set, at
  `token`; greedy reports the raw distribution. -inf outside the kept set."""
  temperature = 1.0 if cfg.greedy else cfg.temperature
  top_k, top_p = (0, 1.0) if cfg.greedy else (cfg.top_k, cfg.top_p)
  z = logits_V.astype(np.float64) / temperature
  keep = np.array(sorted(_np_allowed(logits_V, temperature, top_k, top_p)))
  if token not in set(keep.tolist()):
    return -np.inf
  m = z[keep].max()
  return z[token] - (m + np.log(np.exp(z[keep] - m).sum()))


@pytest.mark.parametrize("cfg", [
    SamplingConfig(max_new_tokens=8, temperature=0.7),
    SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=5),
    SamplingConfig(max_new_tokens=8, temperature=1.3, top_p=0.8),
    SamplingConfig(max_new_tokens=8, temperature=0.7, greedy=True),
], ids=["temp", "temp_topk", "temp_topp", "greedy"])
def test_logprobs_equal_a_float64_reference(model, prompts, cfg):
  """The sampler's reported log-probs, value by value, against NumPy in float64 over the
  teacher-forced logits (not through `transform_logits`/`sampling_logprobs`)."""
  _, (tokens, mask) = prompts
  out = sample(model, tokens, mask, rng=jax.random.key(2), cfg=cfg, pad_id=PAD)
  logits = np.asarray(_teacher_forced_logits(model, tokens, mask, out))
  toks, got = np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN)
  want = np.array([[_np_logprob(logits[b, j], toks[b, j], cfg) for j in range(toks.shape[1])]
                   for b in range(toks.shape[0])])
  assert np.isfinite(want).all()  # every sampled token is in the kept set
  assert (want < 0).all() and want.min() < -0.5  # real distributions, not degenerate ones
  # The sampler's logits come from the KV-cache decode path, the reference's from one full
  # forward pass: float32 rounding of two computations (measured at most 4.2e-7).
  np.testing.assert_allclose(got, want, rtol=0, atol=ATOL_LOGP)


def _assert_float64_logprobs(model, tokens, mask, out, cfg):
  """Every live token's reported log-prob against NumPy float64 over teacher forcing."""
  logits = np.asarray(_teacher_forced_logits(model, tokens, mask, out))
  toks, got, live = (np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN),
                     np.asarray(out.mask_BxN) > 0)
  for b, j in zip(*np.nonzero(live)):
    np.testing.assert_allclose(got[b, j], _np_logprob(logits[b, j], toks[b, j], cfg),
                               rtol=0, atol=ATOL_LOGP)


@pytest.mark.parametrize("segment", [1, 3, 5])
def test_segmented_decode_samples_what_one_segment_samples(model, prompts, segment):
  """Decode segments whose cache holds only the slots written so far: same tokens and
  log-probs as one segment over the whole cache, and as a float64 teacher-forced
  reference; a stop inside an early segment ends the row there."""
  _, (tokens, mask) = prompts
  n = 8
  free = sample(model, tokens, mask, rng=jax.random.key(5),
                cfg=SamplingConfig(max_new_tokens=n), pad_id=PAD, decode_segment=0)
  stop_ids = (int(np.asarray(free.tokens_BxN)[1, 1]),)
  for cfg in (SamplingConfig(max_new_tokens=n, greedy=True),
              SamplingConfig(max_new_tokens=n),
              SamplingConfig(max_new_tokens=n, stop_token_ids=stop_ids)):
    got = sample(model, tokens, mask, rng=jax.random.key(5), cfg=cfg, pad_id=PAD,
                 decode_segment=segment)
    want = sample(model, tokens, mask, rng=jax.random.key(5), cfg=cfg, pad_id=PAD,
                  decode_segment=0)
    for field in ("tokens_BxN", "mask_BxN", "lengths_B"):
      np.testing.assert_array_equal(np.asarray(getattr(got, field)),
                                    np.asarray(getattr(want, field)))
    np.testing.assert_allclose(np.asarray(got.logprobs_BxN), np.asarray(want.logprobs_BxN),
                               rtol=0, atol=ATOL_LOGP)
    _assert_float64_logprobs(model, tokens, mask, got, cfg)
  assert int(got.lengths_B[1]) <= 2  # the stop came in the first segment
  assert decode_segments(8, 3) == (3, 6, 8) and decode_segments(8, 0) == (8,)
  with pytest.raises(ValueError, match="decode_segment"):
    sample(model, tokens, mask, rng=jax.random.key(5), cfg=cfg, pad_id=PAD,
           decode_segment=-1)


def test_identical_prompts_share_one_prefill(model, prompts):
  """Rows with the same prompt are prefilled once and their cache rows copied: the
  samples equal those of separate prefills and a float64 teacher-forced reference."""
  lists, _ = prompts
  rows = [lists[i] for i in (0, 1, 0, 0, 2, 1, 0, 3)]
  tokens, mask = left_pad(rows, PAD, bucket=8)
  rows_U, index_B = prefill_groups(tokens, mask)
  assert len(rows_U) == 4  # 4 distinct prompts among 8 rows
  np.testing.assert_array_equal(tokens[rows_U][index_B], tokens)
  np.testing.assert_array_equal(mask[rows_U][index_B], mask)
  some = [0, 1, 4, 2]  # prompts 0, 1, 2, 0: 3 distinct round up to 4, no saving
  assert prefill_groups(tokens[some], mask[some]) is None
  for cfg in (SamplingConfig(max_new_tokens=6, greedy=True), SamplingConfig(max_new_tokens=6)):
    got = sample(model, tokens, mask, rng=jax.random.key(7), cfg=cfg, pad_id=PAD)
    want = sample(model, tokens, mask, rng=jax.random.key(7), cfg=cfg, pad_id=PAD,
                  share_prefill=False)
    np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN))
    np.testing.assert_allclose(np.asarray(got.logprobs_BxN), np.asarray(want.logprobs_BxN),
                               rtol=0, atol=ATOL_LOGP)
    _assert_float64_logprobs(model, tokens, mask, got, cfg)
  # Rows with the same prompt but independent draws: sampling still differs between them.
  assert len({tuple(r) for r in np.asarray(got.tokens_BxN)[[0, 2, 3, 6]]}) > 1
  # With prefill_chunk the shared prefill goes through in chunks of the unique rows.
  chunked = sample(model, tokens, mask, rng=jax.random.key(7), cfg=cfg, pad_id=PAD,
                   prefill_chunk=2)
  np.testing.assert_array_equal(np.asarray(chunked.tokens_BxN), np.asarray(got.tokens_BxN))


def test_split_prefix_takes_whole_blocks_every_row_starts_with():
  rng = np.random.default_rng(3)
  head = rng.integers(1, V, 40).tolist()
  rows = [head + rng.integers(1, V, n).tolist() for n in (3, 9, 1)] + [head[:35]]
  tokens, mask = left_pad(rows, PAD, bucket=64)
  prefix, rest, rest_mask = split_prefix(tokens, mask, PAD)
  # 35 shared tokens (the last row is head[:35], one kept as its own): 2 blocks of 16.
  assert prefix.shape == (1, 2 * PREFIX_BLOCK)
  assert prefix[0].tolist() == head[:2 * PREFIX_BLOCK]
  assert rest.shape == (4, 64 - 2 * PREFIX_BLOCK)
  for r, t, m in zip(rows, rest, rest_mask):
    assert t[m > 0].tolist() == r[2 * PREFIX_BLOCK:] and m[-1] == 1
  # No whole block in common: nothing split off.
  other = left_pad([head[:20] + [1], head[:15] + [2] + head[16:20]], PAD, bucket=32)
  assert split_prefix(*other, PAD)[0] is None


@pytest.mark.parametrize("chunk", [0, 2])
def test_a_shared_prefix_samples_what_whole_prompts_sample(model, chunk):
  """share_prefix: the common prefix prefilled once and its cache copied to every row
  gives the tokens of whole-prompt prefills and their log-probs within float rounding,
  and a float64 teacher-forced reference's log-probs."""
  rng = np.random.default_rng(4)
  head = rng.integers(1, V, 37).tolist()
  tails = [rng.integers(1, V, n).tolist() for n in (4, 11, 2, 7)]
  rows = [head + t for t in tails] + [head + tails[0]] * 4  # repeated rows share a prefill
  tokens, mask = left_pad(rows, PAD, bucket=64)
  for cfg in (SamplingConfig(max_new_tokens=6, greedy=True), SamplingConfig(max_new_tokens=6),
              SamplingConfig(max_new_tokens=6, temperature=0.7, top_k=5)):
    got = sample(model, tokens, mask, rng=jax.random.key(9), cfg=cfg, pad_id=PAD,
                 share_prefix=True, prefill_chunk=chunk)
    want = sample(model, tokens, mask, rng=jax.random.key(9), cfg=cfg, pad_id=PAD)
    np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(got.mask_BxN), np.asarray(want.mask_BxN))
    np.testing.assert_allclose(np.asarray(got.logprobs_BxN), np.asarray(want.logprobs_BxN),
                               rtol=0, atol=ATOL_LOGP)
    _assert_float64_logprobs(model, tokens, mask, got, cfg)


def test_bucket_length_picks_few_widths_that_hold_the_prompt():
  widths = {bucket_length(n, 192) for n in range(1, 193)}
  assert widths == {16, 32, 64, 128, 192}
  for n in range(1, 193):
    w = bucket_length(n, 192)
    assert n <= w <= 192 and (w in (16, 192) or w < 2 * n)
  assert bucket_length(5, 12) == 12 and bucket_length(300, 192) == 300
  with pytest.raises(ValueError, match="positive"):
    bucket_length(0, 192)
