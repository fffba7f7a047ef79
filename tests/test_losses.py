"""Tests for csa_jax/losses.py against plain NumPy loops written here."""

import math

import jax
import numpy as np
import pytest

from csa_jax import losses

ATOL = 1e-5
RTOL = 1e-5


def ref_aggregate(values, mask, agg):
  N, L = mask.shape
  if agg == "token-mean":
    toks = [values[n, l] for n in range(N) for l in range(L) if mask[n, l]]
    return sum(toks) / len(toks) if toks else 0.0
  rows = []
  for n in range(N):
    toks = [values[n, l] for l in range(L) if mask[n, l]]
    if not toks:
      continue
    if agg == "seq-mean-token-mean":
      rows.append(sum(toks) / len(toks))
    elif agg == "seq-mean-token-sum":
      rows.append(sum(toks))
    else:
      rows.append(sum(toks) / L)
  return sum(rows) / len(rows) if rows else 0.0


def ref_token_objective(logp, old, adv, clip_low, clip_high, dual_clip):
  """PPO objective per token (to maximise), written in its textbook form."""
  r = math.exp(logp - old)
  obj = min(r * adv, min(max(r, 1 - clip_low), 1 + clip_high) * adv)
  if dual_clip is not None and adv < 0:
    obj = max(obj, dual_clip * adv)
  return obj


def make_batch(seed, N=6, L=7):
  rng = np.random.default_rng(seed)
  old = -rng.gamma(2.0, 1.0, size=(N, L))
  logp = old + rng.normal(0.0, 0.4, size=(N, L))  # ratios from ~0.3 to ~3
  adv = rng.normal(size=(N, 1)) * np.ones((N, L))
  mask = rng.random((N, L)) > 0.3
  mask[0] = False  # a row without action tokens
  adv[1], mask[1, :3] = -1.0, True
  logp[1, :3] = old[1, :3] + np.array([1.5, 0.5, -0.5])  # ratios 4.5 (dual clip), 1.6, 0.6
  return logp, old, adv, mask


@pytest.fixture(params=["jit", "nojit"])
def maybe_jit(request):
  if request.param == "jit":
    return lambda f, **static: jax.jit(f, static_argnames=tuple(static))
  return lambda f, **static: f


@pytest.mark.parametrize("agg", losses.AGG_MODES)
@pytest.mark.parametrize("clip_low,clip_high,dual_clip",
                         [(0.2, 0.2, None), (0.2, 0.28, None), (0.2, 0.28, 3.0)])
def test_clipped_loss_matches_reference(maybe_jit, agg, clip_low, clip_high, dual_clip):
  logp, old, adv, mask = make_batch(0)
  fn = maybe_jit(losses.clipped_policy_loss, clip_low=1, clip_high=1, dual_clip=1, agg=1)
  loss, metrics = fn(logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                     dual_clip=dual_clip, agg=agg)
  N, L = mask.shape
  per_tok = np.zeros((N, L))
  for n in range(N):
    for l in range(L):
      per_tok[n, l] = -ref_token_objective(logp[n, l], old[n, l], adv[n, l], clip_low,
                                           clip_high, dual_clip)
  np.testing.assert_allclose(loss, ref_aggregate(per_tok, mask, agg), atol=ATOL, rtol=RTOL)
  ratio = np.exp(logp - old)[mask]
  a = adv[mask]
  clipped = ((ratio > 1 + clip_high) & (a > 0)) | ((ratio < 1 - clip_low) & (a < 0))
  np.testing.assert_allclose(metrics["clip_frac"], clipped.mean(), atol=ATOL)
  np.testing.assert_allclose(metrics["clip_frac_high"],
                             ((ratio > 1 + clip_high) & (a > 0)).mean(), atol=ATOL)
  np.testing.assert_allclose(metrics["approx_kl"],
                             np.mean(ratio - 1 - np.log(ratio)), atol=ATOL, rtol=RTOL)
  np.testing.assert_allclose(metrics["ratio_max"], ratio.max(), rtol=RTOL)
  if dual_clip is not None:
    assert metrics["dual_clip_frac"] > 0  # the batch has ratios above 3 with A < 0
    np.testing.assert_allclose(metrics["dual_clip_frac"],
                               ((a < 0) & (ratio > dual_clip)).mean(), atol=ATOL)


def test_clipped_loss_gradient_matches_reference():
  """d loss / d logp = -A r / count where unclipped, 0 where clipped (token-mean)."""
  logp, old, adv, mask = make_batch(1)
  grad = jax.grad(lambda lp: losses.clipped_policy_loss(lp, old, adv, mask,
                                                        clip_high=0.28)[0])(logp)
  ratio = np.exp(logp - old)
  want = np.zeros_like(logp)
  count = mask.sum()
  for n, l in zip(*np.nonzero(mask)):
    r, a = ratio[n, l], adv[n, l]
    clipped = (a > 0 and r > 1.28) or (a < 0 and r < 0.8)
    want[n, l] = 0.0 if clipped else -a * r / count
  np.testing.assert_allclose(grad, want, atol=1e-6, rtol=RTOL)


def test_padding_content_never_matters():
  logp, old, adv, mask = make_batch(2)
  junk = lambda x: np.where(mask, x, np.nan)
  for agg in losses.AGG_MODES:
    want, _ = losses.clipped_policy_loss(logp, old, adv, mask, agg=agg)
    got, metrics = losses.clipped_policy_loss(junk(logp), junk(old), junk(adv), mask,
                                              agg=agg)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert all(np.isfinite(v) for v in metrics.values())
  for fn in (lambda lp: losses.kl_penalty(lp, junk(old), mask),
             lambda lp: losses.clipped_policy_loss(lp, junk(old), junk(adv), mask)[0]):
    grad = jax.grad(fn)(junk(logp))
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)


def test_empty_batch_is_zero():
  z = np.zeros((2, 3))
  loss, metrics = losses.clipped_policy_loss(z, z, z, np.zeros((2, 3), bool))
  assert loss == 0.0 and metrics["clip_frac"] == 0.0


@pytest.mark.parametrize("kind", losses.KL_KINDS)
def test_kl_penalty_matches_reference(maybe_jit, kind):
  rng = np.random.default_rng(3)
  logp = -rng.gamma(2.0, 1.0, size=(5, 6))
  ref = logp + rng.normal(0, 0.5, size=(5, 6))
  mask = rng.random((5, 6)) > 0.3
  fn = maybe_jit(losses.kl_penalty, kind=1, agg=1)
  per_tok = np.zeros((5, 6))
  for n in range(5):
    for l in range(6):
      x = ref[n, l] - logp[n, l]
      per_tok[n, l] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[kind]
  for agg in losses.AGG_MODES:
    got = fn(logp, ref, mask, kind=kind, agg=agg)
    np.testing.assert_allclose(got, ref_aggregate(per_tok, mask, agg), atol=ATOL,
                               rtol=RTOL)


def test_k1_k3_unbiased_exactly_under_the_policy():
  """Sum over the vocabulary weighted by p: E_p[k1] = E_p[k3] = KL(p || q) exactly."""
  rng = np.random.default_rng(4)
  p = rng.dirichlet(np.ones(11))
  q = rng.dirichlet(np.ones(11))
  kl = float(np.sum(p * (np.log(p) - np.log(q))))
  logp = np.log(p)[None]
  logq = np.log(q)[None]
  for kind in ("k1", "k3"):
    est = np.asarray(losses.kl_estimate(logp, logq, kind=kind), np.float64)
    np.testing.assert_allclose(np.sum(p * est[0]), kl, rtol=1e-5)
  assert np.all(np.asarray(losses.kl_estimate(logp, logq, kind="k3")) >= 0)


def test_entropy_and_logprobs_match_reference(maybe_jit):
  rng = np.random.default_rng(5)
  logits = rng.normal(0, 3, size=(3, 4, 9))
  mask = rng.random((3, 4)) > 0.3
  mask[0, 0] = True
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  ent = -(p * np.log(p)).sum(-1)
  got = maybe_jit(losses.entropy_from_logits, agg=1)(logits, mask)
  np.testing.assert_allclose(got, ent[mask].mean(), rtol=1e-5)
  tokens = rng.integers(0, 9, size=(3, 4))
  want = np.log(np.take_along_axis(p, tokens[..., None], -1)[..., 0])
  np.testing.assert_allclose(losses.token_logprobs(logits, tokens), want, rtol=1e-5,
                             atol=1e-5)


def test_errors_are_clear():
  z = np.zeros((2, 3))
  with pytest.raises(ValueError, match="unknown loss aggregation 'mean'; valid: token-mean"):
    losses.clipped_policy_loss(z, z, z, z, agg="mean")
  with pytest.raises(ValueError, match="unknown KL estimator 'k4'; valid: k1, k2, k3"):
    losses.kl_penalty(z, z, z, kind="k4")
  with pytest.raises(ValueError, match="adv_NxL has shape"):
    losses.clipped_policy_loss(z, z, np.zeros((2, 4)), z)
  with pytest.raises(ValueError, match="dual_clip"):
    losses.clipped_policy_loss(z, z, z, z, dual_clip=0.5)
