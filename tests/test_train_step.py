"""The jitted updates: SFT learns a fixed batch; the RL step's first move is exactly the
policy gradient of -A * log pi (ratio 1, nothing clipped), computed independently."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax.config import AlgoConfig
from csa_jax.model import Decoder, LoRAConfig, ModelConfig, lora, token_logprobs
from csa_jax.model import sampling
from csa_jax.model.sampling import SamplingConfig
from csa_jax.update import data as D
from csa_jax.update import train_step as ts

CFG = ModelConfig.tiny(vocab_size=64, max_seq_len=32, hidden_size=32, intermediate_size=64,
                       head_dim=8)


# Gradients of two float32 computations of the same function (different forward passes):
# they agree to a few ulps of the largest entries, not to 1e-3.
RTOL_GRAD, ATOL_GRAD = 1e-5, 1e-7


def _batch(rng, n=4, L=12, adv=None):
  rows = []
  for i in range(n):
    p = rng.integers(2, 64, size=int(rng.integers(3, 7))).tolist()
    a = rng.integers(2, 64, size=int(rng.integers(1, 4))).tolist() + [1]
    rows.append({"prompt_ids": p, "action_ids": a, "old_logps": [0.0] * len(a),
                 "advantage": float(adv[i]) if adv is not None else 1.0})
  return rows, {k: np.stack([D.row_arrays(r, L, 4)[k] for r in rows]) for k in D.BATCH_KEYS}


def _model():
  return nnx.split(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param)


# The references below run as one compiled program each: called eagerly, a forward or a
# gradient of the model compiles every operation on its own (hundreds of small programs a
# test, most of this file's time; reports/suite_time.md).
@functools.partial(jax.jit, static_argnums=0)
def _full_logits(graphdef, params, inputs_BxT, attn_mask_BxT):
  """Logits at every position (not the act_pos gather the loss uses)."""
  return nnx.merge(graphdef, params)(inputs_BxT, attention_mask_BxT=attn_mask_BxT)


_jit_logits = jax.jit(ts.action_logits, static_argnums=0)


def _jit_value_and_grad_micro(loss_fn, params, batch, ref, micro_batches):
  return jax.jit(functools.partial(ts.value_and_grad_micro, loss_fn,
                                   micro_batches=micro_batches))(params, batch, ref)


def _np_tree(fn, tree):
  """`fn` on each leaf as a float32 NumPy array (no per-shape device program)."""
  return jax.tree.map(lambda x: np.asarray(fn(np.asarray(x)), np.float32), tree)


def test_sft_step_fits_a_batch():
  graphdef, params = _model()
  tx = optax.adam(1e-2)
  state = ts.init_state(params, tx)
  step = ts.make_sft_step(graphdef, tx)
  _, batch = _batch(np.random.default_rng(0))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  first = None
  for _ in range(30):
    state, m = step(state, batch)
    first = float(m["nll"]) if first is None else first
  assert float(m["nll"]) < 0.2 * first
  assert int(state.step) == 30


def _old_logps(graphdef, params, batch):
  """Action-token log-probs from a full forward pass (all positions), then gathered."""
  logits = _full_logits(graphdef, params, jnp.asarray(batch["inputs"]),
                        jnp.asarray(batch["attn_mask"]))
  logits = np.take_along_axis(np.asarray(logits), batch["act_pos"][..., None], axis=1)
  return np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(batch["targets"]))
                    ) * batch["loss_mask"]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rl_first_step_is_the_policy_gradient(agg):
  graphdef, params = _model()
  rng = np.random.default_rng(1)
  adv = np.array([1.0, -0.5, 2.0, -1.5], np.float32)
  _, batch = _batch(rng, adv=adv)
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def reference_loss(p):  # on-policy surrogate: -A * log pi, aggregated like `agg`
    logits = nnx.merge(graphdef, p)(batch["inputs"], attention_mask_BxT=batch["attn_mask"])
    logits = jnp.take_along_axis(logits, batch["act_pos"][..., None], axis=1)
    logp = token_logprobs(logits, batch["targets"])
    m = batch["loss_mask"]
    per_tok = -batch["adv"] * logp * m
    if agg == "token-mean":
      return per_tok.sum() / m.sum()
    return jnp.mean(per_tok.sum(1) / jnp.maximum(m.sum(1), 1))

  want = jax.jit(jax.grad(reference_loss))(params)
  algo = AlgoConfig(loss_agg=agg, clip_low=0.2, clip_high=0.28, kl_coef=0.0)
  scfg = SamplingConfig(max_new_tokens=4)
  # The gradient itself, not one rebuilt from an update: at ratio 1 the clipped
  # objective's gradient is -A * grad log pi. The two sides differ only in float32
  # rounding (the ratio is exp(logp - old_logp) with old_logp from another forward pass).
  got, m = jax.jit(jax.grad(ts.make_rl_loss(graphdef, algo, scfg), has_aux=True))(
      params, batch, None)
  assert float(m["clip_frac"]) == 0.0
  assert abs(float(m["approx_kl"])) < 1e-6
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL_GRAD, atol=ATOL_GRAD)
  # The step applies that gradient: SGD moves each parameter by -lr * grad.
  lr = 0.1
  tx = optax.sgd(lr)
  before = jax.tree.map(np.asarray, params)
  state, sm = ts.make_rl_step(graphdef, tx, algo, scfg)(ts.init_state(params, tx), batch)
  np.testing.assert_allclose(float(sm["grad_norm"]), float(optax.tree.norm(got)), rtol=1e-6)
  for b, g, a in zip(jax.tree.leaves(before), jax.tree.leaves(got), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(a), b - lr * np.asarray(g), rtol=1e-6, atol=1e-7)


def test_rl_step_moves_logp_with_the_advantage_sign():
  graphdef, params = _model()
  adv = np.array([1.0, 1.0, -1.0, -1.0], np.float32)
  _, batch = _batch(np.random.default_rng(2), adv=adv)
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32)
  jb = {k: jnp.asarray(v) for k, v in batch.items()}
  tx = optax.sgd(0.05)
  step = ts.make_rl_step(graphdef, tx, AlgoConfig(kl_coef=0.0), SamplingConfig(max_new_tokens=4))
  state, _ = step(ts.init_state(params, tx), jb)
  after = _old_logps(graphdef, state.params, batch)
  delta = (after - batch["old_logp"]).sum(1)
  assert (delta[:2] > 0).all() and (delta[2:] < 0).all()


def _sampled_batch(graphdef, params, scfg, n=6, L=16, A=4, seed=3):
  """Rows built from the sampler's own tokens and log-probs (as the trainer builds them)."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(2, 64, size=int(rng.integers(3, 9))).tolist() for _ in range(n)]
  tokens, mask = sampling.left_pad(prompts, 0, bucket=8)
  out = sampling.sample(nnx.merge(graphdef, params), tokens, mask, rng=jax.random.key(seed),
                        cfg=scfg, pad_id=0)
  ids, logps, lens = (np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN),
                      np.asarray(out.lengths_B))
  adv = rng.normal(size=n)
  rows = [{"prompt_ids": p, "action_ids": ids[i, :lens[i]].tolist(),
           "old_logps": logps[i, :lens[i]].tolist(), "advantage": float(adv[i])}
          for i, p in enumerate(prompts)]
  return {k: jnp.asarray(np.stack([D.row_arrays(r, L, A)[k] for r in rows]))
          for k in D.BATCH_KEYS}


def test_rl_ratio_and_kl_under_the_sampling_distribution():
  """Sampled at temperature 0.7: the step's ratio is exactly 1 and its KL to an equal
  reference is 0, because both the numerator and the reference take the sampler's
  distribution (logits / T), not the raw one."""
  graphdef, params = _model()
  scfg = SamplingConfig(max_new_tokens=4, temperature=0.7, stop_token_ids=(1,))
  batch = _sampled_batch(graphdef, params, scfg)
  assert float(batch["loss_mask"].sum()) >= 12
  tx = optax.sgd(0.1)
  step = ts.make_rl_step(graphdef, tx, AlgoConfig(kl_coef=0.1), scfg)
  ref = jax.tree.map(jnp.copy, params)
  _, m = step(ts.init_state(params, tx), batch, ref)
  # The sampler's decode-time log-probs and the step's teacher-forced ones agree to float32
  # rounding (~1e-6 per token), so k3 = r - 1 - log r is of order 1e-12.
  assert float(m["approx_kl"]) < 1e-6
  assert float(m["clip_frac"]) == 0.0
  assert abs(float(m["ratio_mean"]) - 1.0) < 1e-5
  # The same params give bitwise equal logits, so the log-ratio is exactly 0.
  assert float(m["kl_ref"]) == 0.0


def _log_softmax64(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_kl_to_reference_is_k3_of_tempered_logprobs():
  """KL to a reference that differs from the policy, against a float64 NumPy reference:
  k3 of the two log-probs, both under logits / T."""
  graphdef, params = _model()
  T = 0.7
  scfg = SamplingConfig(max_new_tokens=4, temperature=T, stop_token_ids=(1,))
  batch = _sampled_batch(graphdef, params, scfg)
  noise = iter(np.random.default_rng(5).normal(size=(len(jax.tree.leaves(params)),)))
  ref = _np_tree(lambda p: p * np.float32(1.0 + 0.5 * next(noise)), params)
  loss_fn = ts.make_rl_loss(graphdef, AlgoConfig(kl_coef=0.1, kl_kind="k3"), scfg)
  _, m = jax.jit(loss_fn)(params, batch, ref)

  def tempered_logp(p):  # full forward over every position, then gather (not act_pos)
    logits = _full_logits(graphdef, p, batch["inputs"], batch["attn_mask"])
    z = np.take_along_axis(np.asarray(logits), np.asarray(batch["act_pos"])[..., None], axis=1)
    lp = _log_softmax64(z / T)
    return np.take_along_axis(lp, np.asarray(batch["targets"])[..., None], axis=-1)[..., 0]

  x = tempered_logp(ref) - tempered_logp(params)
  mask = np.asarray(batch["loss_mask"]) > 0
  want = (np.expm1(x) - x)[mask].mean()
  assert want > 1e-3  # a reference far enough away that the temperature matters
  # k3 ~ x^2 / 2: float32 log-probs (error ~1e-6 on |x| ~ 0.1) give it ~2e-5 relative error.
  np.testing.assert_allclose(float(m["kl_ref"]), want, rtol=1e-4)



def _leaves_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _stepped_once():
  """(step fn, state after one good step, the good batch, a numpy copy of that state):
  Adam's moments are non-zero, so a skipped step that decayed them would show."""
  graphdef, params = _model()
  _, batch = _batch(np.random.default_rng(4), adv=np.array([1.0, -1.0, 0.5, 2.0], np.float32))
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32)
  tx = optax.adam(1e-2)
  step = ts.make_rl_step(graphdef, tx, AlgoConfig(kl_coef=0.0), SamplingConfig(max_new_tokens=4))
  state, m = step(ts.init_state(params, tx), {k: jnp.asarray(v) for k, v in batch.items()})
  assert float(m["nonfinite_loss"]) == float(m["nonfinite_grad"]) == 0.0
  return step, state, batch, jax.tree.map(np.array, state)


@pytest.mark.parametrize("poison", ["adv", "old_logp"])
def test_a_non_finite_loss_skips_the_update(poison):
  step, state, batch, before = _stepped_once()
  bad = dict(batch, **{poison: batch[poison].copy()})
  bad[poison][1, 0] = np.nan
  state2, m = step(state, {k: jnp.asarray(v) for k, v in bad.items()})
  assert float(m["nonfinite_loss"]) == 1.0
  assert _leaves_equal(state2, before)  # params, Adam's moments and count, step counter
  # The next finite batch updates from the untouched state.
  state3, m = step(state2, {k: jnp.asarray(v) for k, v in batch.items()})
  assert float(m["nonfinite_loss"]) == 0.0 and int(state3.step) == int(before.step) + 1
  assert not _leaves_equal(state3.params, before.params)


def test_a_non_finite_gradient_with_a_finite_loss_skips_the_update():
  _, state, _, before = _stepped_once()
  tx = optax.adam(1e-2)
  grads = jax.tree.map(jnp.zeros_like, state.params)
  leaves, treedef = jax.tree.flatten(grads)
  leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.inf)
  state2, m = jax.jit(ts.apply_update, static_argnums=0)(
      tx, state, jnp.float32(0.3), jax.tree.unflatten(treedef, leaves), {})
  assert float(m["nonfinite_grad"]) == 1.0 and float(m["nonfinite_loss"]) == 0.0
  assert _leaves_equal(state2, before)


def test_micro_batches_give_the_whole_batch_gradient_for_a_mean_over_rows():
  """Gradient accumulation over 2 and 4 slices equals one pass over the batch when the
  loss is a mean over rows of equal weight (seq-mean-token-mean), to float32 rounding;
  with a token mean it is the mean of the slices' token means, computed here by hand."""
  graphdef, params = _model()
  rng = np.random.default_rng(3)
  rows, batch = _batch(rng, n=8, adv=rng.normal(size=8).astype(np.float32))
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32) - 0.1
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
  scfg = SamplingConfig(max_new_tokens=4)
  algo = AlgoConfig(loss_agg="seq-mean-token-mean", kl_coef=0.0)
  loss_fn = ts.make_rl_loss(graphdef, algo, scfg)
  (want_loss, _), want = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      params, jbatch, None)
  for micro in (2, 4):
    (loss, m), got = _jit_value_and_grad_micro(loss_fn, params, jbatch, None, micro)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL_GRAD, atol=ATOL_GRAD)
  # Token mean: slice j holds rows j, j + 2, ...; the result is the mean of the two
  # slices' own token-mean losses.
  tok_fn = ts.make_rl_loss(graphdef, AlgoConfig(loss_agg="token-mean", kl_coef=0.0), scfg)
  (loss, _), _ = _jit_value_and_grad_micro(tok_fn, params, jbatch, None, 2)
  halves = [float(jax.jit(tok_fn)(params, {k: v[j::2] for k, v in jbatch.items()}, None)[0])
            for j in range(2)]
  np.testing.assert_allclose(float(loss), np.mean(halves), rtol=1e-6)
  with pytest.raises(ValueError, match="does not split into 3"):
    ts.value_and_grad_micro(loss_fn, params, jbatch, None, micro_batches=3)
  # The jitted steps take the same path: one SGD step with micro-batches moves the
  # parameters by -lr * the whole batch's gradient.
  tx = optax.sgd(0.1)
  before = jax.tree.map(np.asarray, params)  # the step donates the state's buffers
  state, _ = ts.make_rl_step(graphdef, tx, algo, scfg, micro_batches=4)(
      ts.init_state(params, tx), jbatch)
  for p, g, q in zip(jax.tree.leaves(before), jax.tree.leaves(want),
                     jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(q), p - 0.1 * np.asarray(g), rtol=1e-5, atol=1e-7)
  del rows


def test_a_remat_policy_steps_with_a_kl_reference_and_micro_batches():
  """The full-size configuration (remat, KL to a reference, micro-batches) takes the same
  step as the plain model: nnx.remat failed there (a reference merged at another trace
  level), the functional jax.checkpoint does not."""
  graphdef, params = _model()
  remat_graphdef, _ = nnx.split(Decoder(CFG.replace(remat=True), rngs=nnx.Rngs(0)), nnx.Param)
  rng = np.random.default_rng(4)
  _, batch = _batch(rng, n=8, adv=rng.normal(size=8).astype(np.float32))
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32) - 0.05
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  algo = AlgoConfig(loss_agg="seq-mean-token-mean", kl_coef=0.1)
  scfg = SamplingConfig(max_new_tokens=4)
  ref = _np_tree(lambda x: x * np.float32(0.9), params)
  tx = optax.sgd(0.1)
  out = {}
  for name, g in (("plain", graphdef), ("remat", remat_graphdef)):
    state = ts.init_state(jax.tree.map(jnp.copy, params), tx)
    state, m = ts.make_rl_step(g, tx, algo, scfg, micro_batches=2)(state, batch, ref)
    out[name] = (jax.tree.map(np.asarray, state.params), float(m["kl_ref"]))
  assert out["remat"][1] == pytest.approx(out["plain"][1], rel=1e-5)
  for a, b in zip(jax.tree.leaves(out["remat"][0]), jax.tree.leaves(out["plain"][0])):
    np.testing.assert_allclose(a, b, rtol=RTOL_GRAD, atol=ATOL_GRAD)

def _assert_same_logprobs(graphdef, params, got, plain, scfg):
  """Per-token sampling log-probs of a laid-out batch equal the unpacked rows' (where a
  loss is taken)."""
  mask = np.asarray(plain["loss_mask"])
  np.testing.assert_allclose(
      np.asarray(sampling.sampling_logprobs(_jit_logits(graphdef, params, got),
                                            got["targets"], scfg)) * mask,
      np.asarray(sampling.sampling_logprobs(_jit_logits(graphdef, params, plain),
                                            plain["targets"], scfg)) * mask,
      rtol=1e-5, atol=1e-6)

def _assert_same_sft_step(graphdef, params, got, plain, micro=1):
  """One SGD SFT step over a laid-out batch gives the unpacked rows' loss and parameters."""
  tx = optax.sgd(0.1)
  step = ts.make_sft_step(graphdef, tx, micro)
  copy = lambda: jax.tree.map(jnp.copy, params)  # the step donates the state's buffers
  a, ma = step(ts.init_state(copy(), tx), plain)
  b, mb = step(ts.init_state(copy(), tx), got)
  np.testing.assert_allclose(float(mb["nll"]), float(ma["nll"]), rtol=1e-5)
  for x, y in zip(jax.tree.leaves(b.params), jax.tree.leaves(a.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)


def _assert_same_loss_and_grads(loss_fn, params, got, plain, ref, micro):
  """The loss, its metrics and its gradients over a laid-out batch equal the unpacked
  rows', in `micro` micro-batches."""
  (want, want_m), want_g = _jit_value_and_grad_micro(loss_fn, params, plain, ref, micro)
  (got, got_m), got_g = _jit_value_and_grad_micro(loss_fn, params, got, ref, micro)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  for k in want_m:
    np.testing.assert_allclose(float(got_m[k]), float(want_m[k]), rtol=1e-4, atol=1e-6)
  assert jax.tree.leaves(want_g)
  for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL_GRAD, atol=ATOL_GRAD)


@pytest.mark.parametrize("agg, micro", [("token-mean", 1), ("seq-mean-token-mean", 1),
                                        ("seq-mean-token-sum-norm", 2)])
def test_packed_rows_give_the_unpacked_logprobs_loss_and_gradient(agg, micro):
  """optim.pack_rows: the same rows packed several to a sequence (block-diagonal mask,
  positions restarting per row) give, against the unpacked path as the reference, the same
  per-token log-probs, loss, metrics and gradient (KL to a reference included), with and
  without micro-batches; a padding row holds no tokens and counts in no mean."""
  graphdef, params = _model()
  ref = _np_tree(lambda x: x + np.float32(0.01), params)
  rng = np.random.default_rng(4)
  rows, _ = _batch(rng, n=10, adv=rng.normal(size=10).astype(np.float32))
  rows += [D.empty_row(0)] * 2
  for r in rows:  # old log-probs a little off the policy's, so ratios are not all 1
    r["old_logps"] = (-rng.random(len(r["action_ids"]))).tolist()
  L, A = 12, 4
  plain = {k: jnp.asarray(np.stack([D.row_arrays(r, L, A)[k] for r in rows]))
           for k in D.BATCH_KEYS}
  scfg = SamplingConfig(max_new_tokens=A, temperature=0.8)
  # Per-token log-probs (one pass: act_idx indexes the whole batch's sequences).
  whole = {k: jnp.asarray(v) for k, v in D.pack_rows(rows, seq_len=L, action_len=A).items()}
  assert whole["inputs"].shape[0] < len(rows)  # rows did share sequences
  _assert_same_logprobs(graphdef, params, whole, plain, scfg)
  packed = {k: jnp.asarray(v)
            for k, v in D.pack_rows(rows, seq_len=L, action_len=A, micro_batches=micro).items()}
  loss_fn = ts.make_rl_loss(graphdef, AlgoConfig(loss_agg=agg, kl_coef=0.05), scfg)
  _assert_same_loss_and_grads(loss_fn, params, packed, plain, ref, micro)


def test_sft_step_on_packed_rows_equals_the_unpacked_step():
  graphdef, params = _model()
  rows, _ = _batch(np.random.default_rng(5), n=8)
  plain = {k: np.stack([D.row_arrays(r, 12, 4)[k] for r in rows]) for k in D.BATCH_KEYS}
  packed = D.pack_rows(rows, seq_len=12, action_len=4)
  _assert_same_sft_step(graphdef, params, packed, plain)


def _prefixed_rows(rng, head, n=8):
  """n rows whose prompts start with `head`, then 1-4 ids of their own, and 2 padding rows."""
  rows, _ = _batch(rng, n=n, adv=rng.normal(size=n).astype(np.float32))
  for r in rows:
    r["prompt_ids"] = list(head) + r["prompt_ids"][:int(rng.integers(1, 5))]
    r["old_logps"] = (-rng.random(len(r["action_ids"]))).tolist()
  return rows + [D.empty_row(0)] * 2


@pytest.mark.parametrize("scan, remat, micro", [(False, False, 1), (True, True, 2),
                                                (False, True, 2)])
def test_prefixed_rows_give_the_unprefixed_logprobs_loss_and_gradient(scan, remat, micro):
  """optim.share_prefix: rows that start with the same prompt tokens, laid out with those
  split off (data.prefixed: the model computes them once), against the same rows unprefixed
  as the reference: the same per-token log-probs, loss, metrics (KL to a reference
  included) and gradient with respect to the LoRA adapters, with and without
  micro-batches; padding rows count in no mean. SFT's step moves the adapters alike."""
  cfg = CFG.replace(scan_layers=scan, remat=remat, lora=LoRAConfig(rank=4, alpha=8.0))
  graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  rng = np.random.default_rng(6)
  params = nnx.from_flat_state([  # trained-looking adapters: B non-zero
      (path, v.replace(jnp.asarray(0.1 * rng.standard_normal(v.shape), jnp.float32))
       if path[-1] == "lora_b" else v) for path, v in nnx.to_flat_state(params)])
  assert all(np.abs(np.asarray(v.get_value())).max() > 0
             for path, v in nnx.to_flat_state(params) if path[-1] == "lora_b")
  ref = _np_tree(lambda x: x + np.float32(0.01), params)
  head = rng.integers(2, 64, 6).tolist()
  rows = _prefixed_rows(rng, head)
  assert D.common_prefix_len(rows) == len(head)
  L, A = 16, 4
  plain = {k: np.stack([D.row_arrays(r, L, A)[k] for r in rows]) for k in D.BATCH_KEYS}
  pre = {k: jnp.asarray(v) for k, v in D.prefixed(plain, head).items()}
  plain = {k: jnp.asarray(v) for k, v in plain.items()}
  scfg = SamplingConfig(max_new_tokens=A, temperature=0.8)
  _assert_same_logprobs(graphdef, params, pre, plain, scfg)
  adapters, frozen = lora.split(params)
  rl_loss = ts.make_rl_loss(graphdef, AlgoConfig(loss_agg="seq-mean-token-mean", kl_coef=0.05),
                            scfg)
  loss_fn = lambda a, batch, r: rl_loss(lora.merge(a, frozen), batch, r)
  _assert_same_loss_and_grads(loss_fn, adapters, pre, plain, ref, micro)
  _assert_same_sft_step(graphdef, params, pre, plain, micro)
