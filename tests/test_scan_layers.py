"""Scanned layers (ModelConfig.scan_layers) against the unrolled model they must equal.

The unrolled decoder is checked against transformers and NumPy elsewhere
(test_hf_parity, test_model); here the scanned one must hold the same weights for a
seed, and give the same logits, gradients, samples and HF checkpoints.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model import Decoder, ModelConfig, hf
from csa_jax.model.decoder import token_logprobs
from csa_jax.model.sampling import SamplingConfig, left_pad, sample

V = 96
CFG = ModelConfig.tiny(V, num_layers=3, qkv_bias=True, max_seq_len=128)


def _pair(**overrides):
  cfg = CFG.replace(**overrides)
  return (Decoder(cfg, rngs=nnx.Rngs(3)),
          Decoder(cfg.replace(scan_layers=True), rngs=nnx.Rngs(3)))


# Forwards and gradients run compiled (as the trainer runs them): eagerly, each operation
# of the model compiles on its own, hundreds of small programs a test.
_forward = nnx.jit(lambda model, tokens, mask: model(tokens, attention_mask_BxT=mask))


def _batch(b=3, t=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, V, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[0, :4] = 0  # a left-padded row
  mask[1, -3:] = 0  # a right-padded row
  return jnp.asarray(tokens), jnp.asarray(mask)


def test_same_seed_same_weights_stacked():
  unrolled, scanned = _pair()
  flat_u = dict(nnx.to_flat_state(nnx.state(unrolled, nnx.Param)))
  flat_s = dict(nnx.to_flat_state(nnx.state(scanned, nnx.Param)))
  assert len(flat_s) < len(flat_u)  # one stacked entry per layer parameter
  for path, var in flat_s.items():
    if path[0] != "layers":
      np.testing.assert_array_equal(var.get_value(), flat_u[path].get_value())
      continue
    assert var.get_metadata()["out_sharding"][0] == "layers"
    assert var.get_value().shape[0] == CFG.num_layers
    for i in range(CFG.num_layers):
      np.testing.assert_array_equal(var.get_value()[i],
                                    flat_u[("layers", i) + path[1:]].get_value())


def test_stacked_axis_replicates_under_every_rules_table():
  for rules in (mesh_lib.TRAIN_RULES, mesh_lib.SAMPLE_RULES):
    spec = mesh_lib.logical_to_spec(("layers", "embed", "mlp"), rules)
    assert spec[0] is None and spec[2] == "model"


@pytest.mark.parametrize("remat", [False, True])
def test_logits_and_gradients_equal_unrolled(remat):
  unrolled, scanned = _pair(remat=remat)
  tokens, mask = _batch()
  targets = jnp.roll(tokens, -1, axis=1)

  def loss(model):
    logits = model(tokens, attention_mask_BxT=mask)
    return -(token_logprobs(logits, targets) * mask).sum()

  np.testing.assert_allclose(_forward(scanned, tokens, mask), _forward(unrolled, tokens, mask),
                             rtol=1e-5, atol=1e-5)
  g_u = nnx.to_flat_state(nnx.jit(nnx.grad(loss))(unrolled))
  g_s = dict(nnx.to_flat_state(nnx.jit(nnx.grad(loss))(scanned)))
  for path, var in g_u:
    if path[0] == "layers":
      got = g_s[("layers",) + path[2:]].get_value()[path[1]]
    else:
      got = g_s[path].get_value()
    np.testing.assert_allclose(got, var.get_value(), rtol=1e-4, atol=1e-6)


def test_optimizer_step_equal_unrolled():
  """An optax update over the stacked tree moves each layer as over the unrolled one.
  (SGD: Adam's g / sqrt(v) turns float noise in a near-zero gradient into a step of
  the full learning rate, which would test Adam, not the layout.)"""
  unrolled, scanned = _pair()
  tokens, mask = _batch(seed=1)
  tx = optax.sgd(0.5)

  def one_step(model):
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens, attention_mask_BxT=mask)
      return -token_logprobs(logits, jnp.roll(tokens, -1, 1)).mean()

    grads = jax.jit(jax.grad(loss))(params)
    updates, _ = tx.update(grads, tx.init(params), params)
    return nnx.merge(graphdef, optax.apply_updates(params, updates))

  after_u, after_s = one_step(unrolled), one_step(scanned)
  np.testing.assert_allclose(after_s.layers.mlp.down_proj.kernel[...][2],
                             after_u.layers[2].mlp.down_proj.kernel[...], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_forward(after_s, tokens, None), _forward(after_u, tokens, None),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk,segment", [(0, 0), (2, 0), (0, 3)])
def test_greedy_samples_equal_unrolled(chunk, segment):
  """Also with the stacked cache grown segment by segment and a prefill shared by
  identical prompts (rows 0 and 4, 1 and 5): the cache's batch and slot axes sit one further
  right behind the layer axis."""
  unrolled, scanned = _pair()
  rng = np.random.default_rng(2)
  prompts = [list(rng.integers(1, V, n)) for n in (5, 9, 3, 7)]
  tokens, mask = left_pad(prompts + prompts[:2], 0, bucket=8)
  cfg = SamplingConfig(max_new_tokens=10, greedy=True)
  kw = dict(rng=jax.random.key(0), cfg=cfg, pad_id=0, prefill_chunk=chunk,
            decode_segment=segment)
  a, b = sample(unrolled, tokens, mask, **kw), sample(scanned, tokens, mask, **kw)
  np.testing.assert_array_equal(b.tokens_BxN, a.tokens_BxN)
  np.testing.assert_allclose(b.logprobs_BxN, a.logprobs_BxN, rtol=1e-5, atol=1e-5)


def test_sampling_on_a_mesh_with_stacked_cache():
  unrolled, scanned = _pair()
  mesh = mesh_lib.make_mesh("1x1")
  mesh_lib.shard_model(scanned, mesh, mesh_lib.SAMPLE_RULES)
  tokens, mask = left_pad([[5, 6, 7], [8, 9]], 0, bucket=4)
  cfg = SamplingConfig(max_new_tokens=6, temperature=0.8)
  a = sample(unrolled, tokens, mask, rng=jax.random.key(4), cfg=cfg, pad_id=0)
  b = sample(scanned, tokens, mask, rng=jax.random.key(4), cfg=cfg, pad_id=0, mesh=mesh)
  np.testing.assert_array_equal(b.tokens_BxN, a.tokens_BxN)


def test_hf_checkpoint_loads_stacked_and_saves_back(tmp_path):
  unrolled, _ = _pair()
  hf.save_pretrained(unrolled, str(tmp_path / "u"))
  scanned = hf.load_model(str(tmp_path / "u"), scan_layers=True)
  assert scanned.cfg.scan_layers
  assert scanned.layers.self_attn.k_proj.bias[...].shape[0] == CFG.num_layers
  tokens, mask = _batch(seed=3)
  np.testing.assert_allclose(scanned(tokens, attention_mask_BxT=mask),
                             unrolled(tokens, attention_mask_BxT=mask), rtol=1e-5, atol=1e-5)
  hf.save_pretrained(scanned, str(tmp_path / "s"))
  import safetensors.numpy
  want = safetensors.numpy.load_file(str(tmp_path / "u" / hf.SINGLE_FILE))
  got = safetensors.numpy.load_file(str(tmp_path / "s" / hf.SINGLE_FILE))
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_hf_missing_layer_tensor_is_named(tmp_path):
  unrolled, _ = _pair()
  hf.save_pretrained(unrolled, str(tmp_path))
  import safetensors.numpy
  path = str(tmp_path / hf.SINGLE_FILE)
  tensors = safetensors.numpy.load_file(path)
  del tensors["model.layers.2.mlp.up_proj.weight"]
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
  with pytest.raises(hf.HFCheckpointError, match="model.layers.2.mlp.up_proj.weight"):
    hf.load_model(str(tmp_path), scan_layers=True)


def test_scan_layers_must_be_a_bool():
  with pytest.raises(ValueError, match="scan_layers"):
    CFG.replace(scan_layers="yes")
