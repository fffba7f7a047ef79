"""Policy model: Llama 3 / Qwen2 decoder in Flax NNX (see decoder.py), and the
Hugging Face checkpoint loader / exporter (hf.py)."""

from csa_jax.model.config import Llama3RopeScaling, LoRAConfig, ModelConfig
from csa_jax.model.decoder import (CACHE_AXES, Decoder, KVCache,
                                   default_positions, token_logprobs)
from csa_jax.model.hf import (HFCheckpointError, config_from_hf, config_to_hf,
                              from_pretrained, load_model, save_pretrained)

__all__ = ["CACHE_AXES", "Decoder", "HFCheckpointError", "KVCache",
           "Llama3RopeScaling", "LoRAConfig", "ModelConfig", "config_from_hf",
           "config_to_hf", "default_positions", "from_pretrained",
           "load_model", "save_pretrained", "token_logprobs"]
