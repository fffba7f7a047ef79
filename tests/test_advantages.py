"""Tests for csa_jax/estimators/ against plain NumPy loops written here."""

import inspect
import math

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from csa_jax import estimators as est_lib
from csa_jax.estimators import dapo

ATOL = 1e-4
RTOL = 1e-4
TIE_RTOL = 1e-6  # the spec's "spread is 0" rules (module docstring)
L_TIE_ATOL = 1e-5
# The references' knob values: an estimator's knobs have no defaults (their home is the
# config), so `run` gives each one a call leaves out this value.
REF_KNOBS = dict(lam=0.5, gamma=0.95, w=1.0, eps=1e-6, ddof=1, std_normalize=True,
                 decisive_steps=(0,))


def run(fn, *args, **kw):
  """fn(*args, **kw) with every knob of fn that the call leaves out at REF_KNOBS."""
  params = inspect.signature(fn).parameters
  return fn(*args, **{k: v for k, v in REF_KNOBS.items() if k in params and k not in kw}, **kw)


def run_est(name, **kw):
  """The registered estimator `name` on keyword arrays, knobs as in `run`."""
  est = est_lib.get_estimator(name)
  return est(**kw, **{k: REF_KNOBS[k] for k in est.hparams if k not in kw})


# ----------------------------------------------------------------------------------
# Independent float64 references: loops over groups, steps and rollouts.
# ----------------------------------------------------------------------------------


def ref_standardize(values, eps, ddof, std_normalize=True, atol=0.0):
  values = [float(v) for v in values]
  n = len(values)
  if n < max(2, ddof + 1):
    return [0.0] * n
  hi, lo = max(values), min(values)
  if hi - lo <= TIE_RTOL * max(abs(hi), abs(lo)) or hi - lo <= atol:
    return [0.0] * n
  mean = sum(values) / n
  if not std_normalize:
    return [v - mean for v in values]
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - ddof))
  return [(v - mean) / (std + eps) for v in values]


def ref_episode(rewards, valid, eps=1e-6, ddof=1, std_normalize=True):
  out = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    idx = [i for i in range(rewards.shape[1]) if valid[b, i]]
    vals = ref_standardize(rewards[b, idx], eps, ddof, std_normalize)
    for i, v in zip(idx, vals):
      out[b, i] = v
  return out


def ref_rloo(rewards, valid):
  out = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    idx = [i for i in range(rewards.shape[1]) if valid[b, i]]
    if len(idx) < 2:
      continue
    for i in idx:
      others = [rewards[b, j] for j in idx if j != i]
      out[b, i] = rewards[b, i] - sum(others) / len(others)
  return out


def ref_csa(rewards, logp, mask, lam=0.5, eps=1e-6, ddof=1):
  B, G, T = mask.shape
  a_e = ref_episode(rewards, mask.any(-1), eps, ddof)
  out = np.zeros(mask.shape)
  for b in range(B):
    for t in range(T):
      act = [i for i in range(G) if mask[b, i, t]]
      if not act:
        continue
      mean_lp = sum(logp[b, i, t] for i in act) / len(act)
      ls = [a_e[b, i] * (logp[b, i, t] - mean_lp) for i in act]
      atol = L_TIE_ATOL * max(abs(a_e[b, i]) for i in act) * max(abs(logp[b, i, t]) for i in act)
      a_s = ref_standardize(ls, eps, ddof, atol=atol)
      for i, s in zip(act, a_s):
        out[b, i, t] = a_e[b, i] + lam * s
  return out


def random_mask(rng, B, G, T, holes=True):
  """Prefix masks of random length, some rollouts fully padded, optional holes."""
  lengths = rng.integers(0, T + 1, size=(B, G))
  lengths[:, 0] = np.maximum(lengths[:, 0], 1)
  mask = np.arange(T)[None, None, :] < lengths[..., None]
  if holes:
    mask &= rng.random((B, G, T)) > 0.1
  return mask


@pytest.fixture(params=["jit", "nojit"])
def jit_mode(request):
  if request.param == "nojit":
    with jax.disable_jit():
      yield request.param
  else:
    yield request.param


# ----------------------------------------------------------------------------------
# Against the references.
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("std_normalize", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_episode_matches_reference(jit_mode, std_normalize, ddof):
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=(6, 5))
  rewards[1] = 0.7  # all equal
  valid = rng.random((6, 5)) > 0.2
  valid[2] = [True, False, False, False, False]  # one real rollout
  got = run(est_lib.episode_advantages, rewards, valid_BxG=valid, std_normalize=std_normalize,
                                   ddof=ddof)
  want = ref_episode(rewards, valid, ddof=ddof, std_normalize=std_normalize)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_grpo_binary_rewards_known_values():
  # 2 successes out of 4: mean 0.5, unbiased std sqrt(1/3).
  got = run(est_lib.episode_advantages, np.array([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
  # 0.5 / sqrt(1/3) = sqrt(3) / 2, to float32 rounding (a few ulps).
  np.testing.assert_allclose(got, np.sqrt(3) / 2 * np.array([[1, -1, -1, 1]]), rtol=1e-6)


def test_rloo_matches_leave_one_out(jit_mode):
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(5, 6))
  valid = rng.random((5, 6)) > 0.3
  valid[0] = False
  valid[0, 3] = True
  got = run(est_lib.rloo_advantages, rewards, valid_BxG=valid)
  np.testing.assert_allclose(got, ref_rloo(rewards, valid), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("lam,ddof", [(0.5, 1), (1.0, 1), (0.3, 0)])
def test_csa_matches_reference(jit_mode, lam, ddof):
  rng = np.random.default_rng(2)
  B, G, T = 4, 6, 9
  mask = random_mask(rng, B, G, T)
  rewards = rng.integers(0, 2, size=(B, G)).astype(float) + 0.1 * rng.normal(size=(B, G))
  logp = -rng.gamma(2.0, 2.0, size=(B, G, T))
  logp[~mask] = np.nan  # padding content must never leak
  got = run(est_lib.csa_advantages, rewards, logp, mask, lam=lam, ddof=ddof)
  want = ref_csa(rewards, logp, mask, lam=lam, ddof=ddof)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_csa_binary_rewards_matches_reference():
  rng = np.random.default_rng(3)
  B, G, T = 8, 8, 12
  mask = random_mask(rng, B, G, T, holes=False)
  rewards = rng.integers(0, 2, size=(B, G)).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=(B, G, T))
  got = run(est_lib.csa_advantages, rewards, logp, mask)
  np.testing.assert_allclose(got, ref_csa(rewards, logp, mask), atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------------
# Degenerate groups.
# ----------------------------------------------------------------------------------


def test_csa_degenerate_groups_are_finite_and_as_defined():
  B, G, T = 4, 3, 4
  mask = np.ones((B, G, T), bool)
  rewards = np.array([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 0.0, 0.0], [1, 0, 1]])
  logp = np.random.default_rng(4).normal(size=(B, G, T))
  logp[2] = -1.25  # all-equal log-probs: A_S == 0
  mask[3, 1:, :] = False  # one active rollout
  mask[0, 1:, 2] = False  # one active rollout at step 2 only
  got = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask, lam=0.7))
  a_e = ref_episode(rewards, mask.any(-1))
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[1], 0.0)  # all-equal rewards
  np.testing.assert_allclose(got[2], np.broadcast_to(a_e[2][:, None], (G, T)), atol=1e-6)
  np.testing.assert_array_equal(got[3], 0.0)  # A_E == 0 with one real rollout
  np.testing.assert_allclose(got[0, 0, 2], a_e[0, 0], atol=1e-6)
  np.testing.assert_array_equal(got[~mask], 0.0)


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1e8, 1e25, 1e38])
def test_csa_finite_for_extreme_inputs(scale):
  rng = np.random.default_rng(5)
  rewards = scale * rng.normal(size=(3, 4))
  logp = scale * rng.normal(size=(3, 4, 5))
  got = np.asarray(run(est_lib.csa_advantages, rewards, logp, np.ones((3, 4, 5))))
  assert np.all(np.isfinite(got))
  got = np.asarray(run(est_lib.episode_advantages, rewards, std_normalize=False))
  assert np.all(np.isfinite(got))


# ----------------------------------------------------------------------------------
# Properties (hypothesis). Values on a coarse grid so that ties are frequent.
# ----------------------------------------------------------------------------------


@st.composite
def csa_inputs(draw, B=3, G=5, T=6):
  # Fixed shapes (one compile); the mask varies the effective group sizes and lengths.
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  mask = rng.random((B, G, T)) < draw(st.sampled_from([0.3, 0.7, 1.0]))
  if draw(st.booleans()):  # exactly two real rollouts: l ties at every shared step
    mask[:, 2:] = False
  rewards = rng.choice([0.0, 0.5, 1.0], size=(B, G))
  logp = -0.5 * rng.integers(0, 9, size=(B, G, T))
  if draw(st.booleans()):
    logp = -rng.gamma(2.0, 2.0, size=(B, G, T))
  return rewards, logp, mask


SETTINGS = hypothesis.settings(max_examples=40, deadline=None, derandomize=True)


@SETTINGS
@hypothesis.given(csa_inputs())
def test_lam0_is_exactly_grpo(inputs):
  rewards, logp, mask = inputs
  got = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask, lam=0.0))
  grpo = np.asarray(run(est_lib.episode_advantages, rewards, valid_BxG=mask.any(-1)))
  np.testing.assert_array_equal(got[mask], np.broadcast_to(grpo[..., None], mask.shape)[mask])
  np.testing.assert_array_equal(got[~mask], 0.0)


@SETTINGS
@hypothesis.given(csa_inputs())
def test_padding_changes_no_real_entry(inputs):
  rewards, logp, mask = inputs
  pad_g, pad_t = 2, 3  # fixed: one more compile, not one per example
  B, G, T = mask.shape
  base = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask))
  big_mask = np.zeros((B, G + pad_g, T + pad_t), bool)
  big_mask[:, :G, :T] = mask
  big_logp = np.full(big_mask.shape, 123.0)  # arbitrary padding content
  big_logp[:, :G, :T] = logp
  big_rewards = np.full((B, G + pad_g), -7.0)
  big_rewards[:, :G] = rewards
  got = np.asarray(run(est_lib.csa_advantages, big_rewards, big_logp, big_mask))
  np.testing.assert_allclose(got[:, :G, :T], base, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(got[~big_mask], 0.0)


@SETTINGS
@hypothesis.given(csa_inputs(), st.integers(0, 2**31 - 1))
def test_permuting_rollouts_permutes_output(inputs, seed):
  rewards, logp, mask = inputs
  perm = np.random.default_rng(seed).permutation(mask.shape[1])
  base = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask))
  got = np.asarray(run(est_lib.csa_advantages, rewards[:, perm], logp[:, perm], mask[:, perm]))
  np.testing.assert_allclose(got, base[:, perm], atol=1e-5, rtol=1e-5)


@SETTINGS
@hypothesis.given(csa_inputs(), st.sampled_from(sorted(est_lib.list_estimators())))
def test_every_estimator_masked_zero_and_finite(inputs, name):
  rewards, logp, mask = inputs
  step_rewards = np.zeros(mask.shape)
  step_rewards[..., -1] = rewards
  state_id = (np.abs(logp) * 2).astype(np.int32)  # few distinct states, many ties
  invalid = (np.abs(logp) * 10).astype(np.int32) % 3 == 0  # some rejected, padding too
  got = np.asarray(run_est(
      name, rewards_BxG=rewards, logp_BxGxT=logp, mask_BxGxT=mask,
      step_rewards_BxGxT=step_rewards, state_id_BxGxT=state_id, invalid_BxGxT=invalid))
  assert got.shape == mask.shape
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[~mask], 0.0)


@SETTINGS
@hypothesis.given(csa_inputs())
def test_csa_matches_reference_on_grid(inputs):
  rewards, logp, mask = inputs
  got = run(est_lib.csa_advantages, rewards, logp, mask)
  np.testing.assert_allclose(got, ref_csa(rewards, logp, mask), atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------------
# The proposal's claim about per-rollout sums.
# ----------------------------------------------------------------------------------


def test_sum_claim_holds_exactly_over_the_group():
  """sum_{i,t} A[b,i,t] == sum_i L_i A_E[b,i] exactly (up to float32 rounding).

  A_S sums to 0 over the rollouts active at each step, so the step term cancels in the
  group total. This is the only sense in which the proposal's claim is exact.
  """
  rng = np.random.default_rng(6)
  B, G, T = 16, 8, 20
  mask = random_mask(rng, B, G, T)
  rewards = rng.integers(0, 2, size=(B, G)).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=(B, G, T))
  a_e, _ = run(est_lib.csa_components, rewards, logp, mask)
  a = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask, lam=0.5), np.float64)
  lengths = mask.sum(-1)
  # Summed in float64, the identity is exact but for each float32 entry's rounding: allow
  # one float32 ulp of the largest |A| per summed entry (measured: 2% of that, 7e-7).
  atol = mask.sum((1, 2)).max() * np.finfo(np.float32).eps * np.abs(a).max()
  np.testing.assert_allclose(a.sum((1, 2)), (lengths * np.asarray(a_e, np.float64)).sum(1),
                             rtol=0, atol=atol)


def _sum_claim(logp, rewards, lam=0.5):
  mask = np.ones(logp.shape, bool)
  a_e, _ = run(est_lib.csa_components, rewards, logp, mask)
  a_e = np.asarray(a_e, np.float64)
  total = np.asarray(run(est_lib.csa_advantages, rewards, logp, mask, lam=lam), np.float64).sum(-1)
  target = logp.shape[-1] * a_e
  live = np.abs(a_e) > 0
  rel = np.linalg.norm((total - target)[live]) / np.linalg.norm(target[live])
  flips = np.mean(np.sign(total[live]) != np.sign(a_e[live]))
  return rel, flips


@pytest.mark.parametrize("T", [5, 20, 50])
def test_sum_claim_per_rollout_is_approximate_only_for_independent_steps(T):
  """Measured: per rollout, sum_t A vs L * A_E (L = T steps, G = 8, lam = 0.5).

  The residual is lam * sum_t A_S. A_S has unit variance over the group at each step.
  - Log-probs independent across steps: the residual is a random walk, RMS about
    0.94 * lam * sqrt(L), so the relative RMS error ||sum_t A - L A_E|| / ||L A_E||
    falls like 1/sqrt(L): measured 0.22, 0.11, 0.072 for L = 5, 20, 50 (rel * sqrt(L)
    = 0.50, 0.50, 0.51). "Approximately" holds here, and better for long episodes.
  - Log-probs with a persistent per-rollout component (a rollout that is consistently
    more or less likely than its siblings, the common case for an LLM policy): the
    residual grows like L, the relative error stays at 0.48 for every L, and the sign of
    the rollout's total disagrees with A_E for about 2.5% of rollouts. The claim does
    not hold per rollout in this case.
  Exact only for the group total (test_sum_claim_holds_exactly_over_the_group).
  """
  rng = np.random.default_rng(7)
  B, G = 256, 8
  rewards = rng.integers(0, 2, size=(B, G)).astype(float)
  iid = -rng.gamma(2.0, 2.0, size=(B, G, T))
  rel, flips = _sum_claim(iid, rewards)
  assert 0.4 < rel * np.sqrt(T) < 0.6, rel
  assert flips < 0.002, flips
  persistent = -2.0 + rng.normal(size=(B, G, 1)) + 0.3 * rng.normal(size=(B, G, T))
  rel, flips = _sum_claim(persistent, rewards)
  assert 0.4 < rel < 0.55, rel
  assert 0.01 < flips < 0.05, flips


def test_sum_claim_counterexample_sign_flip():
  """A failed rollout that always takes the least likely action gets a positive total.

  One success among 8: A_E = -0.354 for each failure. If failure 1 has the lowest
  log-prob at every step, l = A_E * dev is largest for it, A_S is about +2.2 at every
  step, and A = -0.354 + 0.5 * 2.2 > 0: the whole failed episode is reinforced.
  """
  G, T = 8, 10
  rewards = np.zeros((1, G))
  rewards[0, 0] = 1.0
  rng = np.random.default_rng(8)
  logp = -1.0 - 0.1 * rng.random((1, G, T))
  logp[0, 1] = -6.0
  a = np.asarray(run(est_lib.csa_advantages, rewards, logp, np.ones((1, G, T)), lam=0.5))
  a_e = np.asarray(run(est_lib.episode_advantages, rewards))
  assert a_e[0, 1] < 0
  assert np.all(a[0, 1] > 0)
  assert a[0, 1].sum() > -T * a_e[0, 1]  # the total is positive, not a scaled A_E


# ----------------------------------------------------------------------------------
# Registry, broadcast, errors.
# ----------------------------------------------------------------------------------


def test_registry_uniform_signature_and_values():
  rng = np.random.default_rng(9)
  B, G, T = 3, 4, 5
  mask = random_mask(rng, B, G, T, holes=False)
  rewards = rng.normal(size=(B, G))
  logp = rng.normal(size=(B, G, T))
  step_rewards = rng.normal(size=(B, G, T))
  state_id = rng.integers(0, 3, size=(B, G, T)).astype(np.int32)
  kw = dict(rewards_BxG=rewards, logp_BxGxT=logp, mask_BxGxT=mask,
            step_rewards_BxGxT=step_rewards, state_id_BxGxT=state_id)
  valid = mask.any(-1)
  want = {
      "grpo": ref_episode(rewards, valid),
      "dr_grpo": ref_episode(rewards, valid, std_normalize=False),
      "rloo": ref_rloo(rewards, valid),
  }
  for name, ep in want.items():
    got = run_est(name, **kw)
    np.testing.assert_allclose(got, np.where(mask, ep[..., None], 0.0), atol=ATOL)
  got = run_est("csa", **kw, lam=0.25, ddof=0)
  np.testing.assert_allclose(got, ref_csa(rewards, logp, mask, lam=0.25, ddof=0),
                             atol=ATOL, rtol=RTOL)
  for name in ["grpo", "dr_grpo", "rloo", "csa"]:
    assert name in est_lib.list_estimators()


def test_registry_errors():
  with pytest.raises(ValueError, match="known: .*csa.*grpo"):
    est_lib.get_estimator("ppo")
  est = est_lib.get_estimator("csa")
  with pytest.raises(ValueError, match="unknown hparams \\['lamda'\\].*'lam'"):
    est(rewards_BxG=np.zeros((1, 2)), logp_BxGxT=np.zeros((1, 2, 3)),
        mask_BxGxT=np.ones((1, 2, 3)), lamda=0.1)
  with pytest.raises(ValueError, match="needs \\['logp_BxGxT'\\]"):
    est(rewards_BxG=np.zeros((1, 2)), mask_BxGxT=np.ones((1, 2, 3)))
  with pytest.raises(ValueError, match="needs the knobs \\['eps', 'ddof'\\]"):
    est(rewards_BxG=np.zeros((1, 2)), logp_BxGxT=np.zeros((1, 2, 3)),
        mask_BxGxT=np.ones((1, 2, 3)), lam=0.5)


def test_shape_errors():
  with pytest.raises(ValueError, match="rewards_BxG must have shape"):
    run(est_lib.episode_advantages, np.zeros(3))
  with pytest.raises(ValueError, match="logp_BxGxT has shape"):
    run(est_lib.csa_advantages, np.zeros((1, 2)), np.zeros((1, 2, 4)), np.ones((1, 2, 3)))
  with pytest.raises(ValueError, match="ddof"):
    run(est_lib.episode_advantages, np.zeros((1, 3)), ddof=-1)


# ----------------------------------------------------------------------------------
# GiGPO.
# ----------------------------------------------------------------------------------


def ref_gigpo(step_rewards, mask, state_id, gamma=0.95, w=1.0, std_normalize=True,
              eps=1e-6, ddof=1):
  """verl-agent style: Python loops and a dict of step groups per task group."""
  B, G, T = mask.shape
  returns = np.array([[sum(step_rewards[b, i, t] for t in range(T) if mask[b, i, t])
                       for i in range(G)] for b in range(B)])
  a_e = ref_episode(returns, mask.any(-1), eps, ddof, std_normalize)
  disc = np.zeros(mask.shape)
  for b in range(B):
    for i in range(G):
      running = 0.0
      for t in reversed(range(T)):
        if mask[b, i, t]:
          running = step_rewards[b, i, t] + gamma * running
          disc[b, i, t] = running
  out = np.zeros(mask.shape)
  for b in range(B):
    groups = {}
    for i in range(G):
      for t in range(T):
        if mask[b, i, t]:
          groups.setdefault(int(state_id[b, i, t]), []).append((i, t))
    for members in groups.values():
      a_s = ref_standardize([disc[b, i, t] for i, t in members], eps, ddof,
                            std_normalize)
      for (i, t), s in zip(members, a_s):
        out[b, i, t] = a_e[b, i] + w * s
  return out


def gigpo_batch(seed, B=4, G=5, T=8, n_states=4):
  rng = np.random.default_rng(seed)
  mask = random_mask(rng, B, G, T)
  step_rewards = np.where(rng.random((B, G, T)) < 0.3, rng.normal(size=(B, G, T)), 0.0)
  state_id = rng.integers(-n_states, n_states, size=(B, G, T)).astype(np.int32)
  state_id[~mask] = 0  # padding content is arbitrary; collide with real ids on purpose
  return step_rewards, mask, state_id


@pytest.mark.parametrize("std_normalize,ddof", [(True, 1), (False, 1), (True, 0)])
def test_gigpo_matches_reference(jit_mode, std_normalize, ddof):
  step_rewards, mask, state_id = gigpo_batch(10)
  got = run(est_lib.gigpo_advantages, step_rewards, mask, state_id, gamma=0.9, w=0.7,
                                 std_normalize=std_normalize, ddof=ddof)
  want = ref_gigpo(step_rewards, mask, state_id, gamma=0.9, w=0.7,
                   std_normalize=std_normalize, ddof=ddof)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_gigpo_hand_example():
  """Two rollouts pass through state 7 at different steps with different returns."""
  mask = np.ones((1, 2, 2), bool)
  state_id = np.array([[[7, 1], [3, 7]]], np.int32)
  step_rewards = np.array([[[0.0, 1.0], [0.0, 0.0]]])
  a_e, a_s, size = run(est_lib.gigpo_components, step_rewards, mask, state_id, gamma=0.5)
  # Episode returns 1, 0 -> A_E = +-0.5 / (std + eps), std = sqrt(1/2) (ddof 1). State 7:
  # returns 0.5 (i=0, t=0) and 0 -> +-0.25 / (sqrt(1/8) + eps). Exact up to float32
  # rounding, eps (1e-6) included: a 1e-4 tolerance would not see it.
  eps = 1e-6
  e, s7 = 0.5 / (np.sqrt(0.5) + eps), 0.25 / (np.sqrt(0.125) + eps)
  np.testing.assert_allclose(a_e, [[e, -e]], rtol=1e-6)
  np.testing.assert_allclose(a_s, [[[s7, 0.0], [0.0, -s7]]], rtol=1e-6, atol=0)
  np.testing.assert_array_equal(size, [[[2, 1], [1, 2]]])


@SETTINGS
@hypothesis.given(st.integers(0, 2**31 - 1))
def test_gigpo_invariances(seed):
  pad = 2
  step_rewards, mask, state_id = gigpo_batch(seed, B=3, G=4, T=5, n_states=3)
  base = np.asarray(run(est_lib.gigpo_advantages, step_rewards, mask, state_id))
  rng = np.random.default_rng(seed)
  # Renaming states (any injective map) changes nothing.
  renamed = (state_id * 7919 + 12345).astype(np.int32)
  np.testing.assert_allclose(run(est_lib.gigpo_advantages, step_rewards, mask, renamed), base,
                             atol=1e-5, rtol=1e-5)
  # Permuting rollouts permutes the output.
  perm = rng.permutation(4)
  got = run(est_lib.gigpo_advantages, step_rewards[:, perm], mask[:, perm], state_id[:, perm])
  np.testing.assert_allclose(got, base[:, perm], atol=1e-5, rtol=1e-5)
  # Padded rollouts and steps (with colliding ids) change no real entry.
  shape = (3, 4 + pad, 5 + pad)
  big = [np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, np.int32)]
  for x, small in zip(big, (step_rewards, mask, state_id)):
    x[:, :4, :5] = small
  big[0][~big[1]] = 5.0
  got = np.asarray(run(est_lib.gigpo_advantages, *big))
  np.testing.assert_allclose(got[:, :4, :5], base, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(got[~big[1]], 0.0)


def test_gigpo_state_id_must_be_integer():
  with pytest.raises(ValueError, match="state_id_BxGxT must hold integer ids"):
    run(est_lib.gigpo_advantages, np.zeros((1, 2, 3)), np.ones((1, 2, 3)), np.zeros((1, 2, 3)))


def test_csa_gigpo_is_both_terms():
  step_rewards, mask, state_id = gigpo_batch(11)
  logp = -np.random.default_rng(12).gamma(2.0, 2.0, size=mask.shape)
  est = lambda **kw: run_est("csa_gigpo", **kw)
  kw = dict(step_rewards_BxGxT=step_rewards, logp_BxGxT=logp, mask_BxGxT=mask,
            state_id_BxGxT=state_id, rewards_BxG=np.zeros(mask.shape[:2]))
  returns = np.where(mask, step_rewards, 0.0).sum(-1)
  gig = ref_gigpo(step_rewards, mask, state_id, gamma=0.9, w=0.5)
  csa = ref_csa(returns, logp, mask, lam=0.3)
  a_e = np.where(mask, ref_episode(returns, mask.any(-1))[..., None], 0.0)
  got = est(**kw, lam=0.3, gamma=0.9, w=0.5)
  np.testing.assert_allclose(got, gig + csa - a_e, atol=ATOL, rtol=RTOL)
  np.testing.assert_allclose(est(**kw, lam=0.0, gamma=0.9, w=0.5), gig, atol=ATOL)
  np.testing.assert_allclose(est(**kw, lam=0.3, w=0.0), csa, atol=ATOL, rtol=RTOL)
  np.testing.assert_allclose(
      run_est("gigpo", **kw, gamma=0.9, w=0.5), gig, atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------------
# DAPO helpers.
# ----------------------------------------------------------------------------------


def test_dynamic_sampling_keep(jit_mode):
  rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0.5, 0.5, 0.5, 0.2],
                      [1, 0, 0, 0]], float)
  valid = np.ones((5, 4), bool)
  valid[4, 1:] = False  # a single real rollout
  got = np.asarray(dapo.dynamic_sampling_keep(rewards, valid_BxG=valid))
  np.testing.assert_array_equal(got, [False, False, True, True, False])
  # Kept exactly where GRPO gives some non-zero advantage.
  ep = np.asarray(run(est_lib.episode_advantages, rewards, valid_BxG=valid))
  np.testing.assert_array_equal(got, np.any(ep != 0, axis=-1))


def ref_overlong(length, max_len, cache_len, factor):
  if length <= max_len - cache_len:
    return 0.0
  if length <= max_len:
    return factor * ((max_len - cache_len) - length) / cache_len
  return -factor


def test_overlong_penalty_matches_reference():
  lengths = np.arange(0, 30)
  got = np.asarray(dapo.overlong_penalty(lengths, max_len=20, cache_len=8, factor=0.5))
  want = [ref_overlong(l, 20, 8, 0.5) for l in lengths]
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert got[12] == 0.0 and got[20] == -0.5 and got[21] == -0.5


def test_shape_overlong_rewards_per_step_and_episode():
  rng = np.random.default_rng(13)
  mask = random_mask(rng, 3, 4, 5, holes=False)
  action_len = rng.integers(0, 40, size=(3, 4, 5))
  rewards = rng.normal(size=(3, 4))
  got = dapo.shape_overlong_rewards(rewards, action_len, mask, max_len=32,
                                       cache_len=16, per="step")
  want = rewards.copy()
  for b in range(3):
    for i in range(4):
      pens = [ref_overlong(action_len[b, i, t], 32, 16, 1.0) for t in range(5)
              if mask[b, i, t]]
      want[b, i] += sum(pens) / len(pens) if pens else 0.0
  np.testing.assert_allclose(got, want, atol=1e-5)
  got = dapo.shape_overlong_rewards(rewards, action_len, mask, max_len=100,
                                       cache_len=50, per="episode")
  totals = np.where(mask, action_len, 0).sum(-1)
  want = rewards + np.vectorize(lambda l: ref_overlong(l, 100, 50, 1.0))(totals)
  np.testing.assert_allclose(got, want, atol=1e-5)
  with pytest.raises(ValueError, match="per must be"):
    dapo.shape_overlong_rewards(rewards, action_len, mask, max_len=4, cache_len=2,
                                   per="token")
  with pytest.raises(ValueError, match="cache_len <= max_len"):
    dapo.overlong_penalty(3, max_len=4, cache_len=8)


# ----------------------------------------------------------------------------------
# csa_state: CSA's step term over anchor-state groups.
# ----------------------------------------------------------------------------------


def ref_csa_state(rewards, logp, mask, state_id, lam=0.5, eps=1e-6, ddof=1):
  """Loops: per task group, the active steps with equal state ids form a group; within
  it dev = logp - mean logp, l = A_E * dev, A_S = standardised l (the CSA tie rules)."""
  B, G, T = mask.shape
  a_e = ref_episode(rewards, mask.any(-1), eps, ddof)
  out = np.zeros(mask.shape)
  for b in range(B):
    groups = {}
    for i in range(G):
      for t in range(T):
        if mask[b, i, t]:
          groups.setdefault(int(state_id[b, i, t]), []).append((i, t))
    for members in groups.values():
      lps = [float(logp[b, i, t]) for i, t in members]
      mean_lp = sum(lps) / len(lps)
      ls = [a_e[b, i] * (lp - mean_lp) for (i, _), lp in zip(members, lps)]
      atol = L_TIE_ATOL * max(abs(a_e[b, i]) for i, _ in members) * max(map(abs, lps))
      a_s = ref_standardize(ls, eps, ddof, atol=atol)
      for (i, t), s in zip(members, a_s):
        out[b, i, t] = a_e[b, i] + lam * s
  return out


@pytest.mark.parametrize("lam,ddof,n_states", [(0.5, 1, 3), (1.0, 1, 6), (0.3, 0, 2)])
def test_csa_state_matches_reference(jit_mode, lam, ddof, n_states):
  _, mask, state_id = gigpo_batch(20 + n_states, B=4, G=6, T=7, n_states=n_states)
  rng = np.random.default_rng(30 + n_states)
  rewards = rng.integers(0, 2, size=mask.shape[:2]).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=mask.shape)
  logp[~mask] = np.nan  # padding content must never leak
  got = run(est_lib.csa_state_advantages, rewards, logp, mask, state_id, lam=lam, ddof=ddof)
  want = ref_csa_state(rewards, logp, mask, state_id, lam=lam, ddof=ddof)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_csa_state_with_step_index_states_is_csa():
  """Ids that put each step index in a group of its own: exactly CSA's comparison sets."""
  rng = np.random.default_rng(40)
  B, G, T = 3, 8, 6
  mask = random_mask(rng, B, G, T)
  rewards = rng.integers(0, 2, size=(B, G)).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=(B, G, T))
  by_step = np.broadcast_to(np.arange(T, dtype=np.int32), (B, G, T))
  got = run(est_lib.csa_state_advantages, rewards, logp, mask, by_step, lam=0.7)
  np.testing.assert_allclose(got, run(est_lib.csa_advantages, rewards, logp, mask, lam=0.7),
                             atol=1e-5, rtol=1e-5)


def test_csa_state_hand_example():
  """Two rollouts (won, lost) share the start state 5 and then sit in states of their
  own: the step term lives only at state 5, singletons get A_S = 0."""
  mask = np.ones((1, 2, 2), bool)
  state_id = np.array([[[5, 1], [5, 2]]], np.int32)
  rewards = np.array([[1.0, 0.0]])
  logp = np.array([[[-0.5, -1.0], [-2.5, -3.0]]])
  a_e, a_s = run(est_lib.csa_state_components, rewards, logp, mask, state_id)
  eps = 1e-6
  e = 0.5 / (np.sqrt(0.5) + eps)
  np.testing.assert_allclose(a_e, [[e, -e]], rtol=1e-6)
  # State 5: dev = +1, -1; l = e * 1, -e * -1 = e, e: tied, A_S = 0 (CSA's two-rollout
  # rule). Both other states are singletons.
  np.testing.assert_array_equal(a_s, 0.0)
  # Three steps in state 5 (rollout 0 twice): dev = (-0.5, -1.0, -2.5) - (-4/3).
  state_id = np.array([[[5, 5], [5, 2]]], np.int32)
  a_e, a_s = run(est_lib.csa_state_components, rewards, logp, mask, state_id)
  dev = np.array([-0.5, -1.0, -2.5]) + 4.0 / 3.0
  l = np.array([e, e, -e]) * dev
  want = (l - l.mean()) / (l.std(ddof=1) + eps)
  np.testing.assert_allclose(np.asarray(a_s)[0][[0, 0, 1], [0, 1, 0]], want, rtol=1e-5)
  assert np.asarray(a_s)[0, 1, 1] == 0.0


@SETTINGS
@hypothesis.given(st.integers(0, 2**31 - 1))
def test_csa_state_lam0_is_grpo_and_invariances(seed):
  _, mask, state_id = gigpo_batch(seed, B=3, G=4, T=5, n_states=3)
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=mask.shape[:2])
  logp = -rng.gamma(2.0, 2.0, size=mask.shape)
  grpo = run_est("grpo", rewards_BxG=rewards, mask_BxGxT=mask)
  got0 = run(est_lib.csa_state_advantages, rewards, logp, mask, state_id, lam=0.0)
  np.testing.assert_array_equal(np.asarray(got0), np.asarray(grpo))
  base = np.asarray(run(est_lib.csa_state_advantages, rewards, logp, mask, state_id))
  renamed = (state_id * 7919 + 12345).astype(np.int32)
  np.testing.assert_allclose(run(est_lib.csa_state_advantages, rewards, logp, mask, renamed),
                             base, atol=1e-5, rtol=1e-5)
  perm = rng.permutation(4)
  got = run(est_lib.csa_state_advantages, rewards[:, perm], logp[:, perm], mask[:, perm],
                                     state_id[:, perm])
  np.testing.assert_allclose(got, base[:, perm], atol=1e-5, rtol=1e-5)


def test_csa_state_registered_with_the_uniform_signature():
  est = est_lib.get_estimator("csa_state")
  assert est.requires == ("rewards_BxG", "logp_BxGxT", "mask_BxGxT", "state_id_BxGxT")
  _, mask, state_id = gigpo_batch(50)
  rng = np.random.default_rng(51)
  rewards, logp = rng.normal(size=mask.shape[:2]), -rng.gamma(2.0, 2.0, size=mask.shape)
  got = run_est("csa_state", rewards_BxG=rewards, logp_BxGxT=logp, mask_BxGxT=mask,
                state_id_BxGxT=state_id, step_rewards_BxGxT=np.zeros(mask.shape), lam=0.25)
  np.testing.assert_allclose(got, ref_csa_state(rewards, logp, mask, state_id, lam=0.25),
                             atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------------
# csa_valid: CSA's step term over the accepted actions only.


def ref_csa_where(rewards, logp, mask, keep, lam=0.5, eps=1e-6, ddof=1):
  """Loops: A_E over the rollouts with an active step; at each step t the comparison set
  is the rollouts active at t where keep(b, i, t); every other active step gets A_E alone."""
  B, G, T = mask.shape
  a_e = ref_episode(rewards, mask.any(-1), eps, ddof)
  out = np.where(mask, a_e[..., None], 0.0)
  for b in range(B):
    for t in range(T):
      act = [i for i in range(G) if mask[b, i, t] and keep(b, i, t)]
      if not act:
        continue
      mean_lp = sum(logp[b, i, t] for i in act) / len(act)
      ls = [a_e[b, i] * (logp[b, i, t] - mean_lp) for i in act]
      atol = L_TIE_ATOL * max(abs(a_e[b, i]) for i in act) * max(abs(logp[b, i, t]) for i in act)
      for i, s in zip(act, ref_standardize(ls, eps, ddof, atol=atol)):
        out[b, i, t] = a_e[b, i] + lam * s
  return out


def ref_csa_valid(rewards, logp, mask, invalid, **knobs):
  """csa_valid: the step term over the accepted actions only; a rejected step gets A_E."""
  return ref_csa_where(rewards, logp, mask, lambda b, i, t: not invalid[b, i, t], **knobs)


@pytest.mark.parametrize("lam,ddof", [(0.5, 1), (1.0, 0)])
def test_csa_valid_matches_reference_and_is_csa_without_rejections(jit_mode, lam, ddof):
  """Catches a rejected step left in its step's comparison set or given a step term, the
  invalid flag inverted, or A_E taken over the accepted steps' rollouts only."""
  rng = np.random.default_rng(61 + ddof)
  mask = random_mask(rng, 5, 6, 7)
  rewards = rng.integers(0, 2, size=mask.shape[:2]).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=mask.shape)
  invalid = rng.random(mask.shape) < 0.3
  invalid[0, 0] = mask[0, 0]  # a rollout whose every action was rejected still has its A_E
  got = np.asarray(run(est_lib.csa_valid_advantages, rewards, logp, mask, invalid, lam=lam,
                                                ddof=ddof))
  np.testing.assert_allclose(got, ref_csa_valid(rewards, logp, mask, invalid, lam=lam,
                                                ddof=ddof), atol=ATOL, rtol=RTOL)
  a_e = ref_episode(rewards, mask.any(-1), 1e-6, ddof)
  sel = mask & invalid
  np.testing.assert_allclose(got[sel], np.broadcast_to(a_e[..., None], mask.shape)[sel],
                             atol=ATOL, rtol=RTOL)
  none = np.asarray(run(est_lib.csa_valid_advantages, rewards, logp, mask, np.zeros_like(mask),
                                                 lam=lam, ddof=ddof))
  # No rejection: CSA's arithmetic, compiled as another program (XLA fuses the extra mask
  # differently: under jit a few values differ by 1-3 ulp at the advantages' unit scale,
  # none without jit).
  np.testing.assert_allclose(none, np.asarray(run(est_lib.csa_advantages, 
      rewards, logp, mask, lam=lam, ddof=ddof)), rtol=1e-6, atol=1e-6)


def test_csa_valid_reaches_compute_advantages_with_the_rollouts_invalid_flags():
  """Catches the trainer's path (algorithms/estimator.py) not passing the rollouts'
  invalid flags to an estimator that needs them."""
  from csa_jax.algorithms.estimator import compute_advantages
  from csa_jax.config import AlgoConfig, RolloutConfig
  from csa_jax.rollout.groups import GroupArrays
  rng = np.random.default_rng(70)
  mask = random_mask(rng, 3, 4, 5, holes=False)
  invalid = (rng.random(mask.shape) < 0.3) & mask
  arrays = GroupArrays(
      rewards_BxG=rng.integers(0, 2, size=(3, 4)).astype(np.float32),
      logp_BxGxT=(-rng.gamma(2.0, 2.0, size=mask.shape)).astype(np.float32), mask_BxGxT=mask,
      step_rewards_BxGxT=np.zeros(mask.shape, np.float32),
      state_id_BxGxT=np.zeros(mask.shape, np.int32),
      oracle_BxGxT=np.full(mask.shape, np.nan, np.float32),
      action_len_BxGxT=np.ones(mask.shape, np.int32), invalid_BxGxT=invalid)
  algo = AlgoConfig(estimator="csa_valid", lam=0.5, invalid_penalty=0.0)
  got = compute_advantages(arrays, algo, RolloutConfig())
  want = ref_csa_valid(arrays.rewards_BxG.astype(float), arrays.logp_BxGxT.astype(float),
                       mask, invalid)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
  assert est_lib.get_estimator("csa_valid").requires[-1] == "invalid_BxGxT"


# ----------------------------------------------------------------------------------
# csa_decisive / csa_routine: CSA's step term on chosen step indices, or on the others.


def ref_csa_on_steps(rewards, logp, mask, steps, inside, **knobs):
  """The step term at the step indices in `steps` (inside) or at all others (not inside);
  A_E alone at every other step."""
  return ref_csa_where(rewards, logp, mask, lambda b, i, t: (t in steps) == inside, **knobs)


@pytest.mark.parametrize("steps", [(0,), (0, 3), (), (2, 40)])
@pytest.mark.parametrize("lam,ddof", [(0.5, 1), (1.0, 0)])
def test_csa_decisive_and_routine_match_reference(jit_mode, steps, lam, ddof):
  """Catches the step term kept on the wrong steps (the index set inverted, a step index
  read as a rollout index), a step left out of its own comparison set, or A_E taken over
  the kept steps' rollouts only."""
  rng = np.random.default_rng(80 + ddof)
  mask = random_mask(rng, 4, 6, 7)
  rewards = rng.integers(0, 2, size=mask.shape[:2]).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=mask.shape)
  logp[~mask] = np.nan  # padding content must never leak
  for fn, inside in ((est_lib.csa_decisive_advantages, True),
                     (est_lib.csa_routine_advantages, False)):
    got = np.asarray(fn(rewards, logp, mask, lam=lam, eps=1e-6, ddof=ddof,
                        decisive_steps=steps))
    want = ref_csa_on_steps(rewards, logp, mask, steps, inside, lam=lam, ddof=ddof)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_csa_decisive_and_routine_split_csas_step_term():
  """Their step terms add up to CSA's (each step index is in one of the two sets), and each
  is GRPO where its set is empty or holds every step."""
  rng = np.random.default_rng(90)
  mask = random_mask(rng, 3, 8, 6, holes=False)
  rewards = rng.integers(0, 2, size=mask.shape[:2]).astype(float)
  logp = -rng.gamma(2.0, 2.0, size=mask.shape)
  knobs = dict(lam=0.5, eps=1e-6, ddof=1)
  grpo = np.asarray(run_est("grpo", rewards_BxG=rewards, mask_BxGxT=mask))
  csa = np.asarray(est_lib.csa_advantages(rewards, logp, mask, **knobs))
  for steps in [(0,), (1, 4)]:
    dec = np.asarray(est_lib.csa_decisive_advantages(rewards, logp, mask, **knobs,
                                                     decisive_steps=steps))
    rou = np.asarray(est_lib.csa_routine_advantages(rewards, logp, mask, **knobs,
                                                    decisive_steps=steps))
    np.testing.assert_allclose(dec + rou - grpo, csa, atol=1e-5, rtol=1e-5)
    assert np.abs(dec - grpo).max() > 1e-3 and np.abs(rou - grpo).max() > 1e-3
  every = tuple(range(6))
  np.testing.assert_allclose(est_lib.csa_decisive_advantages(
      rewards, logp, mask, **knobs, decisive_steps=()), grpo, atol=1e-6)
  np.testing.assert_allclose(est_lib.csa_routine_advantages(
      rewards, logp, mask, **knobs, decisive_steps=every), grpo, atol=1e-6)
  np.testing.assert_allclose(est_lib.csa_routine_advantages(
      rewards, logp, mask, **knobs, decisive_steps=()), csa, atol=1e-6)


def test_csa_t0_and_csa_routine_experiments_select_the_decisive_step_of_keydoor():
  """The horizon study's mechanism arms: keydoor_h4_csa_t0 keeps CSA's step term on the key
  room (t = 0) alone, keydoor_h4_csa_routine on every later step."""
  import experiments
  t0 = experiments.get_experiment("keydoor_h4_csa_t0").algo
  routine = experiments.get_experiment("keydoor_h4_csa_routine").algo
  assert (t0.estimator, t0.decisive_steps) == ("csa_decisive", (0,))
  assert (routine.estimator, routine.decisive_steps) == ("csa_routine", (0,))
  assert t0.lam == routine.lam == experiments.get_experiment("keydoor_h4_csa").algo.lam


# ----------------------------------------------------------------------------------
# The registry's refusals, when an estimator registers.


def test_registration_refuses_what_would_never_be_set_or_used():
  """Catches a duplicate name, an input the trainer never passes, a knob that is no config
  field (a typo would fall back to its default) and a knob with a default of its own (a
  second home beside the config's); nothing refused is left in the registry."""
  cases = [
      ("csa", lambda rewards_BxG, mask_BxGxT: None, "registered twice"),
      ("probe_input", lambda rewards_BxG, advantages_BxGxT: None,
       r"unknown inputs \['advantages_BxGxT'\]"),
      ("probe_args", lambda rewards_BxG, *arrays: None, r"\['arrays'\] are neither"),
      ("probe_default", lambda rewards_BxG, *, lam=0.5: None, r"defaults to \['lam'\]"),
  ]
  for name, fn, match in cases:
    with pytest.raises(ValueError, match=match):
      est_lib.register(name)(fn)
    assert name == "csa" or name not in est_lib.list_estimators()
  assert est_lib.get_estimator("csa").fn is est_lib.csa_advantages
