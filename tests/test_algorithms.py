"""iStar, SPA-RL and multi-turn DPO (csa_jax/algorithms): each loss and reward against a
plain NumPy loop written here, and each method's packed-batch machinery against the same
quantity computed row by row on a tiny decoder."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax import algorithms
from csa_jax.algorithms import base, istar, mtdpo, spa
from csa_jax.config import AlgoConfig, ConfigError, ExperimentConfig, apply_overrides
from csa_jax.model import Decoder
from csa_jax.model.sampling import SamplingConfig, sampling_logprobs
from csa_jax.rollout import groups
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts
from tests.factories import ACT, PROMPT, method_config, random_episodes


def _sigmoid(x):
  return 1.0 / (1.0 + math.exp(-x))


def _random_mask(rng, B, G, T):
  """Random episode lengths in 0..T (0: a rollout without steps) as a [B, G, T] mask."""
  lens = rng.integers(0, T + 1, size=(B, G))
  return np.arange(T)[None, None, :] < lens[..., None]


# ----------------------------------------------------------------------------------------
# iStar.


def np_pair_loss(r, mask, won):
  total, pairs = 0.0, 0
  B, G, _ = r.shape
  for b in range(B):
    q = {}
    for i in range(G):
      steps = [r[b, i, t] for t in range(r.shape[2]) if mask[b, i, t]]
      if steps:
        q[i] = sum(steps) / len(steps)
    for i in q:
      for j in q:
        if won[b, i] and not won[b, j]:
          total += -math.log(_sigmoid(q[i] - q[j]))
          pairs += 1
  return total, pairs


def test_prm_pair_loss_matches_numpy():
  rng = np.random.default_rng(0)
  B, G, T = 4, 5, 6
  r = rng.normal(size=(B, G, T)).astype(np.float32)
  mask = _random_mask(rng, B, G, T)
  won = rng.random((B, G)) < 0.5
  won[0] = True  # a group without a failure: no pair
  won[1] = False  # a group without a success: no pair
  won[2, :2], mask[2, 0] = True, False  # a "won" rollout without steps counts in no pair
  loss, pairs = istar.prm_pair_loss(jnp.asarray(r), jnp.asarray(mask), jnp.asarray(won))
  want_loss, want_pairs = np_pair_loss(r, mask, won)
  assert int(pairs) == want_pairs > 0
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)


def test_implicit_step_reward_matches_numpy():
  rng = np.random.default_rng(1)
  prm, old = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
  mask = rng.random((2, 3, 4)) < 0.7
  got = istar.implicit_step_reward(jnp.asarray(prm), jnp.asarray(old), jnp.asarray(mask), beta=0.05)
  want = np.where(mask, 0.05 * (prm - old), 0.0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)


def np_istar_advantages(R, r, mask, alpha):
  B, G, T = r.shape
  out = np.zeros_like(r)
  act = r[mask]
  scale = np.abs(act).max() + 1e-6
  for b in range(B):
    real = [i for i in range(G) if mask[b, i].any()]
    steps = [(i, t) for i in range(G) for t in range(T) if mask[b, i, t]]
    for i, t in steps:
      a_e = (R[b, i] - np.mean([R[b, j] for j in real if j != i])) if len(real) > 1 else 0.0
      others = [r[b, j, s] / scale for j, s in steps if (j, s) != (i, t)]
      a_s = r[b, i, t] / scale - np.mean(others) if others else 0.0
      out[b, i, t] = a_e + alpha * a_s
  return out


def test_istar_advantages_match_numpy():
  rng = np.random.default_rng(2)
  B, G, T = 3, 4, 5
  mask = _random_mask(rng, B, G, T)
  mask[0, :, 0] = True
  r = rng.normal(size=(B, G, T)).astype(np.float32) * mask
  R = rng.integers(0, 2, size=(B, G)).astype(np.float32) - 0.1 * rng.integers(0, 3, size=(B, G))
  got = istar.istar_advantages(jnp.asarray(R), jnp.asarray(r), jnp.asarray(mask), 0.7)
  np.testing.assert_allclose(np.asarray(got), np_istar_advantages(R, r, mask, 0.7),
                             rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------
# SPA-RL.


def test_progress_loss_matches_numpy():
  rng = np.random.default_rng(3)
  E, T = 6, 5
  c = rng.normal(size=(E, T)).astype(np.float32)
  mask = _random_mask(rng, 1, E, T)[0]
  mask[:, 0] = True
  valid = np.array([1, 1, 0, 1, 1, 1], bool)  # a padded episode slot
  R = rng.integers(0, 2, size=E).astype(np.float32)
  want = np.mean([(sum(c[e, t] for t in range(T) if mask[e, t]) - R[e]) ** 2
                  for e in range(E) if valid[e]])
  got = spa.progress_loss(jnp.asarray(c), jnp.asarray(mask), jnp.asarray(R), jnp.asarray(valid))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def np_spa_advantages(c, valid, mask, coef, grounding, penalty, gamma, mode):
  B, G, T = c.shape
  g = grounding * valid if mode == "bonus" else -grounding * ~valid
  r = np.where(mask, coef * c + g - penalty * ~valid, 0.0)
  ret = np.zeros_like(r)
  for b in range(B):
    for i in range(G):
      acc = 0.0
      for t in reversed(range(T)):
        if mask[b, i, t]:
          acc = r[b, i, t] + gamma * acc
          ret[b, i, t] = acc
  out = np.zeros_like(r)
  for b in range(B):
    vals = ret[b][mask[b]]
    if len(vals) > 1 and vals.std(ddof=1) > 0:
      out[b][mask[b]] = (vals - vals.mean()) / (vals.std(ddof=1) + 1e-6)
  return r, out


@pytest.mark.parametrize("mode", ["penalty", "bonus"])
def test_spa_reward_and_advantages_match_numpy(mode):
  rng = np.random.default_rng(4)
  B, G, T = 3, 4, 6
  mask = _random_mask(rng, B, G, T)
  mask[:, 0, :2] = True
  # A gap inside an episode: the return skips padded steps.
  mask[0, 1] = [True, False, True, True, False, False]
  c = rng.normal(size=(B, G, T)).astype(np.float32)
  valid = rng.random((B, G, T)) < 0.6
  want_r, want_a = np_spa_advantages(c, valid, mask, 0.8, 0.5, 0.1, 0.9, mode)
  r = spa.spa_step_rewards(jnp.asarray(c), jnp.asarray(valid), jnp.asarray(mask),
                           progress_coef=0.8, grounding=0.5, invalid_penalty=0.1,
                           grounding_mode=mode)
  np.testing.assert_allclose(np.asarray(r), want_r, rtol=1e-5, atol=1e-6)
  a = spa.spa_advantages(r, jnp.asarray(mask), 0.9)
  np.testing.assert_allclose(np.asarray(a), want_a, rtol=1e-4, atol=1e-5)


def _win_and_long_loss(T=25, win_len=6):
  """One group: a win in `win_len` steps and a loss that runs to the step limit T, every
  action executed, and a perfect estimator (c = 1 / win_len on the win's steps, 0 on the
  loss's): what SPA's advantages must rank the right way round."""
  mask = np.zeros((1, 2, T), bool)
  mask[0, 0, :win_len] = True
  mask[0, 1, :] = True
  c = np.where(mask[:, :1], 1.0 / win_len, 0.0).repeat(2, 1).astype(np.float32)
  c[0, 1] = 0.0
  return c, mask.copy(), mask


def test_spa_advantages_do_not_pay_for_episode_length():
  """Why SPA-RL made every coin_doors seed worse (reports/spa_grounding.md). With the paper's
  +grounding on every executed action, the discounted return of a step is about grounding x (the
  steps left in its episode), so a 25-step loss's steps outranked a 6-step win's (return 0.5 x
  ~22 against 0.5 x ~6 + 1) and the policy was paid for wandering. With the default grounding (0
  for an executed action, -grounding for a rejected one) every step of the win gets a higher
  advantage than every step of the loss."""
  s = AlgoConfig().spa
  c, valid, mask = _win_and_long_loss()
  r = spa.spa_step_rewards(jnp.asarray(c), jnp.asarray(valid), jnp.asarray(mask),
                           progress_coef=s.progress_coef, grounding=s.grounding)
  a = np.asarray(spa.spa_advantages(r, jnp.asarray(mask), s.gamma))
  assert a[0, 0, :6].min() > 0 > a[0, 1].max()
  m = spa.advantage_diagnostics(a, mask, np.array([[True, False]]))
  assert m["spa/adv_won_minus_lost"] > 0
  # The paper's literal bonus on the same group: the loss outranks the win, and a step's
  # advantage follows the steps left in its episode.
  r = spa.spa_step_rewards(jnp.asarray(c), jnp.asarray(valid), jnp.asarray(mask),
                           progress_coef=s.progress_coef, grounding=s.grounding,
                           grounding_mode="bonus")
  a = np.asarray(spa.spa_advantages(r, jnp.asarray(mask), s.gamma))
  assert a[0, 0, :6].mean() < 0 < a[0, 1].mean()
  m = spa.advantage_diagnostics(a, mask, np.array([[True, False]]))
  assert m["spa/adv_won_minus_lost"] < 0 and m["spa/adv_steps_left_corr"] > 0.9


def test_spa_advantage_diagnostics_by_hand():
  adv = np.array([[[1.0, 2.0, 0.0], [-1.0, 0.0, 0.0]], [[5.0, 0.0, 0.0], [7.0, 0.0, 0.0]]])
  mask = np.array([[[1, 1, 0], [1, 0, 0]], [[1, 0, 0], [1, 0, 0]]], bool)
  won = np.array([[True, False], [True, True]])  # group 1 is uniform: left out of the diff
  m = spa.advantage_diagnostics(adv, mask, won)
  assert m["spa/adv_won_minus_lost"] == pytest.approx(1.5 - (-1.0))
  # steps left: [2, 1], [1], [1], [1]
  want = np.corrcoef([1.0, 2.0, -1.0, 5.0, 7.0], [2, 1, 1, 1, 1])[0, 1]
  assert m["spa/adv_steps_left_corr"] == pytest.approx(want)
  assert math.isnan(spa.advantage_diagnostics(adv, mask, np.ones((2, 2), bool))[
      "spa/adv_won_minus_lost"])


def test_spa_exploration_stops_at_its_share_of_the_step_budget(tmp_path):
  """With rl_env_steps, exploration ends after the chunk that reaches explore_share of
  the budget (each chunk: 3 tasks x 2 copies of 3-step episodes = 18 steps), and
  `prepare` reports those steps for the trainer's count; without a budget every task is
  explored."""
  def cfg_with(budget):
    c = method_config("spa", spa=dataclasses.replace(AlgoConfig().spa, explore_tasks=12,
                                                     explore_k=2, epochs=1, explore_share=0.25))
    return dataclasses.replace(c, rl_env_steps=budget)

  def play(tasks, key):
    trajs = random_episodes(cfg, rng, np.zeros(len(tasks)))
    for tr in trajs:
      tr.steps = (tr.steps * 3)[:3]
    return trajs

  rng = np.random.default_rng(11)
  cfg = cfg_with(100)  # cap 25 steps: 2 chunks (18, then 36 >= 25)
  ctx, params = _ctx(cfg, tmp_path / "capped", play)
  algo = spa.SPA()
  episodes = algo.explore(ctx)
  assert len(episodes) == 2 * 6 and spa.explored_steps(episodes) == 36
  aux = algo.init_aux(cfg, params)
  trajs = random_episodes(cfg, rng, np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0]]))
  prep = algo.prepare(ctx, 0, groups.from_episodes(trajs, 3, 3), params, aux)
  assert prep.env_steps == 36 and prep.metrics["spa/explore_steps"] == 36
  cfg = cfg_with(0)
  ctx, _ = _ctx(cfg, tmp_path / "uncapped", play)
  assert len(spa.SPA().explore(ctx)) == 12 * 2


# ----------------------------------------------------------------------------------------
# Multi-turn DPO.


def np_mdpo(logp, amask, ref, row_pair, row_side, valid_pairs, beta):
  P = len(valid_pairs)
  s = np.zeros((P, 2))
  sr = np.zeros((P, 2))
  for n in range(logp.shape[0]):
    s[row_pair[n], row_side[n]] += sum(logp[n, k] for k in range(logp.shape[1]) if amask[n, k])
    sr[row_pair[n], row_side[n]] += ref[n]
  losses = [-math.log(_sigmoid(beta * ((s[p, 0] - sr[p, 0]) - (s[p, 1] - sr[p, 1]))))
            for p in range(P) if valid_pairs[p]]
  return np.mean(losses)


def test_mdpo_loss_matches_numpy_and_observation_tokens_get_no_gradient():
  """Rows are steps of 3 pairs (pair 2 padding); each row's tokens mix observation
  tokens (action mask 0) and action tokens (1). The loss matches NumPy, and its gradient
  with respect to every observation token's log-prob is exactly 0."""
  rng = np.random.default_rng(5)
  N, L, P = 10, 7, 3
  logp = -rng.random((N, L)).astype(np.float32) * 3
  amask = rng.random((N, L)) < 0.5
  amask[:, 0] = False  # always some observation tokens
  amask[:, -1] = True
  ref = -rng.random(N).astype(np.float32) * 5
  row_pair = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 2])
  row_side = np.array([0, 0, 1, 1, 0, 1, 1, 1, 0, 0])
  valid_pairs = np.array([True, True, False])

  def loss_of(logp_NxL):
    s_R = mtdpo.sequence_logp(logp_NxL, jnp.asarray(amask))
    s_Px2 = jnp.zeros((P, 2)).at[row_pair, row_side].add(s_R)
    r_Px2 = jnp.zeros((P, 2)).at[row_pair, row_side].add(jnp.asarray(ref))
    return mtdpo.mdpo_loss(s_Px2, r_Px2, jnp.asarray(valid_pairs), beta=0.1)[0]

  got = float(loss_of(jnp.asarray(logp)))
  np.testing.assert_allclose(got, np_mdpo(logp, amask, ref, row_pair, row_side,
                                          valid_pairs, 0.1), rtol=1e-5)
  grad = np.asarray(jax.grad(loss_of)(jnp.asarray(logp)))
  assert (grad[~amask] == 0).all()
  in_valid_pair = valid_pairs[row_pair][:, None] & amask
  assert (grad[in_valid_pair] != 0).all()
  # Winner tokens are pushed up (negative gradient of the loss), losers down.
  assert (grad[in_valid_pair & (row_side[:, None] == 0)] < 0).all()
  assert (grad[in_valid_pair & (row_side[:, None] == 1)] > 0).all()


def test_pick_pairs_one_winner_one_loser_per_mixed_group():
  won = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0], [0, 1, 1]], bool)
  real = np.ones_like(won)
  real[3, 1] = False  # a rollout without steps is never picked
  pairs = mtdpo.pick_pairs(won, real, np.random.default_rng(0))
  assert [p[0] for p in pairs] == [0, 3]
  for b, w, l in pairs:
    assert won[b, w] and not won[b, l] and real[b, w] and real[b, l]
  assert pairs[1][1] == 2


# ----------------------------------------------------------------------------------------
# The packed-batch machinery on a tiny decoder.

def _ctx(cfg, tmp_path=None, play=None):
  model = Decoder(cfg.model, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  scfg = SamplingConfig(max_new_tokens=ACT, temperature=1.0)
  ctx = base.Context(cfg=cfg, graphdef=graphdef, tx=ts.make_optimizer(cfg.optim),
                     sampling_cfg=scfg, batches=None,
                     to_device=lambda b: {k: jnp.asarray(v) for k, v in b.items()},
                     pad_id=0, play=play, workdir=str(tmp_path or ""), ref_params=params)
  return ctx, params


def _leaves_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_istar_prepare_matches_row_by_row_and_takes_one_prm_step():
  """r from the packed PRM pass equals beta * (log pi_prm - log pi_old) row by row; the
  PRM step equals one AdamW step on the gradient of the mean pair loss over all rows at
  once (no packing); the advantages use r from before that step."""
  cfg = method_config("istar", istar=dataclasses.replace(AlgoConfig().istar, batch_rows=9))
  rng = np.random.default_rng(6)
  won = np.array([[1, 0, 0], [1, 1, 1], [0, 1, 1]])
  trajs = random_episodes(cfg, rng, won)
  gb = groups.from_episodes(trajs, 3, 3)
  arrays = gb.arrays
  ctx, params = _ctx(cfg)
  algo = istar.IStar()
  aux = algo.init_aux(cfg, params)
  prm0 = aux["prm"]
  beta = cfg.algo.istar.beta

  batch, where = _all_rows(trajs)
  old_R = np.array([sum(st.action_logps) for tr in trajs for st in tr.steps], np.float32)

  def r_of(p):  # every row in one unpacked batch, placed by its own (b, g, t)
    return jnp.zeros((3, 3, 3)).at[where].set(beta * (_logp_rows(ctx, p, batch) - old_R))

  @jax.jit
  def mean_loss(p):
    s, n = istar.prm_pair_loss(r_of(p), jnp.asarray(arrays.mask_BxGxT), jnp.asarray(won > 0))
    return s / n

  r_direct = np.asarray(jax.jit(r_of)(prm0.params))  # not eager: a program per operation
  want_loss, want_grads = jax.jit(jax.value_and_grad(mean_loss))(prm0.params)
  tx = base.aux_optimizer(cfg.algo.istar.learning_rate, cfg.algo.istar.grad_clip)
  want_prm, _ = jax.jit(ts.apply_update, static_argnums=0)(tx, prm0, want_loss, want_grads, {})

  prep = algo.prepare(ctx, 0, gb, params, aux)
  assert prep.metrics["istar/pairs"] == 2 + 2  # group 0: 1 x 2, group 2: 2 x 1
  np.testing.assert_allclose(prep.metrics["istar/prm_loss"], float(want_loss), rtol=1e-5)
  for got, want in zip(jax.tree.leaves(prep.aux["prm"].params), jax.tree.leaves(want_prm.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  assert not _leaves_equal(prep.aux["prm"].params, params)  # the step moved the PRM
  rewards = arrays.rewards_BxG - cfg.algo.invalid_penalty * (arrays.invalid_BxGxT & arrays.mask_BxGxT).sum(-1)
  want_adv = np_istar_advantages(rewards, r_direct, arrays.mask_BxGxT, 1.0)
  np.testing.assert_allclose(prep.adv_BxGxT, want_adv, rtol=1e-4, atol=1e-5)


def _all_rows(trajs, group_size=3):
  """Every step as one row of one batch (no packing), and each row's (b, g, t)."""
  rows, where = [], []
  for k, tr in enumerate(trajs):
    for t, st in enumerate(tr.steps):
      rows.append(data_lib.row_arrays({"prompt_ids": st.prompt_ids, "action_ids": st.action_ids,
                                       "old_logps": st.action_logps, "advantage": 0.0},
                                      PROMPT + 2 + ACT, ACT))
      where.append((*divmod(k, group_size), t))
  batch = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in data_lib.BATCH_KEYS}
  return batch, tuple(np.asarray(where).T)


def _logp_rows(ctx, params, batch):
  lp = sampling_logprobs(ts.action_logits(ctx.graphdef, params, batch), batch["targets"],
                         ctx.sampling_cfg)
  return (lp * batch["loss_mask"]).sum(-1)


def test_istar_without_pairs_takes_no_prm_step():
  cfg = method_config("istar")
  rng = np.random.default_rng(7)
  won = np.array([[1, 1, 1], [0, 0, 0], [1, 1, 1]])
  trajs = random_episodes(cfg, rng, won)
  ctx, params = _ctx(cfg)
  algo = istar.IStar()
  aux = algo.init_aux(cfg, params)
  prep = algo.prepare(ctx, 0, groups.from_episodes(trajs, 3, 3), params, aux)
  assert prep.metrics["istar/pairs"] == 0 and "istar/prm_loss" not in prep.metrics
  assert _leaves_equal(prep.aux["prm"], aux["prm"])


def test_spa_estimator_learns_and_progress_matches_row_by_row(tmp_path):
  """Exploration is played once and read back; training lowers the estimator's loss;
  the packed progress pass equals the head on each row's last hidden state."""
  cfg = method_config("spa", spa=dataclasses.replace(AlgoConfig().spa, explore_tasks=4,
                                                     explore_k=2, epochs=20, batch_rows=7,
                                                     learning_rate=3e-3))
  rng = np.random.default_rng(8)
  calls = []

  def play(tasks, key):
    calls.append(len(tasks))
    return random_episodes(cfg, rng, [t[1] % 2 for t in tasks])  # odd tasks are won

  ctx, params = _ctx(cfg, tmp_path, play)
  algo = spa.SPA()
  aux = algo.init_aux(cfg, params)
  episodes = algo.explore(ctx)
  assert sum(calls) == 4 * 2 and len(episodes) == 8
  assert algo.explore(ctx) == episodes and sum(calls) == 8  # read back, not replayed
  assert len(os.listdir(tmp_path / "spa_explore")) == 2  # 6 envs // 2 copies: 3 tasks a chunk
  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # training donates the state it gets
  est, last_epoch = algo.train_estimator(ctx, copy(aux["estimator"]), episodes)
  assert len(last_epoch) == 3  # 8 episodes of <= 3 rows in batches of 7 rows

  units = [[(0, row) for row in ep["rows"]] for ep in episodes]
  (idx, batch), = base.pack(units, rows_per_batch=32, units_per_batch=8,
                            seq_len=PROMPT + 2 + ACT, action_len=ACT, pad_id=0)
  batch = ctx.to_device(batch)
  won = jnp.asarray([float(ep["won"]) for ep in episodes])

  @jax.jit  # one program (eagerly, every operation of the model compiles on its own)
  def loss(params):  # over all episodes, in the packed layout the training uses
    c_UxT, m_UxT = spa._scatter(batch, spa.progress(ctx.graphdef, params, batch), 8, 3)
    return spa.progress_loss(c_UxT, m_UxT, won, m_UxT.any(-1))

  assert float(loss(aux["estimator"].params)) == 0.5  # c = 0 at the start; half won
  assert float(loss(est.params)) < 0.1

  trajs = random_episodes(cfg, rng, np.zeros((3, 3)))
  c = algo.progress_BxGxT(ctx, est.params, groups.from_episodes(trajs, 3, 3))
  head = est.params["head"]
  last_hidden = jax.jit(lambda body, x: nnx.merge(ctx.graphdef, body).hidden_states(x)[0, -1])
  for k, tr in enumerate(trajs):
    b, g = divmod(k, 3)
    for t, st in enumerate(tr.steps):
      seq = st.prompt_ids + st.action_ids
      h = np.asarray(last_hidden(est.params["body"], jnp.asarray([seq[:-1]])), np.float64)
      want = h @ np.asarray(head["w"], np.float64) + np.asarray(head["b"], np.float64)
      np.testing.assert_allclose(c[b, g, t], float(np.squeeze(want)), rtol=1e-4, atol=1e-5)
    assert (c[b, g, len(tr.steps):] == 0).all()


def test_spa_prepare_runs_setup_once(tmp_path):
  cfg = method_config("spa", spa=dataclasses.replace(AlgoConfig().spa, explore_tasks=2,
                                                     explore_k=2, epochs=1))
  rng = np.random.default_rng(9)
  ctx, params = _ctx(cfg, tmp_path,
                     lambda tasks, key: random_episodes(cfg, rng, np.ones(len(tasks))))
  algo = spa.SPA()
  aux = algo.init_aux(cfg, params)
  trajs = random_episodes(cfg, rng, np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0]]))
  gb = groups.from_episodes(trajs, 3, 3)
  arrays = gb.arrays
  prep = algo.prepare(ctx, 0, gb, params, aux)
  assert int(prep.aux["ready"]) == 1 and prep.metrics["spa/explore_episodes"] == 4
  assert prep.env_steps > 0
  again = algo.prepare(ctx, 1, gb, params, prep.aux)
  assert "spa/explore_episodes" not in again.metrics and again.env_steps == 0
  assert np.abs(np.asarray(prep.aux["estimator"].params["head"]["w"])).max() > 0  # trained


def test_mdpo_step_raises_the_winners_margin():
  cfg = method_config("mtdpo")
  rng = np.random.default_rng(10)
  won = np.array([[1, 0, 0], [1, 1, 1], [0, 1, 0]])
  trajs = random_episodes(cfg, rng, won)
  gb = groups.from_episodes(trajs, 3, 3)
  arrays = gb.arrays
  ctx, params = _ctx(cfg)
  algo = mtdpo.MultiTurnDPO()
  prep = algo.prepare(ctx, 0, gb, params, {})
  assert prep.metrics["mtdpo/pairs"] == 2 and not prep.skip
  # The reference scores are the SFT (here: initial) policy's, row by row.
  batch = prep.rows[0]
  ok = batch["valid"] > 0
  np.testing.assert_allclose(batch["ref_logp"][~ok], 0.0)
  step = algo.make_step(ctx)
  state = ts.init_state(jax.tree.map(jnp.copy, params), ctx.tx)
  margins = []
  for _ in range(3):
    state, m = algo.update(ctx, step, state, prep, 0, None)
    margins.append(float(m["margin"]))
    assert m["nonfinite_loss"] == 0
  assert margins[0] == 0.0  # policy == reference before the first step
  assert margins[2] > margins[1] > 0


def test_mdpo_without_pairs_skips():
  cfg = method_config("mtdpo")
  trajs = random_episodes(cfg, np.random.default_rng(11), np.zeros((3, 3)))
  ctx, params = _ctx(cfg)
  prep = mtdpo.MultiTurnDPO().prepare(ctx, 0, groups.from_episodes(trajs, 3, 3), params, {})
  assert prep.skip and prep.metrics["mtdpo/pairs"] == 0


# ----------------------------------------------------------------------------------------
# Config, names, checkpoint layout.


@pytest.mark.parametrize("pairs, needle", [
    (["algo.method=ppo"], "algo.method must be one of 'estimator', 'istar', 'spa', 'mtdpo'"),
    (["algo.method=mtdpo", "algo.kl_coef=0.05"], "set algo.kl_coef=0"),
    (["algo.mtdpo.reference=self"], "algo.mtdpo.reference must be"),
    (["algo.spa.explore_k=0"], "explore_k"),
])
def test_bad_method_config_is_a_config_error(pairs, needle):
  with pytest.raises(ConfigError, match=needle):
    apply_overrides(ExperimentConfig(), pairs)


def test_every_family_registers_the_three_methods():
  import experiments
  names = experiments.list_experiments()
  families = {n[:-len("_grpo")] for n in names
              if n.endswith("_grpo") and not n.endswith("_dr_grpo")}
  assert {"twx_coin", "coin_doors", "alfworld", "scienceworld", "webshop"} <= families
  for fam in families:
    for method in ("istar", "spa", "mtdpo"):
      cfg = experiments.get_experiment(f"{fam}_{method}")
      assert cfg.algo.method == method
      grpo = experiments.get_experiment(f"{fam}_grpo")
      assert (cfg.rl_iterations, cfg.rollout) == (grpo.rl_iterations, grpo.rollout)


def test_labels_and_state_layout():
  assert algorithms.label(AlgoConfig(estimator="grpo")) == "estimator grpo"
  assert algorithms.label(AlgoConfig(method="mtdpo")) == "mtdpo"
  assert algorithms.pack_state("s", {}) == "s"
  assert algorithms.unpack_state(algorithms.pack_state("s", {"a": 1}), {"a": 0}) == ("s", {"a": 1})
