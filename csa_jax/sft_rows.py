"""Behaviour-cloning rows from expert demonstrations: each expert step with the prompt the
policy would see at that step (the rollout's own prompt builder), and the text a
tokenizer trained from scratch is fitted on."""

from __future__ import annotations

from csa_jax import data as data_lib
from csa_jax import rollout as rollout_lib
from csa_jax.config import ExperimentConfig
from csa_jax.tokenizer import Tokenizer


def demo_rows(records, tok: Tokenizer, cfg: ExperimentConfig,
              fmt: rollout_lib.PromptFormat = rollout_lib.PLAIN) -> list[data_lib.Row]:
  """Behaviour-cloning rows: every expert step, with the prompt the policy would see."""
  rows = []
  for rec in records:
    history: list[tuple[str, str]] = []
    for t, action in enumerate(rec["actions"]):
      prompt = rollout_lib.encode_prompt(
          tok, rec["task"], history, rec["observations"][t], rec["admissible"][t],
          history_turns=cfg.rollout.history_turns, max_tokens=cfg.rollout.max_prompt_tokens,
          fmt=fmt)
      action_ids = (tok.encode(fmt.answer_text(action))[: cfg.rollout.max_action_tokens - 1]
                    + [tok.eos_id])
      rows.append(data_lib.sft_row(prompt, action_ids))
      history.append((action, rec["observations"][t + 1] if t + 1 < len(rec["observations"])
                      else ""))
  return rows


def demo_corpus(records, fmt: rollout_lib.PromptFormat = rollout_lib.PLAIN) -> list[str]:
  """The text a tokenizer is trained on: everything a prompt or an action can hold."""
  texts = []
  for rec in records:
    texts.append(rec["task"])
    texts.extend(rec["observations"])
    texts.extend(" " + a for a in rec["actions"])
    texts.extend(" | ".join(adm) for adm in rec["admissible"])
  texts.append("Task: Now: Actions: Action: > |")
  texts.append(fmt.cue + fmt.answer_text(""))
  return texts
