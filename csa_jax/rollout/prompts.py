"""Prompts (host side): the text an agent sees at each step, its token budget, and how its
answer is read.

A prompt holds the task, the last few (action, observation) turns, the current
observation and the admissible actions (`build_prompt`, with the budget rules). In the
"bare" action format whatever the policy writes is sent to the environment as is: an
unparsable or invalid action is the environment's business, and its feedback comes back as
the next observation. In the "think" format (full-size models) the policy reasons first and
wraps its action in <action>...</action>; `parse_action` extracts it, and an answer without
exactly one wrapper is sent as the empty action (the environment's own invalid-action
reply) and counted invalid, so it pays `algo.invalid_penalty` (verl-agent's projection does
the same). `PromptFormat` frames the text for a raw or a chat model. Episodes
(csa_jax/rollout/episodes.py) build one prompt per live environment every turn.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from csa_jax.model.tokenizer import Tokenizer


def _first_sentence(text: str, max_chars: int = 120) -> str:
  text = text.strip()
  cut = text.find(". ")
  return (text if cut < 0 else text[:cut + 1])[:max_chars]


BARE_CUE = "\nAction:"
THINK_CUE = ("\nThink step by step about the situation and the goal, then write the one "
             "action you choose, exactly as listed, inside <action></action>.\n")
ACTION_FORMATS = ("bare", "think")
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)


def parse_action(text: str) -> tuple[str, bool]:
  """The action inside the answer's one <action>...</action> wrapper, and whether there
  was exactly one non-empty wrapper. None, an unclosed one, an empty one or several
  (ambiguous: which did the model mean?) give ("", False)."""
  found = _ACTION_RE.findall(text)
  if len(found) != 1 or not found[0].strip():
    return "", False
  return found[0].strip(), True


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """How the prompt text is framed for the model, and how its answer starts and reads.

  A tiny from-scratch policy reads the raw text and answers after "Action:" with a
  space; a chat model gets the text as one user message in its own chat template and
  answers in the assistant turn. `action_format` "think" asks for reasoning and then the
  action in a wrapper (see the module docstring); the reasoning tokens are part of the
  step's action tokens, so they train with the step's advantage, as in verl-agent.
  """

  prefix_ids: tuple[int, ...] = ()
  suffix_ids: tuple[int, ...] = ()
  action_prefix: str = " "
  action_format: str = "bare"

  def __post_init__(self):
    if self.action_format not in ACTION_FORMATS:
      raise ValueError(f"action_format must be one of {ACTION_FORMATS}, "
                       f"got {self.action_format!r}")

  @property
  def cue(self) -> str:
    return THINK_CUE if self.action_format == "think" else BARE_CUE

  def answer_text(self, action: str) -> str:
    """What an expert's answer looks like (SFT targets, the action budget check): in the
    think format the bare wrapper, with no reasoning, as demonstrations carry none."""
    if self.action_format == "think":
      return f"{self.action_prefix}<action>{action}</action>"
    return self.action_prefix + action

  def read_answer(self, text: str) -> tuple[str, bool]:
    """(the action to send to the environment, whether the answer was well-formed)."""
    return parse_action(text) if self.action_format == "think" else (text, True)

  @classmethod
  def chat(cls, tok: Tokenizer, action_format: str = "bare", system: str = ""
           ) -> "PromptFormat":
    """The prompt as the user's message in `tok`'s chat template, after a system message
    when `system` is given (else the template's own default, if it writes one)."""
    marker = "\x00PROMPT\x00"
    messages = [{"role": "system", "content": system}] if system else []
    text = tok.render_chat(messages + [{"role": "user", "content": marker}],
                           add_generation_prompt=True)
    before, after = text.split(marker)
    # The template's markup holds its special tokens; the prompt between is plain text.
    return cls(tuple(tok.encode(before, specials=True)), tuple(tok.encode(after, specials=True)),
               "", action_format)


PLAIN = PromptFormat()


def prompt_parts(task: str, history: Sequence[tuple[str, str]], observation: str,
                 admissible: Sequence[str], cue: str = BARE_CUE
                 ) -> tuple[str, list[str], str, str]:
  """(header, one string per past turn, observation, tail with actions and the cue)."""
  header = f"Task: {task.strip()}\n"
  # Past observations keep only their first sentence ("You are in the kitchen."): enough
  # to tell where the agent was, short enough to keep several turns in a small window.
  turns = [f"> {a}\n{_first_sentence(o)}\n" for a, o in history]
  return header, turns, f"Now: {observation.strip()}", _tail_text(admissible, False, cue)


def _tail_text(actions: Sequence[str], more: bool, cue: str = BARE_CUE) -> str:
  """The action list and the cue; `more` marks a list that lost actions to the budget."""
  listed = " | ".join(list(actions) + (["..."] if more else []))
  return f"\nActions: {listed}{cue}"


def prompt_text(task: str, history: Sequence[tuple[str, str]], observation: str,
                admissible: Sequence[str], cue: str = BARE_CUE) -> str:
  header, turns, obs, tail = prompt_parts(task, history, observation, admissible, cue)
  return header + "".join(turns) + obs + tail


def _middle_cut(ids: list[int], budget: int, sep: list[int]) -> list[int]:
  """At most `budget` ids: the start and the end survive, the middle becomes `sep`."""
  if len(ids) <= budget:
    return ids
  if budget <= len(sep):
    return ids[:max(budget, 0)]
  keep = budget - len(sep)
  head = keep // 3
  return ids[:head] + sep + ids[len(ids) - (keep - head):]


@dataclasses.dataclass(frozen=True)
class EncodedPrompt:
  ids: list[int]
  actions_dropped: int  # admissible actions left out of the list to fit the budget


def _fit_actions(tok: Tokenizer, admissible: Sequence[str], budget: int, cue: str = BARE_CUE
                 ) -> tuple[list[int], int]:
  """The tail's ids within `budget`, dropping whole actions from the end of the list.

  The "Actions:" header and the "Action:" cue always stay; a cut list ends in " | ..." so
  the policy can tell it is incomplete. The tail is encoded as one text (as untruncated),
  and the number of actions kept is the largest whose encoding fits (binary search:
  encoded length grows with the text).
  """
  admissible = list(admissible)
  ids = tok.encode(_tail_text(admissible, False, cue))
  if len(ids) <= budget:
    return ids, 0
  fit = lambda k: tok.encode(_tail_text(admissible[:k], True, cue))
  best = fit(0)
  if len(best) > budget:
    raise ValueError(f"a prompt budget of {budget} tokens for the action list cannot hold "
                     f"its header and cue ({len(best)} tokens); raise max_prompt_tokens")
  lo, hi = 0, len(admissible) - 1  # fit(lo) fits; find the largest such k
  while lo < hi:
    mid = (lo + hi + 1) // 2
    ids = fit(mid)
    if len(ids) <= budget:
      lo, best = mid, ids
    else:
      hi = mid - 1
  return best, len(admissible) - lo


def build_prompt(tok: Tokenizer, task: str, history: Sequence[tuple[str, str]],
                 observation: str, admissible: Sequence[str], *, history_turns: int,
                 max_tokens: int, min_obs_tokens: int = 48,
                 fmt: PromptFormat = PLAIN) -> EncodedPrompt:
  """Token ids of the prompt, at most `max_tokens` long, and how many actions it dropped.

  The budget goes first to the task line (at most a quarter), then to the admissible
  actions with the "Actions:" header and the "Action:" cue (at most half): when the list
  does not fit, whole actions are dropped from its end (the adapters list them sorted)
  and the header, the cue and every kept action stay intact; then to the last
  `history_turns` turns, newest first, as long as the current observation keeps
  `min_obs_tokens`; the observation takes the rest and, if longer, loses its middle (its
  start says where the agent is, its end often lists exits and objects). A dropped action
  can still be written: the environment parses any text.
  """
  max_tokens -= len(fmt.prefix_ids) + len(fmt.suffix_ids)
  history = list(history)[-history_turns:] if history_turns > 0 else []
  header, turns, obs, _ = prompt_parts(task, history, observation, admissible, fmt.cue)
  head_ids = tok.encode(header)[: max_tokens // 4]
  tail_ids, dropped = _fit_actions(tok, admissible, max_tokens // 2, fmt.cue)
  room = max_tokens - len(head_ids) - len(tail_ids)
  obs_ids = tok.encode(obs)
  turn_ids: list[int] = []
  for t in reversed(turns):
    ids = tok.encode(t)
    if len(turn_ids) + len(ids) + min(len(obs_ids), min_obs_tokens) > room:
      break
    turn_ids = ids + turn_ids
  obs_ids = _middle_cut(obs_ids, room - len(turn_ids), tok.encode(" ... "))
  ids = list(fmt.prefix_ids) + head_ids + turn_ids + obs_ids + tail_ids + list(fmt.suffix_ids)
  return EncodedPrompt(ids, dropped)


def prompt_budget_needed(tok: Tokenizer, task: str, admissible: Sequence[str], *,
                         fmt: PromptFormat = PLAIN) -> int:
  """The smallest `max_tokens` at which `build_prompt` keeps the task line and the whole
  action list (they get at most a quarter and a half of the budget: hence 4x and 2x)."""
  head = len(tok.encode(prompt_parts(task, [], "", admissible)[0]))
  tail = len(tok.encode(_tail_text(list(admissible), False, fmt.cue)))
  return max(4 * head, 2 * tail) + len(fmt.prefix_ids) + len(fmt.suffix_ids)


def encode_prompt(tok: Tokenizer, task: str, history: Sequence[tuple[str, str]],
                  observation: str, admissible: Sequence[str], *, history_turns: int,
                  max_tokens: int, min_obs_tokens: int = 48,
                  fmt: PromptFormat = PLAIN) -> list[int]:
  """The ids of `build_prompt` (the budget rules are there)."""
  return build_prompt(tok, task, history, observation, admissible,
                      history_turns=history_turns, max_tokens=max_tokens,
                      min_obs_tokens=min_obs_tokens, fmt=fmt).ids
