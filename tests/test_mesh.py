"""Tests for csa_jax.distributed.mesh: mesh building, rules, and 4x2 == 1-device results.

The 8-device checks run in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (`python -m
tests.test_mesh --worker` from the repository root), so the rest of the suite keeps its single CPU device.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from csa_jax.distributed import mesh as mesh_lib
from tests import xla_env


def test_make_mesh_single_device():
  mesh = mesh_lib.make_mesh("1x1")
  assert mesh.axis_names == ("data", "model")
  assert dict(mesh.shape) == {"data": 1, "model": 1}


def test_mesh_device_count_mismatch_says_how_to_simulate():
  with pytest.raises(ValueError) as err:
    mesh_lib.make_mesh("4x2")
  msg = str(err.value)
  assert "8 devices" in msg and "1 are visible" in msg
  assert "XLA_FLAGS=--xla_force_host_platform_device_count=8" in msg
  assert "\n" not in msg


@pytest.mark.parametrize("spec", ["4", "4x2x1", "0x1", "ax2", "", None])
def test_bad_mesh_spec(spec):
  with pytest.raises(ValueError, match="DxM"):
    mesh_lib.make_mesh(spec)


def test_logical_to_spec_rules():
  assert mesh_lib.logical_to_spec(("embed", "mlp"), mesh_lib.TRAIN_RULES) == (
      P("data", "model"))
  assert mesh_lib.logical_to_spec(("embed", "mlp"), mesh_lib.SAMPLE_RULES) == (
      P(None, "model"))
  assert mesh_lib.logical_to_spec(("unknown", None), mesh_lib.TRAIN_RULES) == (
      P(None, None))
  # The same mesh axis is never used twice in one spec.
  rules = (("a", "model"), ("b", "model"))
  assert mesh_lib.logical_to_spec(("a", "b"), rules) == P("model", None)


def test_maybe_initialize_distributed_noop_without_env(monkeypatch):
  for key in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
              "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS",
              "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")  # single host
  assert mesh_lib.maybe_initialize_distributed() is False


def test_mesh_4x2_matches_one_device():
  env = xla_env.env_with_devices(8, JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-m", "tests.test_mesh",
                         "--worker"], env=env, cwd=root, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  assert "WORKER OK" in proc.stdout


# ---------------------------------------------------------------------------
# The 8-device worker (runs in the subprocess).

def _worker():
  import optax
  from flax import nnx

  from csa_jax.model import Decoder, ModelConfig, token_logprobs
  from csa_jax.model.sampling import SamplingConfig, left_pad, sample

  assert jax.device_count() == 8, jax.device_count()
  cfg = ModelConfig.tiny(64, qkv_bias=True)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 64, (8, 16)).astype(np.int32)
  mask = np.ones((8, 16), np.int32)
  mask[1, :5] = 0
  mask[6, 10:] = 0
  # Adam divides by sqrt(v): for a weight whose gradient is ~0, a 1e-9
  # reduction-order difference becomes an O(lr) step. eps=1e-4 keeps that
  # ill-conditioning out of a test that compares layouts, not optimisers.
  tx = optax.adamw(1e-2, eps=1e-4)

  def forward(params, tokens, mask):
    return nnx.merge(graphdef, params)(tokens, attention_mask_BxT=mask)

  def loss_fn(params, tokens, mask):
    logp = token_logprobs(forward(params, tokens, mask)[:, :-1], tokens[:, 1:])
    m = mask[:, 1:] * mask[:, :-1]
    return -(logp * m).sum() / m.sum()

  def train_step(params, opt_state, tokens, mask):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, mask)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def run_steps(step, params, opt_state, tokens, mask):
    losses = []
    for _ in range(3):
      params, opt_state, loss = step(params, opt_state, tokens, mask)
      losses.append(float(loss))
    return params, losses

  # ---- 1 device ----
  dev0 = jax.devices()[0]
  params1 = jax.device_put(params, dev0)
  ref_logits = np.asarray(jax.jit(forward)(params1, tokens, mask))
  ref_params, ref_losses = run_steps(jax.jit(train_step), params1,
                                     tx.init(params1), tokens, mask)
  prompts, pmask = left_pad([t[:n].tolist() for t, n in
                             zip(tokens, [3, 9, 1, 5, 4, 7, 2, 6])], 0,
                            bucket=8)
  scfg = SamplingConfig(max_new_tokens=8, temperature=0.9,
                        stop_token_ids=(7,))
  ref_out = sample(nnx.merge(graphdef, params1), prompts, pmask,
                   rng=jax.random.key(3), cfg=scfg, pad_id=0)
  # Repeated prompts (a shared prefill) and short decode segments, against one device
  # with neither.
  dup = [0, 1, 0, 0, 2, 1, 0, 3]
  ref_dup = sample(nnx.merge(graphdef, params1), prompts[dup], pmask[dup],
                   rng=jax.random.key(4), cfg=scfg, pad_id=0, share_prefill=False,
                   decode_segment=0)

  # ---- mesh 4x2 ----
  mesh = mesh_lib.make_mesh("4x2")
  p_sh = mesh_lib.state_shardings(params, mesh, mesh_lib.TRAIN_RULES)
  params_m = mesh_lib.shard_state(params, mesh, mesh_lib.TRAIN_RULES)
  kernel = params_m["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert kernel.sharding.spec == P("data", "model"), kernel.sharding
  assert kernel.addressable_shards[0].data.shape == (128 // 4, 256 // 2)
  q = params_m["layers"][1]["self_attn"]["q_proj"]["kernel"][...]
  assert q.sharding.spec == P("data", "model", None)
  assert q.addressable_shards[0].data.shape == (32, 2, 32)
  emb = params_m["embed_tokens"]["embedding"][...]
  assert emb.sharding.spec == P("model", "data")
  assert len({s.device for s in emb.addressable_shards}) == 8

  bs = mesh_lib.batch_sharding(mesh)
  tokens_m, mask_m = jax.device_put(tokens, bs), jax.device_put(mask, bs)
  logits_m = jax.jit(forward, in_shardings=(p_sh, bs, bs),
                     out_shardings=bs)(params_m, tokens_m, mask_m)
  assert logits_m.sharding.spec == P("data")
  np.testing.assert_allclose(np.asarray(logits_m), ref_logits, atol=1e-5,
                             rtol=1e-5)

  model_s = nnx.merge(graphdef, mesh_lib.shard_state(
      params, mesh, mesh_lib.SAMPLE_RULES))
  kern = model_s.layers[0].mlp.up_proj.kernel[...]
  assert kern.sharding.spec == P(None, "model")
  out = sample(model_s, prompts, pmask, rng=jax.random.key(3), cfg=scfg,
               pad_id=0, mesh=mesh)
  assert len(out.tokens_BxN.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN),
                                np.asarray(ref_out.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.mask_BxN),
                                np.asarray(ref_out.mask_BxN))
  np.testing.assert_allclose(np.asarray(out.logprobs_BxN),
                             np.asarray(ref_out.logprobs_BxN), atol=1e-5)
  out_dup = sample(model_s, prompts[dup], pmask[dup], rng=jax.random.key(4), cfg=scfg,
                   pad_id=0, mesh=mesh, decode_segment=3)
  np.testing.assert_array_equal(np.asarray(out_dup.tokens_BxN),
                                np.asarray(ref_dup.tokens_BxN))
  np.testing.assert_allclose(np.asarray(out_dup.logprobs_BxN),
                             np.asarray(ref_dup.logprobs_BxN), atol=1e-5)
  # A prefixed batch (optim.share_prefix): rows sharded over 'data', the shared prompt
  # tokens run once from the first row's copy of them; against the whole rows' forward on
  # one device.
  from csa_jax.update import data as data_lib
  from csa_jax.update.train_step import action_logits
  shared = tokens.copy()
  shared[:, :5] = tokens[0, :5]
  act_pos = np.tile(np.arange(8, 14), (8, 1)).astype(np.int32)
  rows = {"inputs": shared, "attn_mask": np.ones_like(mask), "act_pos": act_pos,
          "loss_mask": np.ones(act_pos.shape, np.float32)}
  rows["attn_mask"][3, 14:] = 0
  whole = np.asarray(jax.jit(action_logits, static_argnums=0)(graphdef, params1, rows))
  pre = data_lib.prefixed(rows, shared[0, :5].tolist())
  pre_m = {k: jax.device_put(v, bs) for k, v in pre.items()}
  logits_pre = jax.jit(action_logits, static_argnums=0, in_shardings=(p_sh, bs),
                       out_shardings=bs)(graphdef, params_m, pre_m)
  assert logits_pre.sharding.spec == P("data")
  np.testing.assert_allclose(np.asarray(logits_pre), whole, atol=1e-5, rtol=1e-5)
  # Train last: donation may free buffers that device_put shared with
  # `params` (single-device shards alias the source array).
  opt0 = tx.init(params)
  o_sh = mesh_lib.opt_state_shardings(tx, opt0, p_sh, mesh)
  opt_m = jax.jit(tx.init, out_shardings=o_sh)(params_m)
  mu = opt_m[0].mu["layers"][0]["mlp"]["down_proj"]["kernel"][...]
  assert mu.sharding.spec == P("model", "data"), mu.sharding
  step_m = jax.jit(train_step, in_shardings=(p_sh, o_sh, bs, bs),
                   out_shardings=(p_sh, o_sh, mesh_lib.replicated(mesh)),
                   donate_argnums=(0, 1))
  new_params_m, losses_m = run_steps(step_m, params_m, opt_m, tokens_m,
                                     mask_m)
  np.testing.assert_allclose(losses_m, ref_losses, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(new_params_m), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  down = new_params_m["layers"][0]["mlp"]["down_proj"]["kernel"][...]
  assert down.sharding.spec == P("model", "data")

  print("WORKER OK")


if __name__ == "__main__" and "--worker" in sys.argv:
  _worker()
