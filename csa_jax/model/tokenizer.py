"""Tokenizers (host side): a byte-level BPE trained on an environment's own text for
tiny from-scratch policies, or a pretrained `tokenizer.json`; both behind one class.

Byte-level BPE (as in GPT-2) round-trips any text exactly, so an action the policy
writes decodes to the same string the environment receives, and words never seen in
training still encode (as bytes) on held-out tasks.

Special tokens. `encode` reads its text as text: the spelling of a special token
("<eos>", "<|im_end|>") in an observation encodes as ordinary bytes, never as the
control token, so `decode(encode(text)) == text` for any text and environment text cannot
end a turn or open a new one. Only text a chat template rendered, whose special
spellings are the template's own markup, is encoded with them matched
(`encode(text, specials=True)`, as `apply_chat_template` and transformers do). `decode`
drops special tokens (the end-of-action token the policy writes).

`Tokenizer.from_hf_dir` reads a Hugging Face tokenizer directory (tokenizer.json +
tokenizer_config.json, as shipped with Llama 3.x and Qwen2.5) and renders its Jinja
chat template the way transformers' `apply_chat_template` does: a sandboxed Jinja
environment with trim_blocks / lstrip_blocks and the loop-controls extension, a
non-ASCII-preserving `tojson`, `raise_exception` and `strftime_now`, the special
tokens as template variables, and the rendered text encoded without added special
tokens (the template writes them itself).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

PAD, EOS = "<pad>", "<eos>"
FILENAME = "tokenizer.json"
HF_CONFIG = "tokenizer_config.json"
HF_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves the template
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
  """Text <-> ids, with the pad and end-of-action ids the sampler and trainer need."""

  def __init__(self, tok: tokenizers.Tokenizer, *, pad_token: str = PAD, eos_token: str = EOS,
               chat_template: str | None = None,
               special_tokens: Mapping[str, Any] | None = None):
    """special_tokens: template variables (bos_token, eos_token, ...) as strings."""
    self.tok = tok
    # A copy that encodes special-token spellings as plain text (see the module docstring).
    self._text_tok = tokenizers.Tokenizer.from_str(tok.to_str())
    self._text_tok.encode_special_tokens = True
    pad_id, eos_id = tok.token_to_id(pad_token), tok.token_to_id(eos_token)
    if pad_id is None or eos_id is None:
      raise ValueError(f"tokenizer has no {pad_token!r} or {eos_token!r} token")
    self.pad_id, self.eos_id = pad_id, eos_id
    self.chat_template = chat_template
    self.special_tokens = dict(special_tokens or {})

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size()

  def encode(self, text: str, *, specials: bool = False) -> list[int]:
    """Ids of `text`; special-token spellings become their tokens only with `specials`
    (for chat-template markup), else they are plain text."""
    tok = self.tok if specials else self._text_tok
    return tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of each text (plain text: special spellings are not matched)."""
    return [e.ids for e in self._text_tok.encode_batch(list(texts), add_special_tokens=False)]

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

  @classmethod
  def from_hf_dir(cls, path: str) -> "Tokenizer":
    """A Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json).

    eos from tokenizer_config's eos_token; pad from pad_token, else eos. The chat
    template is tokenizer_config's chat_template (a string, or the "default" entry of
    a list of named templates), else chat_template.jinja; None if neither.
    """
    tok_path, cfg_path = os.path.join(path, FILENAME), os.path.join(path, HF_CONFIG)
    for p in (tok_path, cfg_path):
      if not os.path.isfile(p):
        raise FileNotFoundError(f"missing file {p} (a Hugging Face tokenizer directory "
                                f"needs {FILENAME} and {HF_CONFIG})")
    try:
      tok = tokenizers.Tokenizer.from_file(tok_path)
    except Exception as e:  # tokenizers raises a bare Exception on parse errors
      raise ValueError(f"malformed {tok_path}: {str(e).splitlines()[0]}") from None
    try:
      with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"malformed JSON in {cfg_path}: {e}") from None
    if not isinstance(cfg, dict):
      raise ValueError(f"{cfg_path}: expected a JSON object")
    special = {k: _token_text(cfg.get(k), k, cfg_path) for k in _SPECIAL_KEYS}
    special = {k: v for k, v in special.items() if v is not None}
    extra = cfg.get("additional_special_tokens") or cfg.get("extra_special_tokens")
    if isinstance(extra, list):
      special["additional_special_tokens"] = [
          _token_text(t, "additional_special_tokens", cfg_path) for t in extra]
    eos = special.get("eos_token")
    if eos is None:
      raise ValueError(f"{cfg_path}: missing field 'eos_token'")
    for key, text in special.items():
      if key in _SPECIAL_KEYS and tok.token_to_id(text) is None:
        raise ValueError(f"{cfg_path}: {key} {text!r} is not in {tok_path}")
    return cls(tok, pad_token=special.get("pad_token", eos), eos_token=eos,
               chat_template=_chat_template(cfg, cfg_path, path),
               special_tokens=special)

  def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                  add_generation_prompt: bool = True,
                  tools: Sequence[Mapping[str, Any]] | None = None,
                  **template_kwargs) -> str:
    """The chat template rendered to text (as transformers' tokenize=False)."""
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat template (none in "
                       f"{HF_CONFIG} or {HF_TEMPLATE_FILE})")
    if not messages:
      raise ValueError("apply_chat_template needs at least one message")
    # As transformers: keys whose value is None are dropped from each message.
    msgs = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    variables = {**self.special_tokens, **template_kwargs}
    return _compile_template(self.chat_template).render(
        messages=msgs, tools=None if tools is None else list(tools), documents=None,
        add_generation_prompt=add_generation_prompt, **variables)

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = True,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          **template_kwargs) -> list[int]:
    """Token ids of the rendered chat (no special tokens added beyond the template's).

    As transformers, the whole rendered text is encoded with special spellings matched,
    message contents included; prompts built by `prompts.PromptFormat.chat` match them in
    the template's markup only.
    """
    return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                        tools=tools, **template_kwargs), specials=True)


def _token_text(value: Any, key: str, source: str) -> str | None:
  """A special token as text: tokenizer_config stores a string or an AddedToken dict."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  raise ValueError(f"{source}: field {key!r} must be a string or an object with "
                   f"'content', got {value!r}")


def _chat_template(cfg: Mapping[str, Any], cfg_path: str, directory: str) -> str | None:
  tmpl = cfg.get("chat_template")
  if isinstance(tmpl, list):  # [{"name": ..., "template": ...}, ...]
    named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
    if "default" not in named:
      raise ValueError(f"{cfg_path}: chat_template list has no 'default' entry "
                       f"(names: {sorted(map(str, named))})")
    tmpl = named["default"]
  if tmpl is not None and not isinstance(tmpl, str):
    raise ValueError(f"{cfg_path}: field 'chat_template' must be a string, got {tmpl!r}")
  file_path = os.path.join(directory, HF_TEMPLATE_FILE)
  if tmpl is None and os.path.isfile(file_path):
    with open(file_path, encoding="utf-8") as f:
      tmpl = f.read()
  return tmpl


_TEMPLATES: dict[str, Any] = {}


def _compile_template(source: str):
  """A Jinja template in the environment transformers renders chat templates in."""
  if source in _TEMPLATES:
    return _TEMPLATES[source]
  import jinja2  # local: only chat templates need it
  import jinja2.ext
  import jinja2.sandbox

  class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders its body."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[GenerationTag, jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  try:
    _TEMPLATES[source] = env.from_string(source)
  except jinja2.exceptions.TemplateSyntaxError as e:
    raise ValueError(f"chat template does not parse: {e} (line {e.lineno})") from None
  return _TEMPLATES[source]


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
