"""Small GGUF files for the tests, written as llama.cpp's converter writes them (the
`gguf` package's writer): random weights in Hugging Face's layout, q and k permuted by
llama.cpp's rule (written here from its definition), quantised with `gguf.quants.quantize`
where it can, and as raw blocks with valid scales for the K-quants (which it cannot write).
"""

import json

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
          "%}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHAT = [{"role": "system", "content": "You play a text game."},
        {"role": "user", "content": "Task: take the red key, then open the door.\n"
                                    "Actions: take red key | go north\nAction:"}]
# Small, but every 2-D weight's rows hold whole K-quant blocks (256 values).
D, HEADS, KV_HEADS, FFN, LAYERS = 256, 4, 2, 512, 2
HEAD_DIM = D // HEADS
THETA = 10_000.0
# Bytes of one block of each K-quant, and the offsets of its float16 scales (d, dmin):
# ggml's block_q4_K, block_q5_K and block_q6_K.
K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def train_vocab():
  """(tokens by id, merges) of a byte-level BPE trained with SmolLM2's split (digits alone)."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False)])
  text = ["Task: take the red key, then open the door.", "Actions: take red key | go north",
          "You play a text game. The vault's key is 12 steps away.", "system user assistant"]
  tok.train_from_iterator(text * 20, trainers.BpeTrainer(
      vocab_size=420, special_tokens=SPECIALS,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(tok.to_str())["model"]
  tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  return tokens, merges


def llamacpp_permute(w, n_heads):
  """llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute: the rows of each head of a
  Hugging Face q or k projection in the order llama.cpp's rotary kernel reads them."""
  return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def hf_weights(arch, tied, seed, vocab_size):
  """Random weights by Hugging Face name (float32, Hugging Face's layout)."""
  rng = np.random.default_rng(seed)
  q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
  w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (vocab_size, D)),
       "model.norm.weight": 1 + 0.2 * rng.normal(size=D)}
  if not tied:
    w["lm_head.weight"] = rng.normal(0, 0.1, (vocab_size, D))
  for i in range(LAYERS):
    p = f"model.layers.{i}."
    w |= {p + "input_layernorm.weight": 1 + 0.2 * rng.normal(size=D),
          p + "post_attention_layernorm.weight": 1 + 0.2 * rng.normal(size=D),
          p + "self_attn.q_proj.weight": rng.normal(0, 0.1, (q, D)),
          p + "self_attn.k_proj.weight": rng.normal(0, 0.1, (kv, D)),
          p + "self_attn.v_proj.weight": rng.normal(0, 0.1, (kv, D)),
          p + "self_attn.o_proj.weight": rng.normal(0, 0.1, (D, q)),
          p + "mlp.gate_proj.weight": rng.normal(0, 0.1, (FFN, D)),
          p + "mlp.up_proj.weight": rng.normal(0, 0.1, (FFN, D)),
          p + "mlp.down_proj.weight": rng.normal(0, 0.1, (D, FFN))}
    if arch == "qwen2":
      w |= {p + "self_attn.q_proj.bias": 0.2 * rng.normal(size=q),
            p + "self_attn.k_proj.bias": 0.2 * rng.normal(size=kv),
            p + "self_attn.v_proj.bias": 0.2 * rng.normal(size=kv)}
  return {k: v.astype(np.float32) for k, v in w.items()}


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
              "input_layernorm.weight": "attn_norm.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight",
              "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf_name):
  if hf_name in GGUF_NAMES:
    return GGUF_NAMES[hf_name]
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{GGUF_NAMES[rest]}"


def k_quant_blocks(qtype, rows, cols, rng):
  """Random blocks of a K-quant whose float16 scales are small and finite."""
  import gguf  # pylint: disable=import-outside-toplevel
  kind = gguf.GGMLQuantizationType[qtype]
  block, size = gguf.GGML_QUANT_SIZES[kind]
  raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
  for offset in K_SCALES[qtype]:
    scale = rng.uniform(1e-3, 1e-2, (rows, cols // block)).astype(np.float16)
    raw[..., offset:offset + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
  return raw.reshape(rows, -1)


def write_gguf(path, vocab, *, arch="llama", qtype="F32", tied=True, seed=0, pre="smollm",
               add_bos=False, rope_freqs=None, extra=None):
  """Writes a GGUF file as llama.cpp's converter would; returns the Hugging Face weights
  it was made from (for a K-quant, the weights are the random blocks themselves)."""
  import gguf  # pylint: disable=import-outside-toplevel
  tokens, merges = vocab
  weights = hf_weights(arch, tied, seed, len(tokens))
  rng = np.random.default_rng(seed + 1)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(LAYERS)
  w.add_context_length(256)
  w.add_embedding_length(D)
  w.add_feed_forward_length(FFN)
  w.add_head_count(HEADS)
  w.add_head_count_kv(KV_HEADS)
  w.add_rope_freq_base(THETA)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_dimension_count(HEAD_DIM)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  w.add_token_merges(merges)
  w.add_bos_token_id(tokens.index("<|im_start|>"))
  w.add_eos_token_id(tokens.index("<|im_end|>"))
  w.add_pad_token_id(tokens.index("<|im_end|>"))
  w.add_add_bos_token(add_bos)
  w.add_chat_template(CHATML)
  for key, value in (extra or {}).items():
    w.add_string(key, value)
  for name, value in weights.items():
    if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
      value = llamacpp_permute(value, HEADS if "q_proj" in name else KV_HEADS)
    if value.ndim == 1 or qtype == "F32":
      w.add_tensor(gguf_name(name), value)
    elif qtype in K_SCALES:
      w.add_tensor(gguf_name(name), k_quant_blocks(qtype, *value.shape, rng),
                   raw_dtype=gguf.GGMLQuantizationType[qtype])
    else:
      kind = gguf.GGMLQuantizationType[qtype]
      data = gguf.quants.quantize(value, kind)
      w.add_tensor(gguf_name(name), data, raw_dtype=None if qtype == "F16" else kind)
  if rope_freqs is not None:
    w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return weights
