"""Hugging Face checkpoints <-> the NNX decoder (Llama 3.x and Qwen2 / Qwen2.5).

Reads a local Hugging Face model directory the way transformers'
`from_pretrained` does for `LlamaForCausalLM` / `Qwen2ForCausalLM` (config.json,
model.safetensors or model-*.safetensors + model.safetensors.index.json,
tokenizer.json, tokenizer_config.json), with no network access and without
torch: the tensors are read with the `safetensors` NumPy backend (bfloat16 via
ml_dtypes) and renamed/transposed onto `csa_jax.model.Decoder` (the mapping is
in decoder.py's docstring). `save_pretrained` writes the inverse, so a model
trained here loads back into transformers.

config.json is accepted in both spellings: the older top-level `rope_theta` +
`rope_scaling` and transformers 5's `rope_parameters`. Supported rope types:
default and "llama3" (Llama 3.1 / 3.2). Every problem (missing file, missing or
unexpected tensor, shape mismatch, unsupported architecture or option) raises
`HFCheckpointError` with one line naming the file and the field or tensor.

`save_peft` writes the LoRA adapters of a policy alone as a PEFT adapter directory
(adapter_config.json + adapter_model.safetensors, which huggingface/peft's
`PeftModel.from_pretrained(base, dir)` loads), with lora_A.weight [r, in] and
lora_B.weight [out, r] per projection, as PEFT's `LoraLayer` stores them.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, Mapping

import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
from flax import nnx

from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model import lora as lora_lib
from csa_jax.model.config import Llama3RopeScaling, LoRAConfig, ModelConfig
from csa_jax.model.decoder import Decoder
from csa_jax.model.tokenizer import Tokenizer

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's adapter directory (`save_peft`)
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# Buffers some exporters store next to the weights; not parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class HFCheckpointError(ValueError):
  """A local Hugging Face directory that cannot be loaded (one-line message)."""


def _read_json(path: str) -> Any:
  if not os.path.isfile(path):
    raise HFCheckpointError(f"missing file {path}")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise HFCheckpointError(f"malformed JSON in {path}: {e}") from None


# ---------------------------------------------------------------- config ----

def read_config(path: str) -> dict[str, Any]:
  """The parsed config.json of the directory `path` (an HFCheckpointError when it is
  missing, malformed or not an object)."""
  cfg_path = os.path.join(path, CONFIG_FILE)
  hf_cfg = _read_json(cfg_path)
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
  if dtype not in _NP_DTYPES:
    raise HFCheckpointError(f"dtype must be one of {sorted(_NP_DTYPES)}, "
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


# --------------------------------------------------------------- weights ----

def _hf_name(path: tuple) -> str:
  """Our parameter path -> the HF tensor name (before the transpose)."""
  leaf = path[-1]
  if path[0] == "embed_tokens":
    return "model.embed_tokens.weight"
  if path[0] == "lm_head":
    return "lm_head.weight"
  if path[0] == "norm":
    return "model.norm.weight"
  mid = ".".join(str(p) for p in path[:-1])
  return f"model.{mid}.{'bias' if leaf == 'bias' else 'weight'}"


def _hf_shape(path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  """HF tensor shape for one of our parameter shapes."""
  if path[-1] == "kernel":
    if path[-2] in ("q_proj", "k_proj", "v_proj"):
      d, n, dh = shape
      return (n * dh, d)
    if path[-2] == "o_proj":
      n, dh, d = shape
      return (d, n * dh)
    return shape[::-1]  # mlp and lm_head: [in, out] <- weight [out, in]
  if path[-1] == "bias":
    return (shape[0] * shape[1],)
  return shape


def _from_hf(path: tuple, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if path[-1] == "kernel":
    return w.T.reshape(shape)
  return w.reshape(shape)


def _to_hf(path: tuple, w: np.ndarray) -> np.ndarray:
  if path[-1] == "kernel":
    if path[-2] in ("q_proj", "k_proj", "v_proj"):
      return w.reshape(w.shape[0], -1).T
    if path[-2] == "o_proj":
      return w.reshape(-1, w.shape[-1]).T
    return w.T
  if path[-1] == "bias":
    return w.reshape(-1)
  return w  # embedding [V, D] and norm weights are stored as they are


class _Tensors:
  """Name -> file map over one or several .safetensors files (lazy reads)."""

  def __init__(self, path: str, stack: contextlib.ExitStack):
    index_path = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index_path):
      index = _read_json(index_path)
      wmap = index.get("weight_map") if isinstance(index, dict) else None
      if not isinstance(wmap, dict) or not wmap:
        raise HFCheckpointError(f"{index_path}: missing or empty 'weight_map'")
      files = sorted(set(wmap.values()))
    elif os.path.isfile(single):
      files, wmap = [SINGLE_FILE], None
    else:
      others = [f for f in os.listdir(path) if f.endswith((".bin", ".pt"))]
      hint = (f" (found {others[0]}: convert PyTorch .bin weights to "
              "safetensors first)" if others else "")
      raise HFCheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in "
                              f"{path}{hint}")
    self.handles, self.file_of = {}, {}
    for name in files:
      full = os.path.join(path, name)
      if not os.path.isfile(full):
        raise HFCheckpointError(f"missing file {full} (listed in "
                                f"{INDEX_FILE})")
      try:
        handle = stack.enter_context(safetensors.safe_open(full, "numpy"))
      except Exception as e:  # safetensors raises its own error types
        raise HFCheckpointError(f"unreadable safetensors file {full}: "
                                f"{str(e).splitlines()[0]}") from None
      self.handles[name] = handle
      for key in handle.keys():
        if wmap is not None and wmap.get(key) != name:
          continue
        self.file_of[key] = name
    if wmap is not None:
      lost = sorted(k for k in wmap if k not in self.file_of)
      if lost:
        raise HFCheckpointError(f"tensor {lost[0]!r} listed in {INDEX_FILE} "
                                f"is not in {wmap[lost[0]]}")

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.handles[self.file_of[name]].get_slice(name).get_shape())

  def get(self, name: str) -> np.ndarray:
    return self.handles[self.file_of[name]].get_tensor(name)


def _flat_params(abstract: nnx.Module):
  graphdef, state = nnx.split(abstract)
  return graphdef, state, list(nnx.to_flat_state(state))


def _per_layer(path: tuple, cfg: ModelConfig) -> list[tuple]:
  """The unstacked parameter paths behind one of ours: with scanned layers a
  ("layers", ...) parameter is the stack of ("layers", i, ...) over the L layers."""
  if cfg.scan_layers and path[0] == "layers":
    return [("layers", i) + tuple(path[1:]) for i in range(cfg.num_layers)]
  return [path]


def load_model(path: str, *, dtype: str = "float32",
               param_dtype: str | None = None, max_seq_len: int | None = None,
               mesh: jax.sharding.Mesh | None = None,
               rules: mesh_lib.Rules = mesh_lib.SAMPLE_RULES,
               remat: bool = False, scan_layers: bool = False,
               lora: LoRAConfig | None = None, seed: int = 0) -> Decoder:
  """The Decoder of a local HF directory; see `from_pretrained`."""
  if not os.path.isdir(path):
    raise HFCheckpointError(f"not a directory: {path}")
  hf_cfg = read_config(path)
  cfg = config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype, max_seq_len=max_seq_len,
                       source=os.path.join(path, CONFIG_FILE)).replace(
                           remat=remat, scan_layers=scan_layers,
                           lora=lora or LoRAConfig())
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)))
  graphdef, state, flat = _flat_params(abstract)
  shardings = None
  if mesh is not None:
    shardings = dict(nnx.to_flat_state(
        mesh_lib.state_shardings(state, mesh, rules)))
  adapters = {}
  if cfg.lora.enabled:  # not in the checkpoint: A drawn from `seed`, B zero
    ad_sh = None
    if mesh is not None:
      ad_sh = nnx.split_state(mesh_lib.state_shardings(state, mesh, rules),
                              nnx.LoRAParam, ...)[0]
    adapters = dict(nnx.to_flat_state(lora_lib.init_adapters(cfg, seed, ad_sh)))
  np_dtype = _NP_DTYPES[cfg.param_dtype]
  with contextlib.ExitStack() as stack:
    tensors = _Tensors(path, stack)
    expected = set()
    for p, var in flat:
      if p in adapters:
        var.set_value(adapters[p].get_value())
        continue
      parts = _per_layer(p, cfg)
      shape = tuple(var.get_value().shape)[len(parts) > 1:]  # one layer's
      values = []
      for q in parts:
        name = _hf_name(q)
        expected.add(name)
        if name not in tensors.file_of:
          raise HFCheckpointError(f"missing tensor {name!r} in {path} (needed "
                                  f"by {hf_cfg['architectures'][0]})")
        want, got = _hf_shape(q, shape), tensors.shape(name)
        if got != want:
          raise HFCheckpointError(
              f"tensor {name!r} in {tensors.file_of[name]} has shape "
              f"{list(got)}, expected {list(want)} from {CONFIG_FILE}")
        values.append(_from_hf(q, tensors.get(name), shape).astype(np_dtype))
      value = np.stack(values) if len(parts) > 1 else values[0]
      sharding = None if shardings is None else shardings[p].get_value()
      var.set_value(jax.device_put(value, sharding))
    if cfg.tie_embeddings:
      expected.add("lm_head.weight")  # some tied exports keep a copy
    extra = sorted(k for k in tensors.file_of if k not in expected
                   and not k.endswith(_IGNORED_SUFFIXES))
    if extra:
      raise HFCheckpointError(
          f"unexpected tensor {extra[0]!r} in {tensors.file_of[extra[0]]} "
          f"({len(extra)} unexpected; config.json describes "
          f"{cfg.num_layers} layers, qkv_bias={cfg.qkv_bias}, "
          f"tie_word_embeddings={cfg.tie_embeddings})")
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def from_pretrained(path: str, *, dtype: str = "float32",
                    param_dtype: str | None = None,
                    max_seq_len: int | None = None,
                    mesh: jax.sharding.Mesh | None = None,
                    rules: mesh_lib.Rules = mesh_lib.SAMPLE_RULES,
                    load_tokenizer: bool = True, remat: bool = False,
                    scan_layers: bool = False, lora: LoRAConfig | None = None,
                    seed: int = 0
                    ) -> tuple[Decoder, Tokenizer | None]:
  """Loads a local HF Llama / Qwen2 directory: (model, tokenizer).

  dtype: compute dtype ("float32" / "bfloat16"); param_dtype: storage dtype
  (default: dtype). max_seq_len: default max_position_embeddings. With a mesh,
  each parameter is placed straight onto its shards by `rules` (never whole
  on one device). remat: rematerialise each layer in the backward pass; scan_layers:
  stack the layers and scan over them (`ModelConfig.scan_layers`). lora: adapters on
  the loaded (frozen) base, A drawn from `seed` and B zero (csa_jax/model/lora.py). The model
  maps tokens [B, T] to float32 logits [B, T, V].
  The tokenizer (None when load_tokenizer=False) is
  `Tokenizer.from_hf_dir(path)`.
  """
  model = load_model(path, dtype=dtype, param_dtype=param_dtype,
                     max_seq_len=max_seq_len, mesh=mesh, rules=rules, remat=remat,
                     scan_layers=scan_layers, lora=lora, seed=seed)
  tok = Tokenizer.from_hf_dir(path) if load_tokenizer else None
  return model, tok


def _iter_hf_tensors(model: Decoder, np_dtype) -> Iterator[tuple[str, np.ndarray]]:
  for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    value = np.asarray(jax.device_get(var.get_value()))
    parts = _per_layer(p, model.cfg)
    for i, q in enumerate(parts):
      one = value[i] if len(parts) > 1 else value
      yield _hf_name(q), np.ascontiguousarray(_to_hf(q, one).astype(np_dtype))


def save_pretrained(model: Decoder, path: str, *, dtype: str | None = None,
                    max_shard_bytes: int | None = None) -> None:
  """Writes config.json and safetensors weights that transformers loads.

  dtype: stored dtype (default the model's param_dtype). With max_shard_bytes,
  writes model-0000i-of-0000n.safetensors plus the index file. A model with LoRA
  adapters is written merged (W + alpha / r A B: csa_jax/model/lora.py, `merged_model`);
  `save_peft` writes the adapters alone.
  """
  if model.cfg.lora.enabled:
    model = lora_lib.merged_model(model)
  cfg = model.cfg
  dtype = dtype or cfg.param_dtype
  if dtype not in _NP_DTYPES:
    raise HFCheckpointError(f"dtype must be one of {sorted(_NP_DTYPES)}, "
                            f"got {dtype!r}")
  os.makedirs(path, exist_ok=True)
  hf_cfg = config_to_hf(cfg.replace(param_dtype=dtype))
  with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump(hf_cfg, f, indent=2)
  tensors = dict(_iter_hf_tensors(model, _NP_DTYPES[dtype]))
  if max_shard_bytes is None:
    safetensors.numpy.save_file(tensors, os.path.join(path, SINGLE_FILE),
                                metadata={"format": "pt"})
    return
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensors[name]
    size += tensors[name].nbytes
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    safetensors.numpy.save_file(shard, os.path.join(path, fname),
                                metadata={"format": "pt"})
    weight_map.update({name: fname for name in shard})
  index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
           "weight_map": weight_map}
  with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump(index, f, indent=2)


# ------------------------------------------------------------------ PEFT ----

def _peft_tensors(model: Decoder, np_dtype) -> dict[str, np.ndarray]:
  cfg = model.cfg
  tensors = {}
  for p, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
    value = np.asarray(jax.device_get(var.get_value()), np.float32)
    kernel_path = p[:-1] + ("kernel",)
    parts = _per_layer(kernel_path, cfg)
    for i, q in enumerate(parts):
      one = value[i] if len(parts) > 1 else value
      module = _hf_name(q)[: -len(".weight")]
      if p[-1] == "lora_a":  # [in..., r] -> lora_A.weight [r, in]
        name, w = "lora_A", one.reshape(-1, cfg.lora.rank).T
      else:  # [r, out...] -> lora_B.weight [out, r]
        name, w = "lora_B", one.reshape(cfg.lora.rank, -1).T
      tensors[f"base_model.model.{module}.{name}.weight"] = np.ascontiguousarray(
          w.astype(np_dtype))
  return tensors


def peft_config(cfg: LoRAConfig, base_model_name_or_path: str = "") -> dict[str, Any]:
  """adapter_config.json for PEFT's LoraConfig (alpha / r scaling, no dropout, no bias)."""
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base_model_name_or_path or None,
      "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": 0.0,
      "target_modules": sorted(cfg.targets), "bias": "none", "fan_in_fan_out": False,
      "use_rslora": False, "use_dora": False, "init_lora_weights": True,
      "inference_mode": True, "modules_to_save": None, "layers_to_transform": None,
      "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
  }


def save_peft(model: Decoder, path: str, *, base_model_name_or_path: str = "",
              dtype: str = "float32") -> None:
  """Writes the adapters of `model` as a PEFT LoRA adapter directory."""
  if not model.cfg.lora.enabled:
    raise HFCheckpointError("save_peft: the model has no LoRA adapters (model.lora.rank 0)")
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
    json.dump(peft_config(model.cfg.lora, base_model_name_or_path), f, indent=2)
  safetensors.numpy.save_file(_peft_tensors(model, _NP_DTYPES[dtype]),
                              os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
