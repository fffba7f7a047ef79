"""Configuration of the Llama 3 / Qwen2 style decoder (policy model).

Covers the Llama 3 / 3.1 / 3.2 family (Meta, "The Llama 3 Herd of Models",
arXiv 2407.21783: grouped-query attention, SwiGLU, RMSNorm, rotary embeddings
with the "llama3" frequency scaling) and the Qwen2 / Qwen2.5 family (arXiv
2407.10671: the same block plus biases on the q/k/v projections). Field names
follow the Hugging Face `LlamaConfig` / `Qwen2Config` meanings so a later
loader can fill them one to one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The dtype names a config accepts; the jnp types are looked up when a model is built, so
# that reading and checking a config (launch.py --list, a bad --set) imports no jax.
_DTYPES = ("float32", "bfloat16")


def _jnp_dtype(name: str):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return getattr(jnp, name)


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3.1 rope scaling (HF `rope_scaling={"rope_type": "llama3", ...}`).

  Low frequencies (wavelength above original_max_position_embeddings /
  low_freq_factor) are divided by `factor`, high frequencies are kept, and the
  band in between is interpolated smoothly.
  """
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.factor <= 0:
      raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
    if not self.high_freq_factor > self.low_freq_factor > 0:
      raise ValueError(
          "rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
          f"{self.high_freq_factor} and {self.low_freq_factor}")
    if self.original_max_position_embeddings <= 0:
      raise ValueError("rope_scaling.original_max_position_embeddings must be "
                       f"> 0, got {self.original_max_position_embeddings}")


# The decoder's projections a LoRA adapter may sit on (Hugging Face / PEFT module names).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Low-rank adapters (Hu et al. 2021, arXiv 2106.09685) on the decoder's projections.

  rank 0: off (every parameter trains). rank r > 0: each projection named in `targets`
  computes x W + (alpha / r) (x A) B with A [in, r] and B [r, out] trainable (A as PEFT
  initialises it, uniform in +-1/sqrt(in); B zero, so a fresh adapter leaves the model as
  it was) and every other parameter frozen (csa_jax/model/lora.py). param_dtype: the
  adapters' storage dtype (the base weights keep ModelConfig.param_dtype).
  """
  rank: int = 0
  alpha: float = 16.0
  targets: tuple[str, ...] = LORA_TARGETS
  param_dtype: str = "float32"

  def __post_init__(self):
    if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
      raise ValueError(f"LoRAConfig.rank must be an int >= 0 (0: off), got {self.rank!r}")
    if not self.alpha > 0:
      raise ValueError(f"LoRAConfig.alpha must be > 0, got {self.alpha}")
    object.__setattr__(self, "targets", tuple(self.targets))
    bad = [t for t in self.targets if t not in LORA_TARGETS]
    if bad or (self.rank and not self.targets):
      raise ValueError(f"LoRAConfig.targets must be a non-empty subset of "
                       f"{', '.join(LORA_TARGETS)}, got {self.targets!r}")
    if self.param_dtype not in _DTYPES:
      raise ValueError(f"LoRAConfig.param_dtype must be one of {sorted(_DTYPES)}, "
                       f"got {self.param_dtype!r}")

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @property
  def jnp_param_dtype(self) -> Any:
    return _jnp_dtype(self.param_dtype)

  def on(self, name: str) -> bool:
    """Whether the projection `name` carries an adapter."""
    return self.enabled and name in self.targets


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder hyper-parameters; dtypes are strings ("float32" / "bfloat16").

  param_dtype: storage dtype of the parameters. dtype: compute dtype of the
  matmuls and activations (norms, softmax and the final logits are float32).
  remat: rematerialise each decoder layer in the backward pass (saves memory).
  scan_layers: store the layers stacked and run them as one lax.scan (compile time
  flat in depth; see csa_jax/model/decoder.py). Changes the parameter tree, so a
  checkpoint restores only into a model with the same setting.
  lora: low-rank adapters with the base weights frozen (LoRAConfig; rank 0: off).
  """
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 500_000.0
  rope_scaling: Llama3RopeScaling | None = None
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = False
  qkv_bias: bool = False
  max_seq_len: int = 8192
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  scan_layers: bool = False
  lora: LoRAConfig = LoRAConfig()

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size",
                 "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, "
                         f"got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
          f"num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for rotary "
                       f"embeddings, got {self.head_dim}")
    if self.rope_theta <= 0:
      raise ValueError(f"ModelConfig.rope_theta must be > 0, "
                       f"got {self.rope_theta}")
    if self.rms_norm_eps <= 0:
      raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, "
                       f"got {self.rms_norm_eps}")
    if not (self.rope_scaling is None
            or isinstance(self.rope_scaling, Llama3RopeScaling)):
      raise ValueError("ModelConfig.rope_scaling must be None or a "
                       f"Llama3RopeScaling, got {self.rope_scaling!r}")
    for name in ("remat", "scan_layers"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"ModelConfig.{name} must be true or false, "
                         f"got {getattr(self, name)!r}")
    if not isinstance(self.lora, LoRAConfig):
      raise ValueError(f"ModelConfig.lora must be a LoRAConfig, got {self.lora!r}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of "
                         f"{sorted(_DTYPES)}, got {getattr(self, name)!r}")

  @property
  def jnp_dtype(self) -> Any:
    return _jnp_dtype(self.dtype)

  @property
  def jnp_param_dtype(self) -> Any:
    return _jnp_dtype(self.param_dtype)

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head (grouped-query attention)."""
    return self.num_heads // self.num_kv_heads

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def tiny(cls, vocab_size: int, **overrides) -> "ModelConfig":
    """A ~0.3M-parameter (plus 2 x vocab x 128 embeddings) CPU-sized config.

    Grouped-query (4 query heads, 2 key/value heads), untied, fp32.
    """
    fields = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
        rope_theta=10_000.0, max_seq_len=1024)
    fields.update(overrides)
    return cls(**fields)


# The shapes of the pretrained checkpoints the experiments are sized for, as their
# config.json files give them (Hugging Face: meta-llama/Llama-3.1-8B-Instruct,
# Qwen/Qwen2.5-1.5B-Instruct, Qwen/Qwen2.5-7B-Instruct, HuggingFaceTB/SmolLM2-135M-Instruct,
# the last as its packaged GGUF file holds it). A run takes the real shape from `model_path`
# (csa_jax/pretrained.py); these let `launch.py --dry-run` plan memory with no weights at hand.
# Parameters are stored in float32 (the optimizer's master copy: at the recipes' 1e-6
# learning rate a bfloat16 weight would not move) and computed in bfloat16, each layer
# rematerialised in the backward pass.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500_000.0,
        rope_scaling=Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192),
        rms_norm_eps=1e-5, tie_embeddings=False, qkv_bias=False, max_seq_len=131072),
    "qwen2.5-1.5b": dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_embeddings=True, qkv_bias=True, max_seq_len=32768),
    "qwen2.5-7b": dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_embeddings=False, qkv_bias=True, max_seq_len=32768),
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100_000.0,
        rms_norm_eps=1e-5, tie_embeddings=True, qkv_bias=False, max_seq_len=8192),
}


def preset(name: str, **overrides) -> ModelConfig:
  """A pretrained checkpoint's shape (PRESETS), fp32 master weights, bf16 compute, remat,
  scanned layers (28-32 layers unrolled compile several times slower)."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
  fields = dict(PRESETS[name], param_dtype="float32", dtype="bfloat16", remat=True,
                scan_layers=True)
  fields.update(overrides)
  return ModelConfig(**fields)
