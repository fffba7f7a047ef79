"""LoRA policies: the trainable adapters, the frozen base, and their exports.

With `ModelConfig.lora.rank > 0` every targeted projection of the decoder carries two
`nnx.LoRAParam`s, lora_a [in..., r] and lora_b [r, out...] (csa_jax/model/decoder.py,
`Dense`), and computes x W + (alpha / r) (x A) B. A parameter State of such a model holds
both kinds; this module splits it:

- `split(tree)` -> (trainable, frozen): in every nnx.State of `tree` that holds adapters,
  the adapters are the trainable part and every other parameter (the base: embeddings,
  norms, projections, LM head) the frozen part. A tree without adapters is all trainable
  (a full-parameter run), its frozen part empty. `merge` puts the two back together.
  The jitted updates (csa_jax/update/train_step.py) differentiate and donate the trainable part
  only and take the frozen part as a plain argument: the optimizer holds moments for the
  adapters alone, and the base is never copied, so the policy, its KL reference (the SFT
  adapters over the same base) and the sampler all read one set of base buffers.
- `strip` / `unstrip`: what a checkpoint saves (the adapters; the base is the pointer in
  the checkpoint's meta, `model_path` or the seed that made it) and how it is restored
  (the adapters into the run's own base).
- `merged_state` / `merged_model`: the adapters folded into the kernels, W + (alpha / r) A B,
  as a model without adapters (the sampler's alternative, and what `hf.save_pretrained`
  writes of an adapted model).

The Hugging Face files of an adapted model (the merged checkpoint, and the adapters alone
in the PEFT layout: `save_peft`) are written by csa_jax/model/hf.py, which owns the
tensor names; this module knows nothing of file formats.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from csa_jax.model.config import LoRAConfig, ModelConfig
from csa_jax.model.decoder import Decoder

def _is_state(x) -> bool:
  return isinstance(x, nnx.State)


def has_lora(x) -> bool:
  """Whether `x` is an nnx.State holding at least one adapter."""
  return _is_state(x) and any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(x))


def tree_has_lora(tree) -> bool:
  """Whether any nnx.State inside `tree` holds adapters."""
  return any(has_lora(x) for x in jax.tree.leaves(tree, is_leaf=_is_state))


def _key(path) -> str:
  return jax.tree_util.keystr(path)


def split(tree) -> tuple[Any, dict[str, Any]]:
  """(trainable, frozen): `tree` with each adapter-holding State reduced to its adapters,
  and {position: that State's base}. Without adapters: (tree, {})."""
  frozen: dict[str, Any] = {}

  def one(path, x):
    if has_lora(x):
      adapters, base = nnx.split_state(x, nnx.LoRAParam, ...)
      frozen[_key(path)] = base
      return adapters
    return x

  return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_state), frozen


def merge(trainable, frozen: dict[str, Any]):
  """The inverse of `split`."""
  if not frozen:
    return trainable

  def one(path, x):
    base = frozen.get(_key(path))
    return x if base is None else nnx.merge_state(x, base)

  return jax.tree_util.tree_map_with_path(one, trainable, is_leaf=_is_state)


def trainable(tree):
  return split(tree)[0]


def strip(tree):
  """What a checkpoint saves of `tree`: the adapters where there are any."""
  return trainable(tree)


def unstrip(restored, template):
  """`restored` (a stripped tree) with the frozen parts of `template` put back: the run's
  own base buffers, not a copy."""
  return merge(restored, split(template)[1])


# ----------------------------------------------------------------------------------------
# Sizes.


def _nbytes(tree, per_device: bool) -> int:
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.shape
    sharding = getattr(x, "sharding", None)
    if per_device and sharding is not None:
      shape = sharding.shard_shape(x.shape)
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
  return total


def sizes(params, per_device: bool = True) -> dict[str, int]:
  """Bytes (one device's shard where the arrays are placed) of the adapters and of the
  base; a params State without adapters is all base."""
  if not has_lora(params):
    return {"adapters": 0, "base": _nbytes(params, per_device)}
  adapters, base = nnx.split_state(params, nnx.LoRAParam, ...)
  return {"adapters": _nbytes(adapters, per_device), "base": _nbytes(base, per_device)}


# ----------------------------------------------------------------------------------------
# Initialisation of the adapters of a loaded base.


def init_adapters(cfg: ModelConfig, seed: int, shardings=None):
  """The adapters a `Decoder(cfg, rngs=nnx.Rngs(seed))` starts with (A drawn, B zero),
  computed alone (the base's initialisation is traced and dropped); placed by
  `shardings` (a State of shardings of the same adapters) when given."""

  def make():
    return nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)), nnx.LoRAParam, ...)[1]

  return jax.jit(make, out_shardings=shardings)()


# ----------------------------------------------------------------------------------------
# Merged weights.


def _fold(kernel, a, b, scale, stacked: bool):
  def one(k, a, b):
    delta = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
    return (k.astype(jnp.float32) + scale * delta).astype(k.dtype)

  return jax.vmap(one)(kernel, a, b) if stacked else one(kernel, a, b)


def merged_state(params, cfg: ModelConfig):
  """`params` (a model's State with adapters) as the State of the same model without
  adapters: every adapted kernel replaced by W + (alpha / r) A B (computed in float32,
  stored in the kernel's dtype). Jittable."""
  flat = dict(nnx.to_flat_state(params))
  out = []
  for path, var in flat.items():
    if isinstance(var, nnx.LoRAParam):
      continue
    if path[-1] == "kernel" and path[:-1] + ("lora_a",) in flat:
      a = flat[path[:-1] + ("lora_a",)].get_value()
      b = flat[path[:-1] + ("lora_b",)].get_value()
      stacked = cfg.scan_layers and path[0] == "layers"
      var = var.replace(_fold(var.get_value(), a, b, cfg.lora.scale, stacked))
    out.append((path, var))
  return nnx.from_flat_state(out)


def base_config(cfg: ModelConfig) -> ModelConfig:
  return cfg.replace(lora=LoRAConfig())


def base_graphdef(cfg: ModelConfig):
  """The graph of the model without adapters (what `merged_state` fills)."""
  abstract = nnx.eval_shape(lambda: Decoder(base_config(cfg), rngs=nnx.Rngs(0)))
  return nnx.split(abstract, nnx.Param)[0]


def merged_model(model: Decoder) -> Decoder:
  """A Decoder without adapters computing what `model` computes (adapters folded in)."""
  cfg = model.cfg
  if not cfg.lora.enabled:
    return model
  params = nnx.state(model, nnx.Param)
  return nnx.merge(base_graphdef(cfg), merged_state(params, cfg))
