"""Prompts fit their budget (task line, history newest first, the observation's middle cut,
whole actions dropped from the list), are the plain text when they fit, keep environment
text from injecting special tokens; the think format's wrapper is parsed strictly."""

import pytest

from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import prompts as P
from tests import factories

TOK = factories.tokenizer()


def test_prompt_keeps_cue_and_actions_when_truncated():
  obs = "You are in the kitchen. " + "There is a chair. " * 80 + "To the North you see the pantry."
  hist = [("move north", "You are in the pantry. It is dark.")] * 5
  ids = P.encode_prompt(TOK, "find the coin", hist, obs, ["move north", "take coin"],
                        history_turns=3, max_tokens=96)
  assert len(ids) <= 96
  text = TOK.decode(ids)
  assert text.startswith("Task: find the coin\n> move north\nYou are in the pantry.\n")
  assert "Now: You are in the kitchen." in text and " ... " in text
  assert text.endswith("To the North you see the pantry.\nActions: move north | take coin\nAction:")


def test_prompt_untruncated_is_the_plain_text():
  hist = [("move east", "You are in the corridor. Long details follow.")]
  args = ("find it", hist, "You see a coin.", ["take coin", "move west"])
  ids = P.encode_prompt(TOK, *args, history_turns=2, max_tokens=1000)
  assert TOK.decode(ids) == P.prompt_text(*args)
  assert TOK.decode(ids) == ("Task: find it\n> move east\nYou are in the corridor.\n"
                             "Now: You see a coin.\nActions: take coin | move west\nAction:")


def test_prompt_drops_oldest_turns_first():
  hist = [(f"move {d}", f"You are in room {i}. Long details follow.")
          for i, d in enumerate(["north", "south", "east", "west"])]
  obs = "You are in the hall. " + "A lamp. " * 40
  full = P.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4, max_tokens=10_000)
  for budget in (len(full) - 1, 110, 90):
    text = TOK.decode(P.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4,
                                      max_tokens=budget, min_obs_tokens=48))
    kept = [i for i in range(4) if f"room {i}." in text]
    assert kept == list(range(4 - len(kept), 4))  # a suffix: the newest turns
  assert len(P.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4, max_tokens=90)) <= 90


@pytest.mark.parametrize("n, budget", [(10, 20), (30, 12), (30, 3), (30, 0)])
def test_middle_cut(n, budget):
  ids, sep = list(range(100, 100 + n)), [1, 2]
  out = P._middle_cut(ids, budget, sep)
  assert len(out) == min(n, budget)
  if n > budget > len(sep):
    keep = budget - 2
    assert out[: keep // 3] == ids[: keep // 3] and out[keep // 3: keep // 3 + 2] == sep
    assert out[keep // 3 + 2:] == ids[n - (keep - keep // 3):]


CHAT_TOK = Tokenizer(TOK.tok, chat_template=(
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
# ALFWorld-like: dozens of admissible actions, far more than half a small budget.
MANY = sorted([f"go to countertop {i}" for i in range(1, 25)] + ["inventory", "look"]
              + [f"take coin {i} from countertop {i}" for i in range(1, 9)])


@pytest.mark.parametrize("fmt_name", ["plain", "chat"])
@pytest.mark.parametrize("budget", [128, 200, 300])
def test_action_list_drops_whole_actions_keeps_header_and_cue(fmt_name, budget):
  fmt = P.PLAIN if fmt_name == "plain" else P.PromptFormat.chat(CHAT_TOK)
  hist = [("go to countertop 3", "You arrive at countertop 3. On it you see a coin 3.")]
  obs = "You arrive at countertop 1. " + "On it you see a spoon. " * 20
  enc = P.build_prompt(CHAT_TOK, "put a coin in the box", hist, obs, MANY, history_turns=2,
                       max_tokens=budget, fmt=fmt)
  assert len(enc.ids) <= budget
  assert enc.ids[:len(fmt.prefix_ids)] == list(fmt.prefix_ids)
  assert enc.ids[len(enc.ids) - len(fmt.suffix_ids):] == list(fmt.suffix_ids)
  body = enc.ids[len(fmt.prefix_ids):len(enc.ids) - len(fmt.suffix_ids)]
  text = CHAT_TOK.decode(body)
  assert text.startswith("Task: put a coin in the box\n")
  kept = len(MANY) - enc.actions_dropped
  assert 0 < kept < len(MANY)  # the budget is tight: some, not all, actions fit
  tail = "\nActions: " + " | ".join(MANY[:kept] + ["..."]) + "\nAction:"
  assert text.endswith(tail)  # the header, the first actions whole, the marker, the cue
  # As many as fit: one more action would not fit the tail's half of the budget.
  half = (budget - len(fmt.prefix_ids) - len(fmt.suffix_ids)) // 2
  more = "\nActions: " + " | ".join(MANY[:kept + 1] + ["..."]) + "\nAction:"
  assert len(CHAT_TOK.encode(tail)) <= half < len(CHAT_TOK.encode(more))
  assert P.encode_prompt(CHAT_TOK, "put a coin in the box", hist, obs, MANY, history_turns=2,
                         max_tokens=budget, fmt=fmt) == enc.ids


def test_action_list_that_fits_is_untouched_and_a_budget_without_room_for_the_cue_fails():
  enc = P.build_prompt(TOK, "t", [], "You see a coin.", ["take coin", "move west"],
                       history_turns=2, max_tokens=1000)
  assert enc.actions_dropped == 0
  assert TOK.decode(enc.ids).endswith("\nActions: take coin | move west\nAction:")
  with pytest.raises(ValueError, match="cannot hold its header and cue"):
    P.build_prompt(TOK, "t", [], "o", MANY, history_turns=0, max_tokens=6)


def test_a_system_message_comes_before_the_prompt_in_the_chat_template():
  """rollout.system_prompt: the template renders it as the system turn (else its default)."""
  tok = Tokenizer(CHAT_TOK.tok, chat_template=(
      "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDefault.<|im_end|>\n"
      "{% endif %}" + CHAT_TOK.chat_template))
  fmt = P.PromptFormat.chat(tok, system="Pick one.")
  assert list(fmt.prefix_ids) == tok.encode("<|im_start|>system\nPick one.<|im_end|>\n"
                                            "<|im_start|>user\n", specials=True)
  assert P.PromptFormat.chat(tok).prefix_ids == tuple(tok.encode(
      "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\n", specials=True))
  assert fmt.suffix_ids == P.PromptFormat.chat(tok).suffix_ids


def test_environment_text_cannot_inject_special_tokens():
  # An observation that spells the end-of-action token stays text inside the prompt; the
  # chat template's own markup around it keeps its special tokens.
  fmt = P.PromptFormat.chat(Tokenizer(CHAT_TOK.tok, chat_template=(
      "<pad>{% for m in messages %}{{ m['content'] }}{% endfor %}<eos>")))
  assert fmt.prefix_ids == (TOK.pad_id,) and fmt.suffix_ids == (TOK.eos_id,)
  obs = "The sign reads: <eos> <pad> end."
  enc = P.build_prompt(TOK, "t", [], obs, ["read sign"], history_turns=0, max_tokens=200,
                       fmt=fmt)
  body = enc.ids[1:-1]
  assert TOK.eos_id not in body and TOK.pad_id not in body
  assert TOK.decode(body) == P.prompt_text("t", [], obs, ["read sign"])


@pytest.mark.parametrize("text, want", [
    ("I see a coin.\n<action>take coin</action>", ("take coin", True)),
    ("<action>  open door to north \n</action>", ("open door to north", True)),
    ("<action>go\nnorth</action> and that is all", ("go\nnorth", True)),  # inside kept whole
    ("take coin", ("", False)),  # no wrapper
    ("<action>take coin", ("", False)),  # unclosed
    ("take coin</action>", ("", False)),  # closed only
    ("<action></action>", ("", False)),  # empty
    ("<action>   </action>", ("", False)),  # blank
    ("<action>look</action> or <action>take coin</action>", ("", False)),  # two: ambiguous
    ("<ACTION>look</ACTION>", ("", False)),  # tags are case-sensitive, as written in the cue
    ("<action>take <b>coin</b></action>", ("take <b>coin</b>", True)),
])
def test_parse_action(text, want):
  assert P.parse_action(text) == want


def test_think_format_prompt_asks_for_the_wrapper_and_sft_targets_carry_it():
  think = P.PromptFormat(action_format="think")
  assert think.answer_text("take coin") == " <action>take coin</action>"
  assert P.PLAIN.answer_text("take coin") == " take coin"
  assert think.read_answer("hmm <action>look</action>") == ("look", True)
  assert P.PLAIN.read_answer("hmm <action>look</action>") == ("hmm <action>look</action>", True)
  text = P.prompt_text("find the coin", [], "You are in the kitchen.", ["look", "take coin"],
                       think.cue)
  assert text.endswith("\nActions: look | take coin" + P.THINK_CUE)
  assert "<action></action>" in P.THINK_CUE
  with pytest.raises(ValueError, match="action_format"):
    P.PromptFormat(action_format="json")
