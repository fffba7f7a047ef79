"""Tokenizer.from_hf_dir and chat templates, against hand-written expected text and
against transformers' `apply_chat_template`."""

import json
import os

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from csa_jax.model.tokenizer import Tokenizer

# The Llama 3 Instruct template (Meta-Llama-3-8B-Instruct tokenizer_config.json).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Qwen2.5-Instruct style: default system prompt, tools, tool calls, tool responses.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions.\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Exercises trim_blocks/lstrip_blocks, loop controls, raise_exception and {% generation %}.
MISC_TEMPLATE = """{% for m in messages %}
  {% if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif %}
  {% if m.role == 'skip' %}{% continue %}{% endif %}
  {% if m.role == 'assistant' %}{% generation %}[A] {{ m.content }}{{ eos_token }}{% endgeneration %}
  {% else %}[{{ m.role | upper }}] {{ m.content }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}[A]{% endif %}"""

LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = ["You are a helpful assistant.", "go to the kitchen and take the coin",
          "system user assistant tool", '{"name": "move", "arguments": {"dir": "north"}}',
          "Wähle den Weg nach Norden. 北へ行く"] * 20

CHATS = [
    [{"role": "user", "content": "  go north  "}],
    [{"role": "system", "content": "Play the game."},
     {"role": "user", "content": "You see a door. ünïcode 北"},
     {"role": "assistant", "content": "open door"},
     {"role": "user", "content": "The door opens.<|eot_id|>"}],
]
QWEN_TOOL_CHAT = [
    {"role": "user", "content": "Where am I?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "look", "arguments": {"dir": "nörth"}}}]},
    {"role": "tool", "content": "kitchen"},
    {"role": "tool", "content": "a coin"},
]
TOOLS = [{"type": "function", "function": {"name": "look", "description": "Look around, ü",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _write_dir(path, specials, config):
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=400, special_tokens=specials, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **config}, f)
  return str(path)


def _llama_dir(tmp_path):
  return _write_dir(tmp_path / "llama", LLAMA_SPECIALS, {
      "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
      "chat_template": LLAMA3_TEMPLATE})


def _qwen_dir(tmp_path):
  return _write_dir(tmp_path / "qwen", QWEN_SPECIALS, {
      "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True},
      "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": QWEN25_TEMPLATE})


def test_llama3_template_by_hand(tmp_path):
  tok = Tokenizer.from_hf_dir(_llama_dir(tmp_path))
  assert tok.eos_id == tok.tok.token_to_id("<|eot_id|>") == tok.pad_id  # pad falls back
  text = tok.render_chat(CHATS[1])
  assert text == (
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nPlay the game.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nYou see a door. ünïcode 北<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nopen door<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nThe door opens.<|eot_id|><|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n")
  ids = tok.apply_chat_template(CHATS[1])
  assert ids[0] == tok.tok.token_to_id("<|begin_of_text|>")
  assert ids.count(tok.eos_id) == 5  # special tokens in the text map to single ids
  assert tok.decode(ids) == ("system\n\nPlay the game.user\n\nYou see a door. ünïcode 北"
                            "assistant\n\nopen dooruser\n\nThe door opens.assistant\n\n")
  no_prompt = tok.render_chat(CHATS[0], add_generation_prompt=False)
  assert no_prompt == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                       "go north<|eot_id|>")


def test_qwen_config_forms(tmp_path):
  tok = Tokenizer.from_hf_dir(_qwen_dir(tmp_path))
  assert tok.eos_id == tok.tok.token_to_id("<|im_end|>")
  assert tok.pad_id == tok.tok.token_to_id("<|endoftext|>")
  assert "bos_token" not in tok.special_tokens
  text = tok.render_chat(QWEN_TOOL_CHAT, tools=TOOLS)
  assert '"description": "Look around, ü"' in text  # tojson keeps non-ASCII
  assert '{"name": "look", "arguments": {"dir": "nörth"}}' in text
  assert "<|im_start|>user\n<tool_response>\nkitchen\n</tool_response>\n<tool_response>" \
         "\na coin\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text


def test_misc_template_features(tmp_path):
  path = _write_dir(tmp_path, QWEN_SPECIALS, {"eos_token": "<|endoftext|>",
                                              "chat_template": MISC_TEMPLATE})
  tok = Tokenizer.from_hf_dir(path)
  msgs = [{"role": "user", "content": "hi"}, {"role": "skip", "content": "x"},
          {"role": "assistant", "content": "go"}]
  assert tok.render_chat(msgs) == "[USER] hi\n[A] go<|endoftext|>[A]"
  with pytest.raises(Exception, match="bad role"):
    tok.render_chat([{"role": "bad", "content": ""}])


def test_template_sources_and_errors(tmp_path):
  # A list of named templates, and transformers 5's separate chat_template.jinja.
  path = _write_dir(tmp_path / "a", QWEN_SPECIALS, {
      "eos_token": "<|im_end|>",
      "chat_template": [{"name": "tool_use", "template": "T"},
                        {"name": "default", "template": "D{{ eos_token }}"}]})
  assert Tokenizer.from_hf_dir(path).render_chat(CHATS[0]) == "D<|im_end|>"
  path = _write_dir(tmp_path / "b", QWEN_SPECIALS, {"eos_token": "<|im_end|>"})
  with pytest.raises(ValueError, match="no chat template"):
    Tokenizer.from_hf_dir(path).apply_chat_template(CHATS[0])
  with open(os.path.join(path, "chat_template.jinja"), "w") as f:
    f.write("J{{ messages[0].content }}")
  assert Tokenizer.from_hf_dir(path).render_chat(CHATS[1]) == "JPlay the game."

  for config, needle in [
      ({"eos_token": "<|nope|>"}, "eos_token '<|nope|>' is not in"),
      ({}, "missing field 'eos_token'"),
      ({"eos_token": 3}, "'eos_token' must be a string"),
      ({"eos_token": "<|im_end|>", "chat_template": "{% if %}"}, "does not parse"),
      ({"eos_token": "<|im_end|>", "chat_template": [{"name": "x", "template": ""}]},
       "no 'default' entry")]:
    path = _write_dir(tmp_path / "c", QWEN_SPECIALS, config)
    with pytest.raises(ValueError, match=needle) as e:
      Tokenizer.from_hf_dir(path).render_chat(CHATS[0])
    assert "\n" not in str(e.value)
  os.remove(os.path.join(path, "tokenizer_config.json"))
  with pytest.raises(FileNotFoundError, match="missing file .*tokenizer_config.json"):
    Tokenizer.from_hf_dir(path)


@pytest.mark.parametrize("which", ["llama", "qwen"])
def test_matches_transformers(tmp_path, which):
  import transformers  # pylint: disable=import-outside-toplevel
  path = _llama_dir(tmp_path) if which == "llama" else _qwen_dir(tmp_path)
  ours = Tokenizer.from_hf_dir(path)
  ref = transformers.AutoTokenizer.from_pretrained(path)
  cases = [(c, None) for c in CHATS]
  if which == "qwen":
    cases += [(QWEN_TOOL_CHAT, TOOLS), (QWEN_TOOL_CHAT, None)]
  for chat, tools in cases:
    for gen in (True, False):
      want_text = ref.apply_chat_template(chat, tools=tools, add_generation_prompt=gen,
                                          tokenize=False)
      want_ids = ref.apply_chat_template(chat, tools=tools, add_generation_prompt=gen,
                                         tokenize=True, return_dict=False)
      assert ours.render_chat(chat, tools=tools, add_generation_prompt=gen) == want_text
      assert ours.apply_chat_template(chat, tools=tools, add_generation_prompt=gen) \
          == list(want_ids)
  assert ours.eos_id == ref.eos_token_id
  assert ours.decode(ours.encode("go north 北")) == ref.decode(ref.encode(
      "go north 北", add_special_tokens=False), skip_special_tokens=True)
