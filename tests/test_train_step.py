"""The jitted updates: SFT learns a fixed batch; the RL step's first move is exactly the
policy gradient of -A * log pi (ratio 1, nothing clipped), computed independently."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax import data as D
from csa_jax import train_step as ts
from csa_jax.config import AlgoConfig
from csa_jax.model import Decoder, ModelConfig, token_logprobs
from csa_jax.sampling import SamplingConfig

CFG = ModelConfig.tiny(vocab_size=64, max_seq_len=32, hidden_size=32, intermediate_size=64,
                       head_dim=8)


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
  logits = nnx.merge(graphdef, params)(jnp.asarray(batch["inputs"]),
                                       attention_mask_BxT=jnp.asarray(batch["attn_mask"]))
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

  want = jax.grad(reference_loss)(params)
  lr = 0.1
  tx = optax.sgd(lr)
  algo = AlgoConfig(loss_agg=agg, clip_low=0.2, clip_high=0.28)
  step = ts.make_rl_step(graphdef, tx, algo, SamplingConfig(max_new_tokens=4))
  before = jax.tree.map(np.asarray, params)
  state, m = step(ts.init_state(params, tx), batch)
  assert float(m["clip_frac"]) == 0.0
  assert abs(float(m["approx_kl"])) < 1e-6
  got = jax.tree.map(lambda b, a: (b - np.asarray(a)) / lr, before, state.params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, np.asarray(w), rtol=1e-3, atol=1e-6)


def test_rl_step_moves_logp_with_the_advantage_sign():
  graphdef, params = _model()
  adv = np.array([1.0, 1.0, -1.0, -1.0], np.float32)
  _, batch = _batch(np.random.default_rng(2), adv=adv)
  batch["old_logp"] = _old_logps(graphdef, params, batch).astype(np.float32)
  jb = {k: jnp.asarray(v) for k, v in batch.items()}
  tx = optax.sgd(0.05)
  step = ts.make_rl_step(graphdef, tx, AlgoConfig(), SamplingConfig(max_new_tokens=4))
  state, _ = step(ts.init_state(params, tx), jb)
  after = _old_logps(graphdef, state.params, batch)
  delta = (after - batch["old_logp"]).sum(1)
  assert (delta[:2] > 0).all() and (delta[2:] < 0).all()
