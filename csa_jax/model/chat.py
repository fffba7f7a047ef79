"""A chat function over a local Hugging Face checkpoint, through the project's own loader
(`csa_jax.model.hf.from_pretrained`) and KV-cache sampler (`csa_jax.model.sampling.sample`): used
by environments whose other party is played by a frozen model (tau-bench's user). The
environments never import it: they load the function a `module:function` name gives
(`environments.taubench_env`'s `user_chat`, this one by default), so the ground floor does
not depend on the policy code above it.

`load(dir)(messages, max_new_tokens) -> text`: the checkpoint's chat template (or plain
"role: content" lines when it has none) with a generation prompt, greedy decoding up to the
end token, the reply decoded. Runs on whatever JAX device is default, one chat at a time.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np


def load(model_path: str, *, max_seq_len: int | None = None
         ) -> Callable[[Sequence[Mapping[str, str]], int], str]:
  import jax  # pylint: disable=g-import-not-at-top

  from csa_jax.model import hf  # pylint: disable=g-import-not-at-top
  from csa_jax.model import sampling  # pylint: disable=g-import-not-at-top

  model, tok = hf.from_pretrained(model_path, max_seq_len=max_seq_len)
  limit = model.cfg.max_seq_len
  rng = [jax.random.key(0)]

  def encode(messages) -> list[int]:
    if tok.chat_template is not None:
      return tok.apply_chat_template(list(messages), add_generation_prompt=True)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tok.encode(text)

  def chat(messages: Sequence[Mapping[str, str]], max_new_tokens: int) -> str:
    ids = encode(messages)
    ids = ids[-max(1, limit - max_new_tokens):]  # keep the newest context that fits
    tokens, mask = sampling.left_pad([ids], tok.pad_id, bucket=64)
    if tokens.shape[1] + max_new_tokens > limit:  # the bucket's padding must fit too
      tokens, mask = tokens[:, -(limit - max_new_tokens):], mask[:, -(limit - max_new_tokens):]
    cfg = sampling.SamplingConfig(max_new_tokens=max_new_tokens, greedy=True,
                                  stop_token_ids=(tok.eos_id,))
    rng[0], key = jax.random.split(rng[0])
    out = sampling.sample(model, tokens, mask, rng=key, cfg=cfg, pad_id=tok.pad_id)
    n = int(np.asarray(out.lengths_B)[0])
    new = [int(t) for t in np.asarray(out.tokens_BxN)[0, :n] if int(t) != tok.eos_id]
    return tok.decode(new).strip()

  return chat
