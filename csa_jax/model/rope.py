"""Rotary position embeddings (RoPE) as Llama 3 and Qwen2 use them: the inverse frequencies
(with Llama 3.1's frequency scaling when the config has it), their cos and sin at given
positions, and the rotation of queries and keys in Hugging Face's half-split
(`rotate_half`) layout. The decoder (csa_jax/model/decoder.py) applies them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from csa_jax.model.config import Llama3RopeScaling


def rope_inv_freq(head_dim: int, theta: float,
                  scaling: Llama3RopeScaling | None) -> np.ndarray:
  """Inverse rotary frequencies [Dh/2] (float32), Llama 3.1 scaling if given."""
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64)
                              / head_dim))
  if scaling is not None:
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor,
                      inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def rope_cos_sin(positions_BxT: jax.Array, inv_freq: np.ndarray):
  """cos, sin [B, T, Dh/2] in float32."""
  angles = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxNxDh: jax.Array, cos: jax.Array, sin: jax.Array):
  """Rotates the two halves of the head dimension (HF `rotate_half` layout)."""
  x1, x2 = jnp.split(x_BxTxNxDh.astype(jnp.float32), 2, axis=-1)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxDh.dtype)
