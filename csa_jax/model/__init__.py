"""Policy model: Llama 3 / Qwen2 decoder in Flax NNX (see decoder.py), LoRA (lora.py), the
Hugging Face checkpoint loader / exporter (hf.py) and GGUF import (gguf.py); the tokenizer
(tokenizer.py), the batched KV-cache sampler (sampling.py), and a chat function over a
local checkpoint for environments whose other party is a frozen model (chat.py).

The configs are imported with the package; the decoder and the loader (flax, jax) on first
use of one of their names, so that code that only reads configs (launch.py --list, a bad
--set, the experiments' definitions) does not import them."""

import importlib

from csa_jax.model.config import Llama3RopeScaling, LoRAConfig, ModelConfig

_LAZY = {name: "csa_jax.model.decoder" for name in
         ("CACHE_AXES", "Decoder", "KVCache", "default_positions", "token_logprobs")}
_LAZY.update({name: "csa_jax.model.hf" for name in
              ("HFCheckpointError", "config_from_hf", "config_to_hf", "from_pretrained",
               "load_model", "save_pretrained")})

__all__ = ["CACHE_AXES", "Decoder", "HFCheckpointError", "KVCache",
           "Llama3RopeScaling", "LoRAConfig", "ModelConfig", "config_from_hf",
           "config_to_hf", "default_positions", "from_pretrained",
           "load_model", "save_pretrained", "token_logprobs"]
assert sorted(__all__) == sorted([*_LAZY, "Llama3RopeScaling", "LoRAConfig", "ModelConfig"])


def __getattr__(name: str):
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # (once: later reads do not come here)
    return value
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return __all__
