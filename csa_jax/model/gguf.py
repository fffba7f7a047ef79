"""GGUF files (llama.cpp's format) -> a Hugging Face directory that the project and
transformers load.

    python launch.py --import-gguf FILE DIR

Reads a GGUF file of the llama or qwen2 architecture (Llama 3.x, SmolLM2, Qwen2 / Qwen2.5)
with the `gguf` package (llama.cpp's own reader) and writes DIR: config.json,
model.safetensors (float32), tokenizer.json, tokenizer_config.json (special tokens and chat
template), generation_config.json and IMPORT_RECORD (the source file, its sha256 and what
it held). Where a GGUF file differs from a Hugging Face checkpoint, and what is done:

- Weights are quantised in blocks (the types of SUPPORTED_TYPES); `gguf.quants.dequantize`
  turns them into float32, which holds every dequantised value exactly.
- llama.cpp's converter reorders the rows of each head of the q and k projections of a
  llama model (its rotary kernel pairs rows 2j, 2j+1 where Hugging Face's pairs j and
  j + head_dim/2); `unpermute_rows` restores Hugging Face's order. qwen2 files keep it.
- A file without `output.weight` ties the LM head to the token embedding.
- Llama 3.1 / 3.2 rope scaling is stored as one divisor per rotary frequency
  (`rope_freqs.weight`), not as its parameters: they are recovered and checked to give
  the same divisors.
- The tokenizer is metadata (vocabulary, merges, token types, `tokenizer.ggml.pre`
  naming how text is split before BPE); it is written as a byte-level BPE tokenizer.json
  with the split the name stands for in llama.cpp (PRE_TOKENIZERS), the control tokens
  as special tokens.

What cannot be imported faithfully is refused with `GGUFError`, one line: another
architecture, quantisation type, tokenizer or rope scaling; a truncated or malformed file;
a DIR that is not empty. DIR appears whole or not at all (written beside it, then renamed).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import time
from typing import Any, Iterator, Mapping

import numpy as np

# Hugging Face's names for the architectures a GGUF file may hold.
ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"),
                 "qwen2": ("Qwen2ForCausalLM", "qwen2")}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                   "Q5_K", "Q6_K")
IMPORT_RECORD = "csa_jax_import.json"
# Raised when the directory written for the same file changes (the cache keys on it).
IMPORT_FORMAT = 1

# How text is split before BPE, by llama.cpp's `tokenizer.ggml.pre` name, as the models'
# own tokenizer.json files split it (llama.cpp's llama-vocab.cpp has the same rules).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt-2": "gpt2", "smollm": "digits+gpt2", "llama-bpe": "llama3", "llama3": "llama3",
    "llama-v3": "llama3", "qwen2": "qwen2",
}

_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")  # qwen2's, and only qwen2's
ROPE_FREQS = "rope_freqs.weight"
# The parameters of every Llama 3.1 / 3.2 release besides the factor (8 and 32).
_LLAMA3_ROPE = dict(low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)


class GGUFError(ValueError):
  """A GGUF file (or target directory) that cannot be imported; one line says why."""


# ---------------------------------------------------------------------------- reading ----

def _reader(path: str):
  import gguf  # pylint: disable=import-outside-toplevel
  if not os.path.isfile(path):
    raise GGUFError(f"{path}: no such file")
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # pylint: disable=broad-except  (the reader raises many kinds)
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise GGUFError(f"{path}: not a readable GGUF file, truncated or malformed "
                    f"({why})") from None
  size = os.path.getsize(path)
  for t in reader.tensors:
    if t.data_offset + t.n_bytes > size:
      raise GGUFError(f"{path}: truncated (tensor {t.name} ends at byte "
                      f"{t.data_offset + t.n_bytes}, the file has {size})")
  return reader


def _metadata(reader) -> dict[str, Any]:
  out = {}
  for name, field in reader.fields.items():
    if name.startswith("GGUF."):
      continue
    value = field.contents()
    out[name] = value.tolist() if isinstance(value, np.ndarray) else value
  return out


def _get(meta: Mapping[str, Any], key: str, kind, path: str, default: Any = ...) -> Any:
  if key not in meta:
    if default is ...:
      raise GGUFError(f"{path}: no {key} in the metadata")
    return default
  value = meta[key]
  ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
        else isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
  if not ok:
    raise GGUFError(f"{path}: {key} must be {kind.__name__}, got {str(value)[:80]}")
  return value


def _f32(x: float) -> float:
  """A float32 metadata value as the decimal it was written from (9.9999997e-06 -> 1e-05)."""
  return float(str(np.float32(x)))


# ---------------------------------------------------------------------------- weights ----

def unpermute_rows(w_RxC: np.ndarray, n_heads: int) -> np.ndarray:
  """A q or k projection [heads * head_dim, ...] in Hugging Face's row order, from
  llama.cpp's: within each head, llama.cpp's row 2j + h is Hugging Face's row
  h * head_dim / 2 + j (h = 0, 1: the two halves that rotary embeddings rotate together)."""
  rows = w_RxC.shape[0]
  return (w_RxC.reshape(n_heads, rows // n_heads // 2, 2, *w_RxC.shape[1:])
          .swapaxes(1, 2).reshape(w_RxC.shape))


def _dequantize(t, path: str) -> np.ndarray:
  import gguf  # pylint: disable=import-outside-toplevel
  kind = t.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise GGUFError(f"{path}: tensor {t.name} has quantisation type {kind}, which is not "
                    f"supported (supported: {', '.join(SUPPORTED_TYPES)})")
  w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
  return np.asarray(w, np.float32).reshape([int(d) for d in reversed(t.shape.tolist())])


def _hf_name(name: str, arch: str, path: str) -> str:
  if name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[name]
  parts = name.split(".", 2)
  if (len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit()
      and parts[2] in _BLOCK_TENSORS and (arch == "qwen2" or parts[2] not in _BIASES)):
    return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
  raise GGUFError(f"{path}: tensor {name} has no counterpart in a Hugging Face "
                  f"{ARCHITECTURES[arch][0]} (not a plain {arch} model?)")


def _expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  """Hugging Face name -> shape, for every tensor the checkpoint must hold."""
  d, v, i = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
  q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
  out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not cfg["tie_word_embeddings"]:
    out["lm_head.weight"] = (v, d)
  layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
           "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
           "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
           "mlp.gate_proj.weight": (i, d), "mlp.up_proj.weight": (i, d),
           "mlp.down_proj.weight": (d, i)}
  if cfg["model_type"] == "qwen2":
    layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
              "self_attn.v_proj.bias": (kv,)}
  for n in range(cfg["num_hidden_layers"]):
    out |= {f"model.layers.{n}.{k}": s for k, s in layer.items()}
  return out


def _tensors(reader, cfg: Mapping[str, Any], arch: str, path: str
             ) -> Iterator[tuple[str, np.ndarray]]:
  """(Hugging Face name, float32 array) of every weight, checked against `cfg`'s shapes."""
  want = _expected_shapes(cfg)
  seen = set()
  for t in reader.tensors:
    if t.name == ROPE_FREQS:
      continue  # read into the config (`_rope_scaling`)
    name = _hf_name(t.name, arch, path)
    w = _dequantize(t, path)
    if name not in want or tuple(w.shape) != want[name]:
      raise GGUFError(f"{path}: tensor {t.name} has shape {list(w.shape)}, expected "
                      f"{list(want.get(name, ()))} from the metadata")
    if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
      heads = cfg["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
      w = unpermute_rows(w, heads)
    seen.add(name)
    yield name, np.ascontiguousarray(w)
  missing = sorted(set(want) - seen)
  if missing:
    raise GGUFError(f"{path}: no tensor for {missing[0]} ({len(missing)} missing)")


# ----------------------------------------------------------------------------- config ----

def llama3_rope_divisors(theta: float, head_dim: int, factor: float,
                         low_freq_factor: float, high_freq_factor: float,
                         original_max_position_embeddings: int) -> np.ndarray:
  """What llama.cpp stores as `rope_freqs.weight` for Llama 3's rope scaling: the number
  each rotary frequency is divided by (1 for short wavelengths, `factor` for long ones,
  a smooth blend between)."""
  freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  wavelen = 2 * np.pi / freqs
  smooth = ((original_max_position_embeddings / wavelen - low_freq_factor)
            / (high_freq_factor - low_freq_factor))
  blend = 1 / ((1 - smooth) / factor + smooth)
  return np.where(wavelen < original_max_position_embeddings / high_freq_factor, 1.0,
                  np.where(wavelen > original_max_position_embeddings / low_freq_factor,
                           factor, blend))


def _rope_scaling(reader, meta, arch: str, theta: float, head_dim: int, path: str
                  ) -> dict[str, Any] | None:
  kind = meta.get(f"{arch}.rope.scaling.type", "none")
  if kind != "none":
    raise GGUFError(f"{path}: rope scaling {kind!r} is not supported (only Llama 3's, "
                    "stored as rope_freqs.weight)")
  freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
  if freqs is None:
    return None
  divisors = _dequantize(freqs, path).astype(np.float64)
  if np.allclose(divisors, 1.0):
    return None
  params = dict(factor=_f32(divisors.max()), **_LLAMA3_ROPE)
  if divisors.shape != (head_dim // 2,) or not np.allclose(
      divisors, llama3_rope_divisors(theta, head_dim, **params), rtol=1e-5, atol=0):
    raise GGUFError(f"{path}: {ROPE_FREQS} matches no Llama 3 rope scaling (factor "
                    f"{params['factor']}, low/high frequency factors 1 and 4, original "
                    "context 8192)")
  return {"rope_type": "llama3", **params}


def _hf_config(reader, meta: Mapping[str, Any], path: str) -> dict[str, Any]:
  arch = _get(meta, "general.architecture", str, path)
  if arch not in ARCHITECTURES:
    raise GGUFError(f"{path}: architecture {arch!r} is not supported (supported: "
                    f"{', '.join(ARCHITECTURES)})")
  a = lambda key, kind=int, default=...: _get(meta, f"{arch}.{key}", kind, path, default)
  heads, hidden = a("attention.head_count"), a("embedding_length")
  head_dim = a("attention.key_length", default=hidden // max(heads, 1))
  if a("rope.dimension_count", default=head_dim) != head_dim:
    raise GGUFError(f"{path}: rotary embeddings on {a('rope.dimension_count')} of "
                    f"{head_dim} head dimensions are not supported")
  embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if embed is None:
    raise GGUFError(f"{path}: no tensor token_embd.weight")
  theta = _f32(a("rope.freq_base", float, 10_000.0))
  hf_arch, model_type = ARCHITECTURES[arch]
  ids = {k: meta.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id",
                                                        "padding_token_id")}
  return {
      "architectures": [hf_arch], "model_type": model_type,
      "vocab_size": int(embed.shape[1]), "hidden_size": hidden,
      "intermediate_size": a("feed_forward_length"),
      "num_hidden_layers": a("block_count"), "num_attention_heads": heads,
      "num_key_value_heads": a("attention.head_count_kv", default=heads),
      "head_dim": head_dim, "hidden_act": "silu",
      "max_position_embeddings": a("context_length"),
      "rms_norm_eps": _f32(a("attention.layer_norm_rms_epsilon", float)),
      "rope_theta": theta,
      "rope_scaling": _rope_scaling(reader, meta, arch, theta, head_dim, path),
      "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
      "attention_bias": arch == "qwen2", "mlp_bias": False,
      "bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"],
      "pad_token_id": ids["padding_token_id"],
      "torch_dtype": "float32", "dtype": "float32",
  } | ({"use_sliding_window": False} if arch == "qwen2" else {})


# -------------------------------------------------------------------------- tokenizer ----

def _pre_tokenizer(pre: str, path: str):
  """(normalizer, pre-tokenizer, ignore_merges) for llama.cpp's pre-tokenizer name."""
  from tokenizers import Regex, normalizers, pre_tokenizers  # pylint: disable=import-outside-toplevel
  kind = PRE_TOKENIZERS.get(pre)
  if kind is None:
    raise GGUFError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported (supported: "
                    f"{', '.join(PRE_TOKENIZERS)})")
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                        use_regex=kind in ("gpt2", "digits+gpt2"))
  if kind == "gpt2":
    return None, byte_level, False
  if kind == "digits+gpt2":
    return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                          byte_level]), False
  split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT if kind == "llama3" else _QWEN2_SPLIT),
                               behavior="isolated", invert=False)
  sequence = pre_tokenizers.Sequence([split, byte_level])
  if kind == "llama3":  # Llama 3's tokenizer takes a word found whole in the vocabulary
    return None, sequence, True
  return normalizers.NFC(), sequence, False


def _tokenizer_files(meta: Mapping[str, Any], context: int, path: str
                     ) -> tuple[str, dict[str, Any], dict[str, Any]]:
  """(tokenizer.json text, tokenizer_config.json, generation_config.json)."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, processors  # pylint: disable=import-outside-toplevel
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise GGUFError(f"{path}: tokenizer model {kind!r} is not supported (byte-level BPE, "
                    "'gpt2', only)")
  tokens = _get(meta, "tokenizer.ggml.tokens", list, path)
  merges = _get(meta, "tokenizer.ggml.merges", list, path)
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  normalizer, pre, ignore_merges = _pre_tokenizer(
      _get(meta, "tokenizer.ggml.pre", str, path), path)
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                             merges=[tuple(m.split(" ", 1)) for m in merges],
                             ignore_merges=ignore_merges))
  if normalizer is not None:
    tok.normalizer = normalizer
  tok.pre_tokenizer = pre
  tok.decoder = decoders.ByteLevel()
  # llama.cpp's token types: 2 unknown and 3 control (special tokens), 4 user-defined
  # (added tokens, matched whole in text, not special).
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k in (2, 3)])
  tok.add_tokens([AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == 4])
  special = {name: tokens[meta[f"tokenizer.ggml.{key}"]]
             for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                               ("unk_token", "unknown_token_id"),
                               ("pad_token", "padding_token_id"))
             if isinstance(meta.get(f"tokenizer.ggml.{key}"), int)
             and 0 <= meta[f"tokenizer.ggml.{key}"] < len(tokens)}
  add = {k: bool(meta.get(f"tokenizer.ggml.{k}", False)) for k in ("add_bos_token",
                                                                   "add_eos_token")}
  first = [special["bos_token"]] if add["add_bos_token"] and "bos_token" in special else []
  last = [special["eos_token"]] if add["add_eos_token"] and "eos_token" in special else []
  if first or last:  # what transformers adds around a text (add_special_tokens=True)
    single = " ".join(first + ["$A"] + last)
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=" ".join([single] + first + ["$B:1"] + last),
        special_tokens=[(t, tok.token_to_id(t)) for t in dict.fromkeys(first + last)])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, **add,
            "model_max_length": context, "clean_up_tokenization_spaces": False}
  if isinstance(meta.get("tokenizer.chat_template"), str):
    config["chat_template"] = meta["tokenizer.chat_template"]
  generation = {k: meta[f"tokenizer.ggml.{g}"] for k, g in (
      ("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
      ("pad_token_id", "padding_token_id")) if f"tokenizer.ggml.{g}" in meta}
  return tok.to_str(), config, generation


# ----------------------------------------------------------------------------- import ----

def check_target(out_dir: str) -> None:
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise GGUFError(f"{out_dir} is a file, not a directory")
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise GGUFError(f"{out_dir} is not empty; choose a new directory")


def _write_json(path: str, value: Any) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2, ensure_ascii=False)


def import_gguf(path: str, out_dir: str) -> dict[str, Any]:
  """Writes the Hugging Face directory of the GGUF file `path` to `out_dir` (missing or
  empty) and returns its import record (IMPORT_RECORD): the source, its sha256, the
  architecture and shape, the tensor types, the seconds it took."""
  import safetensors.numpy  # pylint: disable=import-outside-toplevel

  from csa_jax.provenance import sha256_file  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  check_target(out_dir)
  reader = _reader(path)
  meta = _metadata(reader)
  cfg = _hf_config(reader, meta, path)
  tokenizer, tok_cfg, generation = _tokenizer_files(meta, cfg["max_position_embeddings"],
                                                    path)
  tensors = dict(_tensors(reader, cfg, meta["general.architecture"], path))
  record = {
      "format": IMPORT_FORMAT, "source": os.path.abspath(path), "bytes": os.path.getsize(path),
      "sha256": sha256_file(path), "architecture": meta["general.architecture"],
      "name": meta.get("general.name"),
      "tensor_types": dict(collections.Counter(t.tensor_type.name for t in reader.tensors)),
      "shape": {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                    "num_attention_heads", "num_key_value_heads",
                                    "vocab_size", "tie_word_embeddings")},
  }
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", dir=parent)
  try:
    _write_json(os.path.join(tmp, "config.json"), cfg)
    safetensors.numpy.save_file(tensors, os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
      f.write(tokenizer)
    _write_json(os.path.join(tmp, "tokenizer_config.json"), tok_cfg)
    _write_json(os.path.join(tmp, "generation_config.json"), generation)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    _write_json(os.path.join(tmp, IMPORT_RECORD), record)  # last: a whole directory has it
    for name in os.listdir(tmp):  # mkdtemp's 0700 would hide the files from other users
      os.chmod(os.path.join(tmp, name), 0o644)
    os.chmod(tmp, 0o755)
    try:
      os.rename(tmp, out_dir)  # atomic, onto a missing or empty directory only
    except OSError:
      raise GGUFError(f"{out_dir} is not empty (written meanwhile by another process?)"
                      ) from None
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return record


def read_record(directory: str) -> dict[str, Any] | None:
  """The import record of a directory written by `import_gguf`, or None."""
  path = os.path.join(directory, IMPORT_RECORD)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def summary(record: Mapping[str, Any], out_dir: str) -> str:
  s = record["shape"]
  types = ", ".join(f"{n} {k}" for k, n in sorted(record["tensor_types"].items(),
                                                  key=lambda kv: -kv[1]))
  return (f"imported {record['source']} -> {out_dir}: {record['architecture']}, "
          f"{s['num_hidden_layers']} layers, hidden {s['hidden_size']}, "
          f"{s['num_attention_heads']} heads / {s['num_key_value_heads']} kv heads, "
          f"vocabulary {s['vocab_size']}, "
          f"{'tied' if s['tie_word_embeddings'] else 'untied'} embeddings; tensors {types} "
          f"dequantised to float32; sha256 {record['sha256'][:16]}...; "
          f"{record['seconds']:.1f} s")
