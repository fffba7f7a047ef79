"""A Hugging Face config.json <-> `ModelConfig` (Llama 3.x and Qwen2 / Qwen2.5), and the
one-line error every problem of a Hugging Face directory raises (csa_jax/model/hf.py reads
and writes the weights beside it).

config.json is accepted in both spellings: the older top-level `rope_theta` +
`rope_scaling` and transformers 5's `rope_parameters`. Supported rope types: default and
"llama3" (Llama 3.1 / 3.2). Every problem (missing file, unsupported architecture or
option, a field of the wrong type) raises `HFCheckpointError` with one line naming the
file and the field.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from csa_jax.model.config import Llama3RopeScaling, ModelConfig

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
CONFIG_FILE = "config.json"
NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class HFCheckpointError(ValueError):
  """A local Hugging Face directory that cannot be loaded (one-line message)."""


def read_json(path: str) -> Any:
  if not os.path.isfile(path):
    raise HFCheckpointError(f"missing file {path}")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise HFCheckpointError(f"malformed JSON in {path}: {e}") from None


def read_config(path: str) -> dict[str, Any]:
  """The parsed config.json of the directory `path` (an HFCheckpointError when it is
  missing, malformed or not an object)."""
  cfg_path = os.path.join(path, CONFIG_FILE)
  hf_cfg = read_json(cfg_path)
  if not isinstance(hf_cfg, dict):
    raise HFCheckpointError(f"{cfg_path}: expected a JSON object")
  return hf_cfg


def _field(hf: Mapping[str, Any], name: str, kind, source: str,
           default: Any = ...) -> Any:
  if name not in hf or hf[name] is None:
    if default is ...:
      raise HFCheckpointError(f"{source}: missing field {name!r}")
    return default
  value = hf[name]
  is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
  if kind is float:
    ok = is_number
  elif kind is int:
    ok = is_number and isinstance(value, int)
  else:
    ok = isinstance(value, kind)
  if not ok:
    raise HFCheckpointError(f"{source}: field {name!r} must be "
                            f"{kind.__name__}, got {value!r}")
  return value


def _rope(hf: Mapping[str, Any], source: str
          ) -> tuple[float, Llama3RopeScaling | None]:
  """(rope_theta, scaling) from rope_parameters (transformers 5) or the
  legacy rope_theta / rope_scaling fields."""
  params = hf.get("rope_parameters")
  if params is not None and not isinstance(params, dict):
    raise HFCheckpointError(f"{source}: field 'rope_parameters' must be an "
                            f"object, got {params!r}")
  legacy = hf.get("rope_scaling")
  if legacy is not None and not isinstance(legacy, dict):
    raise HFCheckpointError(f"{source}: field 'rope_scaling' must be an "
                            f"object or null, got {legacy!r}")
  merged = dict(legacy or {})
  merged.update(params or {})
  theta = merged.get("rope_theta", hf.get("rope_theta", 10_000.0))
  if not isinstance(theta, (int, float)) or isinstance(theta, bool):
    raise HFCheckpointError(f"{source}: rope_theta must be a number, "
                            f"got {theta!r}")
  rope_type = merged.get("rope_type", merged.get("type", "default"))
  if rope_type in (None, "default"):
    return float(theta), None
  if rope_type != "llama3":
    raise HFCheckpointError(
        f"{source}: unsupported rope type {rope_type!r} (supported: "
        "'default', 'llama3')")
  kw = {}
  for name in ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"):
    if name not in merged:
      raise HFCheckpointError(f"{source}: llama3 rope scaling needs "
                              f"{name!r}")
    kw[name] = merged[name]
  kw["original_max_position_embeddings"] = int(
      kw["original_max_position_embeddings"])
  try:
    return float(theta), Llama3RopeScaling(**kw)
  except (ValueError, TypeError) as e:
    raise HFCheckpointError(f"{source}: {e}") from None


def config_from_hf(hf: Mapping[str, Any], *, dtype: str = "float32",
                   param_dtype: str | None = None,
                   max_seq_len: int | None = None,
                   source: str = CONFIG_FILE) -> ModelConfig:
  """ModelConfig from a parsed config.json (Llama / Qwen2 causal LMs)."""
  archs = hf.get("architectures")
  if (not isinstance(archs, list) or len(archs) != 1
      or archs[0] not in ARCHITECTURES):
    raise HFCheckpointError(f"{source}: unsupported architectures {archs!r} "
                            f"(supported: {', '.join(ARCHITECTURES)})")
  arch = archs[0]
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise HFCheckpointError(f"{source}: unsupported hidden_act {act!r} "
                            "(supported: 'silu')")
  if arch == "LlamaForCausalLM":
    for flag in ("attention_bias", "mlp_bias"):
      if hf.get(flag):
        raise HFCheckpointError(f"{source}: unsupported {flag}=true "
                                "(the decoder has no o_proj / MLP biases)")
  if hf.get("use_sliding_window"):
    raise HFCheckpointError(f"{source}: unsupported use_sliding_window=true "
                            "(the decoder attends over the full context)")
  d = _field(hf, "hidden_size", int, source)
  h = _field(hf, "num_attention_heads", int, source)
  if h > 0 and d % h and "head_dim" not in hf:
    raise HFCheckpointError(f"{source}: hidden_size {d} is not a multiple "
                            f"of num_attention_heads {h}")
  theta, scaling = _rope(hf, source)
  if dtype not in NP_DTYPES:
    raise HFCheckpointError(f"dtype must be one of {sorted(NP_DTYPES)}, "
                            f"got {dtype!r}")
  try:
    return ModelConfig(
        vocab_size=_field(hf, "vocab_size", int, source),
        hidden_size=d,
        intermediate_size=_field(hf, "intermediate_size", int, source),
        num_layers=_field(hf, "num_hidden_layers", int, source),
        num_heads=h,
        num_kv_heads=_field(hf, "num_key_value_heads", int, source, h),
        head_dim=_field(hf, "head_dim", int, source, d // h),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(_field(hf, "rms_norm_eps", float, source, 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        max_seq_len=(max_seq_len if max_seq_len is not None else
                     _field(hf, "max_position_embeddings", int, source, 8192)),
        param_dtype=param_dtype or dtype,
        dtype=dtype)
  except ValueError as e:
    raise HFCheckpointError(f"{source}: {e}") from None


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """config.json fields for `cfg` (Qwen2 when it has q/k/v biases)."""
  arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
  rope: dict[str, Any] = {"rope_type": "default"}
  if cfg.rope_scaling is not None:
    rope = {"rope_type": "llama3",
            **{k: getattr(cfg.rope_scaling, k) for k in (
                "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")}}
  return {
      "architectures": [arch],
      "model_type": "qwen2" if cfg.qkv_bias else "llama",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_seq_len,
      "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_embeddings,
      # Both spellings: older transformers read these two, 5.x reads
      # rope_parameters (and still accepts the legacy ones).
      "rope_theta": cfg.rope_theta,
      "rope_scaling": None if cfg.rope_scaling is None else dict(rope),
      "rope_parameters": {**rope, "rope_theta": cfg.rope_theta},
      "torch_dtype": cfg.param_dtype,
      "dtype": cfg.param_dtype,
  }
