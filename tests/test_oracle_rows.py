"""Rows by oracle label (csa_jax/update/oracle_rows.py): the classes, the decisive-only update's
rows, and the per-class gradient diagnostics, whose two classes add up to the whole
iteration's policy gradient (checked against the update's own loss over all rows)."""

import jax
import numpy as np
import pytest
from flax import nnx

from csa_jax.algorithms import base
from csa_jax.algorithms import estimator as estimator_lib
from csa_jax.config import AlgoConfig, ExperimentConfig, RolloutConfig
from csa_jax.model import Decoder, ModelConfig
from csa_jax.model.sampling import SamplingConfig
from csa_jax.rollout import groups
from csa_jax.rollout.episodes import Step, Trajectory
from csa_jax.update import data as D
from csa_jax.update import oracle_rows
from csa_jax.update import train_step as ts

V, PROMPT, ACT = 48, 6, 3
SCFG = SamplingConfig(max_new_tokens=ACT, temperature=1.0)
CFG = ModelConfig.tiny(V, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=8, max_seq_len=16)
# Float32 gradients of the same function computed batch by batch and in one batch.
RTOL, ATOL = 1e-5, 1e-7


def _episodes(rng, won, horizon=2, labels=True):
  """One KeyDoor-like group: a decisive first step (+1 when won, else -1), then routine
  steps (label 0); random prompts and actions."""
  out = []
  for w in won:
    steps = []
    for t in range(horizon + 1):
      a = rng.integers(2, V, int(rng.integers(1, ACT))).tolist() + [1]
      label = (1.0 if w else -1.0) if t == 0 else 0.0
      steps.append(Step(prompt_ids=rng.integers(2, V, PROMPT).tolist(), action_ids=a,
                        action_logps=(-rng.random(len(a))).tolist(), action="a",
                        observation="o", reward=0.0, anchor_id=t, valid=True,
                        oracle_label=label if labels else None))
    out.append(Trajectory(task=("train", 0), steps=steps, won=bool(w)))
  return out


def test_step_classes():
  gb = groups.from_episodes(_episodes(np.random.default_rng(0), [1, 0, 0]), 3, 3)
  c = oracle_rows.step_classes(gb.arrays.oracle_BxGxT, gb.arrays.mask_BxGxT)
  assert c["decisive"][0, :, 0].all() and not c["decisive"][0, :, 1:].any()
  assert c["routine"][0, :, 1:].all() and not c["routine"][0, :, 0].any()
  unlabelled = groups.from_episodes(_episodes(np.random.default_rng(0), [1, 0], labels=False),
                                    2, 3)
  with pytest.raises(ValueError, match="oracle step label"):
    oracle_rows.step_classes(unlabelled.arrays.oracle_BxGxT, unlabelled.arrays.mask_BxGxT)


def _ctx(graphdef=None, **algo):
  cfg = ExperimentConfig(rollout=RolloutConfig(tasks_per_iter=1, group_size=4, max_turns=3,
                                               max_prompt_tokens=PROMPT, max_action_tokens=ACT),
                         algo=AlgoConfig(estimator="grpo", minibatch_size=8, **algo))
  return base.Context(cfg=cfg, graphdef=graphdef, tx=None, sampling_cfg=SCFG, batches=None,
                      to_device=None, pad_id=0, play=None, workdir="")


@pytest.mark.parametrize("on", [False, True])
def test_log_row_classes_reaches_the_estimator_methods_metrics(on):
  """algo.log_row_classes: the iteration's metrics hold rows/ values of both classes, and
  none when off; the rows trained on are the same either way."""
  gb = groups.from_episodes(_episodes(np.random.default_rng(3), [1, 0, 1, 0]), 4, 3)
  graphdef, params = nnx.split(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param)
  prep = estimator_lib.EstimatorAlgorithm().prepare(_ctx(graphdef, log_row_classes=on), 0,
                                                    gb, params, {})
  logged = {k for k in prep.metrics if k.startswith("rows/")}
  want = {f"rows/{c}_{m}" for c in oracle_rows.CLASSES
          for m in ("pg_grad_norm", "entropy", "abs_adv", "rows")}
  assert logged == (want if on else set())
  assert len(prep.rows) == 12


def test_decisive_update_keeps_the_decisive_rows_with_their_advantages():
  """algo.update_rows=decisive: one row per episode (its first step), carrying the same
  advantage as in the update over all rows."""
  gb = groups.from_episodes(_episodes(np.random.default_rng(1), [1, 0, 1, 0]), 4, 3)
  algo = estimator_lib.EstimatorAlgorithm()
  every = algo.prepare(_ctx(), 0, gb, None, {})
  decisive = algo.prepare(_ctx(update_rows="decisive"), 0, gb, None, {})
  assert len(every.rows) == 12 and len(decisive.rows) == 4
  np.testing.assert_array_equal(decisive.adv_BxGxT, every.adv_BxGxT)
  assert [r["advantage"] for r in decisive.rows] == [every.rows[3 * g]["advantage"]
                                                     for g in range(4)]
  assert [r["prompt_ids"] for r in decisive.rows] == [tr.steps[0].prompt_ids
                                                      for tr in gb.trajs]


def test_class_gradients_add_up_to_the_iterations_policy_gradient():
  """The decisive and routine rows' gradients (each row weighted 1 / all rows) sum to the
  gradient of the update's loss (seq-mean-token-mean, no KL) over all rows in one batch;
  the norms logged are those gradients' norms."""
  rng = np.random.default_rng(2)
  gb = groups.from_episodes(_episodes(rng, [1, 0, 0, 1, 0, 1]), 6, 3)
  adv_BxGxT = rng.normal(size=gb.arrays.mask_BxGxT.shape).astype(np.float32)
  classes = oracle_rows.step_classes(gb.arrays.oracle_BxGxT, gb.arrays.mask_BxGxT)
  by_class = {k: groups.rl_rows(gb, adv_BxGxT, "step", v) for k, v in classes.items()}
  rows = groups.rl_rows(gb, adv_BxGxT, "step")
  graphdef, params = nnx.split(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param)
  algo = AlgoConfig(loss_agg="seq-mean-token-mean", kl_coef=0.0, minibatch_size=8)
  kw = dict(seq_len=PROMPT + ACT, action_len=ACT, pad_id=0)
  metrics = oracle_rows.RowClassMetrics(graphdef, algo, SCFG, **kw)
  parts = {k: metrics.class_grads(params, r, len(rows))[0] for k, r in by_class.items()}

  (whole,) = D.ordered_batches(rows, batch_size=len(rows), **kw)
  loss_fn = ts.make_rl_loss(graphdef, algo, SCFG)
  want = jax.grad(lambda p: loss_fn(p, whole, None)[0])(params)
  got = jax.tree.map(np.add, parts["decisive"], parts["routine"])
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL), got, want)

  logged = metrics(params, by_class, len(rows))
  for k in oracle_rows.CLASSES:
    norm = np.sqrt(sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(parts[k])))
    assert logged[f"rows/{k}_pg_grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert logged[f"rows/{k}_rows"] == len(by_class[k])
    assert logged[f"rows/{k}_abs_adv"] == pytest.approx(
        np.mean([abs(r["advantage"]) for r in by_class[k]]))
    assert 0.0 < logged[f"rows/{k}_entropy"] <= np.log(V) + 1e-5
