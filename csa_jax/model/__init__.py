"""Policy model: Llama 3 / Qwen2 decoder in Flax NNX (see decoder.py)."""

from csa_jax.model.config import Llama3RopeScaling, ModelConfig
from csa_jax.model.decoder import (CACHE_AXES, Decoder, KVCache,
                                   default_positions, token_logprobs)

__all__ = ["CACHE_AXES", "Decoder", "KVCache", "Llama3RopeScaling",
           "ModelConfig", "default_positions", "token_logprobs"]
