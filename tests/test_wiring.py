"""Wiring: each knob and each second parameter set reaches the update, on inputs where the
alternatives differ (issue 27).

Each function here is right and tested alone elsewhere; what these tests see is which
value a caller passes. A test whose two inputs are equal (ratio 1, a reference equal to
the policy, a PRM equal to the policy, `ref_params = params`) cannot tell them apart, so
every test below first checks that its inputs separate the right wiring from the wrong one
(the "alternatives differ" assertions), then checks the code against a NumPy or
plain-Python reference. Each test's docstring names the one-line bug it catches.

`test_every_algo_field_has_a_wiring_test` lists every field of `AlgoConfig` with the
tests that check it reaches its consumer; a new field fails it until it is listed.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax import estimators as est_lib
from csa_jax.algo_config import IStarConfig, MDPOConfig
from csa_jax.algorithms import base, estimator as estimator_lib, istar, mtdpo
from csa_jax.config import AlgoConfig, ExperimentConfig, RolloutConfig
from csa_jax.model import Decoder, ModelConfig
from csa_jax.model.sampling import SamplingConfig, sampling_logprobs
from csa_jax.rollout import groups
from csa_jax.rollout.groups import GroupArrays
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts
from tests.factories import ACT, PROMPT, episode, method_config, random_episodes, step

# ----------------------------------------------------------------------------------------
# The clipped loss of make_rl_loss against a NumPy reference.

V = 64
MODEL = ModelConfig.tiny(vocab_size=V, max_seq_len=32, hidden_size=16, intermediate_size=32,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
SCFG = SamplingConfig(max_new_tokens=4)
# Ratios exp(delta) of 0.55, 0.78, 1.28, 1.82 and 3.3: with clip_low 0.1 and clip_high 0.4
# both sides clip, 1.28 lies between 1 + clip_low and 1 + clip_high (so a swapped range
# moves it), and 3.3 passes a dual clip of 2 for negative advantages.
DELTAS = np.array([-0.6, -0.25, 0.25, 0.6, 1.2])
BASE = dict(clip_low=0.1, clip_high=0.4, dual_clip=0.0, kl_coef=0.0, kl_kind="k3",
            entropy_coef=0.0, loss_agg="token-mean")
RTOL = 1e-5


def _perturbed(params, seed, scale=0.5):
  """Each leaf scaled by its own 1 + scale * N(0, 1): a parameter set unlike `params`."""
  noise = iter(np.random.default_rng(seed).normal(size=(len(jax.tree.leaves(params)),)))
  # In NumPy (float32, the same rounding): a device op per leaf shape compiles a program each.
  return jax.tree.map(lambda x: np.asarray(x) * np.float32(1.0 + scale * next(noise)), params)


def _log_softmax64(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def loss_inputs():
  """A batch of 6 rows with ratios on both sides of the clip range, mixed-sign advantages
  and a reference unlike the policy; NumPy copies of the policy's and the reference's
  float64 log-probs and token entropies."""
  graphdef, params = nnx.split(Decoder(MODEL, rngs=nnx.Rngs(0)), nnx.Param)
  rng = np.random.default_rng(0)
  rows = []
  for i in range(6):
    p = rng.integers(2, V, size=int(rng.integers(3, 7))).tolist()
    a = rng.integers(2, V, size=int(rng.integers(1, 4))).tolist() + [1]
    rows.append({"prompt_ids": p, "action_ids": a, "old_logps": [0.0] * len(a),
                 "advantage": float([1.5, -1.0, 0.7, -2.0, 1.0, -0.5][i])})
  batch = {k: np.stack([data_lib.row_arrays(r, 12, 4)[k] for r in rows])
           for k in data_lib.BATCH_KEYS}
  jb = {k: jnp.asarray(v) for k, v in batch.items()}
  mask = batch["loss_mask"] > 0

  logits = jax.jit(lambda p: ts.action_logits(graphdef, p, jb))

  def logp_and_entropy(p):
    z = np.asarray(logits(p))
    lp = _log_softmax64(z)
    ent = -(np.exp(lp) * lp).sum(-1)
    return np.take_along_axis(lp, batch["targets"][..., None], -1)[..., 0], ent

  logp, ent = logp_and_entropy(params)
  # Every real token gets one of the ratios (each appears with both advantage signs).
  delta = np.where(mask, DELTAS[np.arange(mask.size).reshape(mask.shape) % len(DELTAS)], 0.0)
  batch["old_logp"] = np.where(mask, logp - delta, 0.0).astype(np.float32)
  jb["old_logp"] = jnp.asarray(batch["old_logp"])
  # Far from the policy (log-ratios of order 1: its output layer is 100x sharper), so that
  # k1, k2 and k3 differ.
  ref = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 100.0 if "lm_head" in jax.tree_util.keystr(path) else x,
      _perturbed(params, 5))
  ref_logp, _ = logp_and_entropy(ref)
  return dict(graphdef=graphdef, params=params, ref=ref, batch=jb, mask=mask,
              logp=logp, ent=ent, ref_logp=ref_logp,
              old=batch["old_logp"].astype(np.float64), adv=batch["adv"].astype(np.float64))


def _np_agg(x, mask, agg):
  x = np.where(mask, x, 0.0)
  n = mask.sum(-1)
  if agg == "token-mean":
    return x.sum() / max(mask.sum(), 1)
  if agg == "seq-mean-token-mean":
    row = x.sum(-1) / np.maximum(n, 1)
  elif agg == "seq-mean-token-sum":
    row = x.sum(-1)
  else:  # seq-mean-token-sum-norm: over the padded row length
    row = x.sum(-1) / mask.shape[-1]
  return row[n > 0].mean()


def np_rl_loss(d, *, clip_low, clip_high, dual_clip, kl_coef, kl_kind, entropy_coef,
               loss_agg):
  """The loss make_rl_loss should compute, written out in float64."""
  mask = d["mask"]
  adv = np.where(mask, d["adv"], 0.0)  # [N, A]: the row's advantage on its action tokens
  r = np.exp(np.where(mask, d["logp"] - d["old"], 0.0))
  pg = np.maximum(-adv * r, -adv * np.clip(r, 1 - clip_low, 1 + clip_high))
  if dual_clip:
    pg = np.where((adv < 0) & (pg > -adv * dual_clip), -adv * dual_clip, pg)
  loss = _np_agg(pg, mask, loss_agg)
  loss -= entropy_coef * _np_agg(d["ent"], mask, "token-mean")
  if kl_coef:
    x = np.where(mask, d["ref_logp"] - d["logp"], 0.0)
    k = {"k1": -x, "k2": 0.5 * x * x, "k3": np.expm1(x) - x}[kl_kind]
    loss += kl_coef * _np_agg(k, mask, loss_agg)
  return loss


def _jax_loss(d, **knobs):
  algo = AlgoConfig(**knobs)
  loss, m = ts.make_rl_loss(d["graphdef"], algo, SCFG)(d["params"], d["batch"], d["ref"])
  return float(loss), m


def _differs(a, b):
  return abs(a - b) > 100 * RTOL * max(abs(a), abs(b), 1e-3)


def test_the_loss_inputs_clip_on_both_sides(loss_inputs):
  """Guards the other loss tests: with these inputs both sides of the range clip, tokens
  between 1 + clip_low and 1 + clip_high exist, and the dual clip binds."""
  _, m = _jax_loss(loss_inputs, **(BASE | {"dual_clip": 2.0}))
  assert float(m["clip_frac_low"]) > 0.1 and float(m["clip_frac_high"]) > 0.1
  assert float(m["dual_clip_frac"]) > 0
  r = np.exp(loss_inputs["logp"] - loss_inputs["old"])[loss_inputs["mask"]]
  assert ((r > 1.1) & (r < 1.4)).any()
  x = (loss_inputs["ref_logp"] - loss_inputs["logp"])[loss_inputs["mask"]]
  assert np.abs(x).mean() > 0.5  # a reference unlike the policy


@pytest.mark.parametrize("knobs", [
    {},
    {"clip_low": 0.3, "clip_high": 0.15},
    {"dual_clip": 2.0},
    {"entropy_coef": 0.05},
    {"kl_coef": 0.2, "kl_kind": "k1"},
    {"kl_coef": 0.2, "kl_kind": "k2"},
    {"kl_coef": 0.2, "kl_kind": "k3"},
    {"loss_agg": "seq-mean-token-mean"},
    {"loss_agg": "seq-mean-token-sum"},
    {"loss_agg": "seq-mean-token-sum-norm", "kl_coef": 0.2},
], ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "base")
def test_rl_loss_matches_numpy_for_each_knob(loss_inputs, knobs):
  """Catches a loss knob that does not reach `losses.clipped_policy_loss` / `kl_penalty`
  as configured: clip_low passed as clip_high (or the reverse), the dual clip dropped, the
  entropy bonus added instead of subtracted, the KL term subtracted instead of added or
  of the wrong kind, the aggregation mode not passed (to the PG or to the KL term)."""
  cfg = BASE | knobs
  want = np_rl_loss(loss_inputs, **cfg)
  got, _ = _jax_loss(loss_inputs, **cfg)
  np.testing.assert_allclose(got, want, rtol=RTOL)


# Each one-line wiring bug, as the config the buggy code would effectively run: the
# reference loss under it must differ from the right one on these inputs.
_WRONG_WIRING = {
    "clip_high <- clip_low": lambda c: c | {"clip_high": c["clip_low"]},
    "clip_low <- clip_high": lambda c: c | {"clip_low": c["clip_high"]},
    "dual clip dropped": lambda c: c | {"dual_clip": 0.0},
    "entropy added": lambda c: c | {"entropy_coef": -c["entropy_coef"]},
    "KL subtracted": lambda c: c | {"kl_coef": -c["kl_coef"]},
    "KL kind k3 -> k1": lambda c: c | {"kl_kind": "k1"},
    "KL kind k3 -> k2": lambda c: c | {"kl_kind": "k2"},
    "loss_agg ignored": lambda c: c | {"loss_agg": "token-mean"},
}


@pytest.mark.parametrize("bug, knobs", [
    ("clip_high <- clip_low", {}),
    ("clip_low <- clip_high", {}),
    ("dual clip dropped", {"dual_clip": 2.0}),
    ("entropy added", {"entropy_coef": 0.05}),
    ("KL subtracted", {"kl_coef": 0.2}),
    ("KL kind k3 -> k1", {"kl_coef": 0.2}),
    ("KL kind k3 -> k2", {"kl_coef": 0.2}),
    ("loss_agg ignored", {"loss_agg": "seq-mean-token-sum"}),
])
def test_the_loss_inputs_tell_each_wiring_bug_apart(loss_inputs, bug, knobs):
  """Guards test_rl_loss_matches_numpy_for_each_knob: on its inputs, each wiring bug
  changes the loss by far more than the tolerance (so that test would fail)."""
  cfg = BASE | knobs
  assert _differs(np_rl_loss(loss_inputs, **cfg), np_rl_loss(loss_inputs, **_WRONG_WIRING[bug](cfg)))


def test_kl_term_pulls_the_policy_towards_the_reference(loss_inputs):
  """Catches the KL term subtracted instead of added (or its gradient taken w.r.t. the
  wrong side): with zero advantages the loss is kl_coef * KL(pi || ref) with a reference
  unlike the policy, so a small step down its gradient must lower the KL."""
  d = loss_inputs
  batch = dict(d["batch"], adv=jnp.zeros_like(d["batch"]["adv"]))
  loss_fn = ts.make_rl_loss(d["graphdef"], AlgoConfig(**(BASE | {"kl_coef": 0.5})), SCFG)
  (loss, m), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(d["params"], batch,
                                                                         d["ref"])
  assert float(m["kl_ref"]) > 1e-3
  np.testing.assert_allclose(float(loss), 0.5 * float(m["kl_ref"]), rtol=RTOL)
  stepped = jax.tree.map(lambda p, g: p - 0.05 * g, d["params"], grads)
  _, m2 = loss_fn(stepped, batch, d["ref"])
  assert float(m2["kl_ref"]) < float(m["kl_ref"])


# ----------------------------------------------------------------------------------------
# The update loop: epochs, minibatch size, the reference the step gets.


def test_update_runs_epochs_of_minibatches_and_passes_the_reference():
  """Catches `Algorithm.update` ignoring algo.epochs or algo.minibatch_size (or using one
  for the other), or handing the step something other than the KL reference it was
  given: a fake step counts the batches, the rows and the reference it sees."""
  rows = [{"prompt_ids": [2, 3 + i], "action_ids": [5, 1], "old_logps": [0.0, 0.0],
           "advantage": float(i + 1)} for i in range(10)]
  cfg = ExperimentConfig(algo=AlgoConfig(epochs=3, minibatch_size=4))
  ctx = base.Context(
      cfg=cfg, graphdef=None, tx=None, sampling_cfg=SCFG,
      batches=lambda r, bs, *, seed, epochs: data_lib.batches(
          r, batch_size=bs, seq_len=8, action_len=4, pad_id=0, seed=seed, epochs=epochs),
      to_device=lambda b: b, pad_id=0, play=None, workdir="")
  ref = object()
  seen = []

  def step(state, batch, ref_params):
    assert ref_params is ref
    seen.append(batch["adv"][:, 0].copy())
    return state + 1, {"nonfinite_loss": 0.0, "nonfinite_grad": 0.0}

  prep = base.Prepared(rows=rows, aux={}, metrics={})
  state, _ = base.Algorithm().update(ctx, step, 0, prep, 0, ref)
  assert state == 3 * 3 and all(a.shape == (4,) for a in seen)  # 10 rows -> 3 batches of 4
  advs = np.concatenate(seen)
  assert sorted(advs[advs != 0].tolist()) == sorted(list(range(1, 11)) * 3)


# ----------------------------------------------------------------------------------------
# The advantage knobs: compute_advantages forwards each one the estimator declares.


def _adv_arrays():
  rng = np.random.default_rng(3)
  B, G, T = 2, 4, 5
  lens = rng.integers(1, T + 1, size=(B, G))
  mask = np.arange(T)[None, None] < lens[..., None]
  won = (rng.random((B, G)) < 0.5).astype(np.float32)
  won[:, 0], won[:, 1] = 1.0, 0.0  # mixed groups
  step_r = np.zeros((B, G, T), np.float32)
  step_r[np.arange(B)[:, None], np.arange(G)[None], lens - 1] = won
  step_r += np.where(mask, rng.normal(scale=0.3, size=(B, G, T)), 0).astype(np.float32)
  logp = np.where(mask, -rng.random((B, G, T)) * 3, 0).astype(np.float32)
  state_id = rng.integers(0, 3, (B, G, T)).astype(np.int32)
  # Some rejected actions, so that csa_valid (which leaves them out of its step term)
  # differs from csa here.
  invalid = mask & (rng.random((B, G, T)) < 0.25)
  return GroupArrays(won, logp, mask, step_r, state_id, np.full((B, G, T), np.nan, np.float32),
                     np.where(mask, 3, 0).astype(np.int32), invalid)


# A second value for each knob, far enough from the default to move the advantages.
_KNOB_VALUES = {"lam": 0.9, "gamma": 0.5, "w": 0.3, "eps": 0.5, "std_normalize": False,
                "ddof": 0, "decisive_steps": (1, 3)}
_ESTIMATOR_KNOBS = [(name, knob) for name in est_lib.list_estimators()
                    for knob in est_lib.get_estimator(name).hparams]


@pytest.mark.parametrize("name, knob", _ESTIMATOR_KNOBS)
def test_compute_advantages_forwards_each_estimator_knob(name, knob):
  """Catches an estimator knob (lam, gamma, w, eps, std_normalize, ddof, decisive_steps) that
  `estimator.compute_advantages` drops, leaves at the estimator's default or passes under
  another name, and an `algo.estimator` that does not pick the estimator: the advantages
  equal the estimator's own at the configured value, which differ from its default's."""
  assert knob in {f.name for f in dataclasses.fields(AlgoConfig)}, knob
  arrays, roll = _adv_arrays(), RolloutConfig(max_turns=5)
  algo = AlgoConfig(estimator=name, invalid_penalty=0.0, **{knob: _KNOB_VALUES[knob]})
  est = est_lib.get_estimator(name)
  hp = {k: getattr(algo, k) for k in est.hparams}
  inputs = dict(rewards_BxG=arrays.rewards_BxG, logp_BxGxT=arrays.logp_BxGxT,
                mask_BxGxT=arrays.mask_BxGxT, step_rewards_BxGxT=arrays.step_rewards_BxGxT,
                state_id_BxGxT=arrays.state_id_BxGxT, invalid_BxGxT=arrays.invalid_BxGxT)
  want = np.asarray(est(**inputs, **hp))
  default = np.asarray(est(**inputs, **(hp | {knob: getattr(AlgoConfig(), knob)})))
  assert np.abs(want - default).max() > 1e-3  # the knob matters on these inputs
  got = estimator_lib.compute_advantages(arrays, algo, roll)
  np.testing.assert_array_equal(got, want)


def test_every_estimator_is_reachable_and_they_differ():
  """Catches `algo.estimator` not reaching `compute_advantages` (every name giving one
  estimator's advantages): every registered estimator gives a different result here."""
  arrays, roll = _adv_arrays(), RolloutConfig(max_turns=5)
  outs = {n: estimator_lib.compute_advantages(arrays, AlgoConfig(estimator=n), roll)
          for n in est_lib.list_estimators()}
  names = sorted(outs)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      assert np.abs(outs[a] - outs[b]).max() > 1e-3, (a, b)


@pytest.mark.parametrize("row_weight", ["step", "episode"])
def test_row_weight_reaches_the_rows(row_weight):
  """Catches `algo.row_weight` not reaching `groups.rl_rows` from the estimator method's
  prepare: with episodes of 1, 2 and 4 steps, "episode" scales each row's advantage by
  mean_len / len(its episode) and "step" leaves it."""
  rng = np.random.default_rng(1)
  trajs = [episode([step((2, 3), (4, 1), (-0.5, -0.1), valid=bool(rng.random() < 0.5))
                    for _ in range(n)], won=won) for n, won in [(1, True), (2, False), (4, False)]]
  cfg = ExperimentConfig(rollout=RolloutConfig(tasks_per_iter=1, group_size=3, max_turns=4),
                         algo=AlgoConfig(estimator="grpo", row_weight=row_weight))
  gb = groups.from_episodes(trajs, 3, 4)
  arrays = gb.arrays
  ctx = base.Context(cfg=cfg, graphdef=None, tx=None, sampling_cfg=SCFG, batches=None,
                     to_device=None, pad_id=0, play=None, workdir="")
  prep = estimator_lib.EstimatorAlgorithm().prepare(ctx, 0, gb, None, {})
  mean_len = 7 / 3
  want = [prep.adv_BxGxT[0, g, t] * (mean_len / n if row_weight == "episode" else 1.0)
          for g, n in enumerate((1, 2, 4)) for t in range(n)]
  np.testing.assert_allclose([r["advantage"] for r in prep.rows], want, rtol=1e-6)


# ----------------------------------------------------------------------------------------
# Second parameter sets: iStar's PRM, M-DPO's references.

def _small_ctx(cfg, ref_params=None):
  graphdef, params = nnx.split(Decoder(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
  ctx = base.Context(cfg=cfg, graphdef=graphdef, tx=ts.make_optimizer(cfg.optim),
                     sampling_cfg=SamplingConfig(max_new_tokens=ACT, temperature=1.0),
                     batches=None, to_device=lambda b: {k: jnp.asarray(v) for k, v in b.items()},
                     pad_id=0, play=None, workdir="", ref_params=ref_params)
  return ctx, params


def _steps_logp(ctx, trajs, *param_sets):
  """Per parameter set, {(k, t): log pi of step t of episode k's action tokens, summed}:
  every step as its own row of one batch (no packing), through the model."""
  where = [(k, t) for k, tr in enumerate(trajs) for t in range(len(tr.steps))]
  rows = [data_lib.row_arrays({"prompt_ids": trajs[k].steps[t].prompt_ids,
                               "action_ids": trajs[k].steps[t].action_ids,
                               "old_logps": trajs[k].steps[t].action_logps, "advantage": 0.0},
                              PROMPT + 2 + ACT, ACT) for k, t in where]
  b = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in data_lib.BATCH_KEYS}

  @jax.jit
  def f(p):
    lp = sampling_logprobs(ts.action_logits(ctx.graphdef, p, b), b["targets"], ctx.sampling_cfg)
    return (lp * b["loss_mask"]).sum(-1)

  return [dict(zip(where, np.asarray(f(p)).tolist())) for p in param_sets]


def test_istar_rewards_and_prm_step_use_the_prm_not_the_policy():
  """Catches iStar computing its PRM reward and gradient with the policy's parameters
  instead of the PRM's (`grad_fn(params, ...)` for `grad_fn(prm.params, ...)`): with a
  PRM unlike the policy, r = beta * (log pi_prm - log pi_old) row by row and the PRM step
  is AdamW on the PRM's own pair-loss gradient."""
  cfg = method_config("istar", istar=IStarConfig(batch_rows=9))
  rng = np.random.default_rng(6)
  won = np.array([[1, 0, 0], [1, 1, 1], [0, 1, 1]])
  trajs = random_episodes(cfg, rng, won)
  gb = groups.from_episodes(trajs, 3, 3)
  arrays = gb.arrays
  ctx, params = _small_ctx(cfg)
  algo = istar.IStar()
  prm_params = _perturbed(params, 11, scale=1.0)
  tx = base.aux_optimizer(cfg.algo.istar.learning_rate, cfg.algo.istar.grad_clip)
  aux = {"prm": ts.init_state(prm_params, tx)}  # as init_aux makes it, from other weights
  beta = cfg.algo.istar.beta

  r_prm = np.zeros((3, 3, 3))
  r_pol = np.zeros((3, 3, 3))
  lp_prm, lp_pol = _steps_logp(ctx, trajs, prm_params, params)
  for (k, t), lp in lp_prm.items():
    old = float(np.sum(np.asarray(trajs[k].steps[t].action_logps, np.float32)))
    r_prm[divmod(k, 3) + (t,)] = beta * (lp - old)
    r_pol[divmod(k, 3) + (t,)] = beta * (lp_pol[k, t] - old)
  assert np.abs(r_prm - r_pol).max() > 1e-3  # the PRM and the policy disagree here

  rewards = arrays.rewards_BxG - cfg.algo.invalid_penalty * (
      arrays.invalid_BxGxT & arrays.mask_BxGxT).sum(-1)
  want_adv = np.asarray(istar.istar_advantages(jnp.asarray(rewards), jnp.asarray(r_prm),
                                               jnp.asarray(arrays.mask_BxGxT), 1.0))
  wrong_adv = np.asarray(istar.istar_advantages(jnp.asarray(rewards), jnp.asarray(r_pol),
                                                jnp.asarray(arrays.mask_BxGxT), 1.0))
  assert np.abs(want_adv - wrong_adv).max() > 1e-2

  # The PRM's loss and gradient at the PRM's parameters, on all rows at once.
  prm0 = aux["prm"]
  loss_fn = istar._prm_loss_fn(ctx.graphdef, ctx.sampling_cfg, beta, 3, 3, 3)
  units = groups.group_units(gb, 3)
  (_, batch), = base.pack(units, rows_per_batch=27, units_per_batch=3, seq_len=PROMPT + 2 + ACT,
                          action_len=ACT, pad_id=0)
  won_j = jnp.asarray(won > 0)
  (ls, (_, n)), g = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      prm0.params, ctx.to_device(batch), won_j)
  want_prm, _ = jax.jit(lambda s, l, g, n: ts.apply_update(
      tx, s, l / n, jax.tree.map(lambda x: x / n, g), {}))(prm0, ls, g, n)

  prep = algo.prepare(ctx, 0, gb, params, aux)
  np.testing.assert_allclose(prep.adv_BxGxT, want_adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(prep.metrics["istar/prm_loss"], float(ls / n), rtol=1e-5)
  for got, want in zip(jax.tree.leaves(prep.aux["prm"].params), jax.tree.leaves(want_prm.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reference", ["sft", "previous"])
def test_mdpo_reference_scores_come_from_the_configured_reference(reference):
  """Catches M-DPO's `sft` and `previous` references swapped (or either one ignored):
  with an SFT reference, a policy at the iteration's start and neither equal, each row's
  `ref_logp` is the configured reference's log-prob of its action tokens."""
  cfg = method_config("mtdpo", mtdpo=MDPOConfig(reference=reference))
  rng = np.random.default_rng(10)
  trajs = random_episodes(cfg, rng, np.array([[1, 0, 0], [1, 1, 1], [0, 1, 0]]))
  gb = groups.from_episodes(trajs, 3, 3)
  arrays = gb.arrays
  ctx, params = _small_ctx(cfg)
  sft = _perturbed(params, 21, scale=1.0)
  ctx = dataclasses.replace(ctx, ref_params=sft)
  prep = mtdpo.MultiTurnDPO().prepare(ctx, 0, gb, params, {})
  assert prep.metrics["mtdpo/pairs"] == 2
  want_params = sft if reference == "sft" else params
  other = params if reference == "sft" else sft
  pairs = mtdpo.pick_pairs(arrays.rewards_BxG > 0, arrays.mask_BxGxT.any(-1),
                           np.random.default_rng([cfg.seed, 0]))
  lp_want, lp_other = _steps_logp(ctx, trajs, want_params, other)
  checked, first = 0, 0  # a batch's `unit` counts its own pairs from 0, in pair order
  for batch in prep.rows:
    ok = batch["valid"] > 0
    for i in np.flatnonzero(ok):
      b, w, l = pairs[first + batch["unit"][i]]
      g = (w, l)[batch["slot"][i]]
      want = lp_want[b * 3 + g, batch["step"][i]]
      assert abs(want - lp_other[b * 3 + g, batch["step"][i]]) > 1e-2  # references disagree
      np.testing.assert_allclose(batch["ref_logp"][i], want, rtol=1e-5, atol=1e-5)
      checked += 1
    first += int(batch["unit"][ok].max()) + 1
  assert checked == sum(len(trajs[b * 3 + w].steps) + len(trajs[b * 3 + l].steps)
                        for b, w, l in pairs)


# ----------------------------------------------------------------------------------------
# GroupArrays against the episodes it came from.


def _episodes(rng, B, G, T):
  """B x G episodes: 0 .. T + 2 steps (some cut at T), mixed validity, oracle labels and
  anchors, actions of 0 .. 5 tokens (an empty one included)."""
  trajs = []
  for k in range(B * G):
    n = int(rng.integers(0, T + 3))
    steps = []
    for _ in range(n):
      a = int(rng.integers(0, 6))
      steps.append(step((2,), rng.integers(2, 50, a).tolist(), (-rng.random(a) * 2).tolist(),
                        action="x", anchor_id=int(rng.integers(0, 2**31)),
                        valid=bool(rng.random() < 0.6),
                        oracle_label=None if rng.random() < 0.3 else float(rng.normal())))
    trajs.append(episode(steps, task=("train", k // G), won=bool(rng.random() < 0.4)))
  return trajs


def _reference_arrays(trajs, B, G, T, reduce):
  """Every field of GroupArrays, from the episodes in plain Python."""
  z = lambda fill=0: [[[fill] * T for _ in range(G)] for _ in range(B)]
  ref = {"rewards_BxG": [[0.0] * G for _ in range(B)], "logp_BxGxT": z(0.0),
         "mask_BxGxT": z(False), "step_rewards_BxGxT": z(0.0), "state_id_BxGxT": z(0),
         "oracle_BxGxT": z(float("nan")), "action_len_BxGxT": z(0),
         "invalid_BxGxT": z(False)}
  for b in range(B):
    for g in range(G):
      tr = trajs[b * G + g]
      ref["rewards_BxG"][b][g] = 1.0 if tr.won else 0.0
      steps = tr.steps[:T]
      for t, st in enumerate(steps):
        lps = st.action_logps
        ref["logp_BxGxT"][b][g][t] = (sum(lps) if reduce == "sum"
                                      else (sum(lps) / len(lps) if lps else 0.0))
        ref["mask_BxGxT"][b][g][t] = True
        ref["state_id_BxGxT"][b][g][t] = st.anchor_id
        ref["action_len_BxGxT"][b][g][t] = len(st.action_ids)
        ref["invalid_BxGxT"][b][g][t] = not st.valid
        if st.oracle_label is not None:
          ref["oracle_BxGxT"][b][g][t] = st.oracle_label
      if steps:
        ref["step_rewards_BxGxT"][b][g][len(steps) - 1] = ref["rewards_BxG"][b][g]
  return ref


_DTYPES = {"rewards_BxG": np.float32, "logp_BxGxT": np.float32, "mask_BxGxT": np.bool_,
           "step_rewards_BxGxT": np.float32, "state_id_BxGxT": np.int32,
           "oracle_BxGxT": np.float32, "action_len_BxGxT": np.int32,
           "invalid_BxGxT": np.bool_}


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_group_arrays_every_field_matches_the_episodes(reduce):
  """Catches any field of `groups.group_arrays` built wrong from its episodes: the
  invalid-action flag inverted (`st.valid` for `not st.valid`), action lengths, the mask,
  outcome and step rewards, log-probs (sum or mean), anchors, oracle labels, or episodes
  placed in the wrong (b, g); each checked against a plain-Python reference."""
  B, G, T = 3, 4, 5
  trajs = _episodes(np.random.default_rng(2), B, G, T)
  got = groups.group_arrays(groups.split(trajs, G), T, logp_reduce=reduce)
  ref = _reference_arrays(trajs, B, G, T, reduce)
  fields = [f.name for f in dataclasses.fields(GroupArrays)]
  assert set(fields) == set(ref) == set(_DTYPES), "a new GroupArrays field needs a reference here"
  for name in fields:
    g, w = getattr(got, name), np.asarray(ref[name], _DTYPES[name])
    assert g.dtype == w.dtype and g.shape == w.shape, name
    if name == "logp_BxGxT":
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)
    else:
      np.testing.assert_array_equal(g, w, err_msg=name)
  # The inputs separate the alternatives: valid and invalid steps, cut episodes, empty ones.
  m = got.mask_BxGxT
  assert got.invalid_BxGxT[m].any() and (~got.invalid_BxGxT[m]).any()
  assert not got.invalid_BxGxT[~m].any()
  assert any(len(t.steps) > T for t in trajs) and any(not t.steps for t in trajs)
  assert len(set(got.action_len_BxGxT[m].tolist())) > 2
  assert np.isnan(got.oracle_BxGxT[m]).any() and (~np.isnan(got.oracle_BxGxT[m])).any()


# ----------------------------------------------------------------------------------------
# Every AlgoConfig field, and where its wiring is tested.

# field -> tests ("module::function") that fail if the field does not reach its consumer.
WIRING_TESTS = {
    "method": ["test_algorithms::test_labels_and_state_layout",
               "test_algorithm_runs::test_method_runs_and_resumes_with_its_aux_state"],
    "estimator": ["test_wiring::test_every_estimator_is_reachable_and_they_differ",
                  "test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "lam": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob",
            "test_trainer_rl::test_csa_lam0_equals_grpo_bitwise"],
    "gamma": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "w": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "eps": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "std_normalize": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "ddof": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "decisive_steps": ["test_wiring::test_compute_advantages_forwards_each_estimator_knob"],
    "ref_dtype": ["test_lora::test_a_bfloat16_reference_and_first_moment_for_full_parameter_runs"],
    "clip_low": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob"],
    "clip_high": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob"],
    "dual_clip": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob"],
    "loss_agg": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob",
                 "test_train_step::test_rl_first_step_is_the_policy_gradient"],
    "kl_coef": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob",
                "test_wiring::test_kl_term_pulls_the_policy_towards_the_reference"],
    "kl_kind": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob"],
    "entropy_coef": ["test_wiring::test_rl_loss_matches_numpy_for_each_knob"],
    "dynamic_sampling": ["test_trainer_rl::test_dynamic_sampling_inside_the_trainer"],
    "dynamic_sampling_rounds": ["test_trainer_rl::test_dynamic_sampling_inside_the_trainer"],
    "overlong_cache_frac": ["test_advantage_wiring::test_overlong_shaping_matches_formula"],
    "overlong_factor": ["test_advantage_wiring::test_overlong_shaping_matches_formula"],
    "overlong_per": ["test_advantage_wiring::test_overlong_shaping_matches_formula"],
    "invalid_penalty": ["test_advantage_wiring::test_invalid_action_penalty_matches_formula"],
    "row_weight": ["test_wiring::test_row_weight_reaches_the_rows"],
    "epochs": ["test_wiring::test_update_runs_epochs_of_minibatches_and_passes_the_reference"],
    "minibatch_size": [
        "test_wiring::test_update_runs_epochs_of_minibatches_and_passes_the_reference"],
    "istar": ["test_wiring::test_istar_rewards_and_prm_step_use_the_prm_not_the_policy",
              "test_algorithms::test_istar_prepare_matches_row_by_row_and_takes_one_prm_step"],
    "spa": ["test_algorithms::test_spa_estimator_learns_and_progress_matches_row_by_row"],
    "mtdpo": ["test_wiring::test_mdpo_reference_scores_come_from_the_configured_reference",
              "test_algorithms::test_mdpo_step_raises_the_winners_margin"],
    "update_rows": ["test_oracle_rows::"
                    "test_decisive_update_keeps_the_decisive_rows_with_their_advantages"],
    "log_row_classes": ["test_oracle_rows::"
                        "test_log_row_classes_reaches_the_estimator_methods_metrics"],
}


def test_every_algo_field_has_a_wiring_test():
  """Catches a new AlgoConfig field that no test shows reaching its consumer (add it to
  WIRING_TESTS with a test whose inputs tell its values apart), and a listed test that was
  renamed or removed."""
  fields = {f.name for f in dataclasses.fields(AlgoConfig)}
  assert fields == set(WIRING_TESTS), (f"unlisted: {sorted(fields - set(WIRING_TESTS))}, "
                                       f"gone: {sorted(set(WIRING_TESTS) - fields)}")
  here = os.path.dirname(os.path.abspath(__file__))
  for field, tests in WIRING_TESTS.items():
    for name in tests:
      module, fn = name.split("::")
      with open(os.path.join(here, f"{module}.py")) as f:
        assert f"\ndef {fn}(" in f.read(), (field, name)


def test_an_estimator_knob_that_is_no_config_field_is_refused_when_it_registers():
  """Catches the old silent fallback: a knob an estimator declares but the trainer never
  sets (it used to reach the estimator only if added by hand to a dict)."""
  def knob_typo_probe(rewards_BxG, mask_BxGxT, *, lamda):
    return None

  with pytest.raises(ValueError, match=r"declares hparams \['lamda'\] that are not fields"):
    est_lib.register("knob_typo_probe")(knob_typo_probe)
  assert "knob_typo_probe" not in est_lib.list_estimators()
