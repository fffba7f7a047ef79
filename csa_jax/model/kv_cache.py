"""The KV cache: its layout, its shape and shardings, and one layer's view of it (`LayerKV`),
shared by the decoder (which writes and reads it), the sampler and the dry run."""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax

from csa_jax.model.config import ModelConfig

# Logical axes of one layer's KV cache array [B, K, S, Dh]: heads before slots, so a decode
# step's attention is two batched matmuls over (B, K) that read the cache as it lies (XLA
# CPU transposed a [B, S, K, Dh] cache for them, or ran them as slow loop reductions).
CACHE_AXES = ("cache_batch", "kv_heads", "cache_seq", "head_dim")


@flax.struct.dataclass
class KVCache:
  """Key/value caches in the compute dtype: a tuple of L arrays [B, K, S, Dh], or with
  scanned layers one stacked array [L, B, K, S, Dh] each."""
  k: tuple[jax.Array, ...] | jax.Array
  v: tuple[jax.Array, ...] | jax.Array


class LayerKV(NamedTuple):
  """One layer's view of a KV cache: its own arrays [B, K, S, Dh] (layer None), or the
  stacked [L, B, K, S, Dh] with this layer's index. A scanned layer then writes only its
  new slots into the stack (a slice taken out and written back whole would move the
  layer's entire cache at every decode step)."""
  k: jax.Array
  v: jax.Array
  layer: jax.Array | None = None

  def write(self, k_BxKxTxDh: jax.Array, v_BxKxTxDh: jax.Array, index) -> "LayerKV":
    """Writes T new slots at index .. index + T - 1."""
    start = (0, 0, index, 0)
    k_new, v_new = k_BxKxTxDh.astype(self.k.dtype), v_BxKxTxDh.astype(self.v.dtype)
    if self.layer is not None:
      start, k_new, v_new = (self.layer,) + start, k_new[None], v_new[None]
    return self._replace(k=jax.lax.dynamic_update_slice(self.k, k_new, start),
                         v=jax.lax.dynamic_update_slice(self.v, v_new, start))

  def read(self) -> tuple[jax.Array, jax.Array]:
    """This layer's (k, v) caches [B, K, S, Dh]."""
    if self.layer is None:
      return self.k, self.v
    return (jax.lax.dynamic_index_in_dim(self.k, self.layer, keepdims=False),
            jax.lax.dynamic_index_in_dim(self.v, self.layer, keepdims=False))


def cache_batch_axis(cfg: ModelConfig) -> int:
  """The batch axis of every KVCache leaf (1 behind the stacked layer axis)."""
  return 1 if cfg.scan_layers else 0


def cache_shape(cfg: ModelConfig, batch: int, slots: int) -> tuple[int, int, int, int]:
  """One layer's KV cache shape [B, K, S, Dh] (CACHE_AXES)."""
  return (batch, cfg.num_kv_heads, slots, cfg.head_dim)


def cache_shardings(cfg: ModelConfig, one_layer: jax.sharding.NamedSharding) -> KVCache:
  """A KVCache of shardings from one layer's [B, K, S, Dh] sharding."""
  if cfg.scan_layers:
    spec = jax.sharding.PartitionSpec(None, *one_layer.spec)
    one = jax.sharding.NamedSharding(one_layer.mesh, spec)
    return KVCache(k=one, v=one)
  return KVCache(k=(one_layer,) * cfg.num_layers, v=(one_layer,) * cfg.num_layers)
