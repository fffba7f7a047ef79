"""Tokenizers (host side): a byte-level BPE trained on an environment's own text for
tiny from-scratch policies, or a pretrained `tokenizer.json`; both behind one class.

Byte-level BPE (as in GPT-2) round-trips any text exactly, so an action the policy
writes decodes to the same string the environment receives, and words never seen in
training still encode (as bytes) on held-out tasks.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

PAD, EOS = "<pad>", "<eos>"
FILENAME = "tokenizer.json"


class Tokenizer:
  """Text <-> ids, with the pad and end-of-action ids the sampler and trainer need."""

  def __init__(self, tok: tokenizers.Tokenizer, *, pad_token: str = PAD, eos_token: str = EOS):
    self.tok = tok
    pad_id, eos_id = tok.token_to_id(pad_token), tok.token_to_id(eos_token)
    if pad_id is None or eos_id is None:
      raise ValueError(f"tokenizer has no {pad_token!r} or {eos_token!r} token")
    self.pad_id, self.eos_id = pad_id, eos_id

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=True)

  def save(self, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FILENAME)
    self.tok.save(path)
    return path

  @classmethod
  def load(cls, directory_or_file: str) -> "Tokenizer":
    path = directory_or_file
    if os.path.isdir(path):
      path = os.path.join(path, FILENAME)
    if not os.path.exists(path):
      raise FileNotFoundError(f"no tokenizer file at {path}")
    return cls(tokenizers.Tokenizer.from_file(path))


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
  """A byte-level BPE with `vocab_size` entries (pad and eos included)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=[PAD, EOS],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  return Tokenizer(tok)
