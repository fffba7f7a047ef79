"""Expert demonstrations and the behaviour-cloning rows made of them: the episodes SFT
clones (`load_demos`), each expert step with the prompt the policy would see at that step
(the rollout's own prompt builder), and the text a tokenizer trained from scratch is
fitted on."""

from __future__ import annotations

import grain

from csa_jax.config import ExperimentConfig, demos_dir
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import prompts
from csa_jax.update import data as data_lib
from environments import demos as demos_lib


def load_demos(cfg: ExperimentConfig) -> list[dict]:
  """The expert's episodes (won ones, or all: sft.demo_filter) on the first
  sft.num_demos training tasks, built once as a TFDS array_record dataset (shared by
  all runs on this environment config) and read back through grain."""
  print(f"expert demonstrations: {cfg.sft.num_demos} {cfg.env.train_split} tasks in "
        f"{demos_dir(cfg)}")
  source = demos_lib.demo_data_source(
      demos_dir(cfg), cfg.env.name, dict(cfg.env.kwargs),
      split=cfg.env.train_split, num_tasks={cfg.env.train_split: cfg.sft.num_demos})
  records = [r for r in grain.MapDataset.source(source).map(demos_lib.decode_record)
             if r["won"] or cfg.sft.demo_filter == "all"]
  for r in records:
    r["admissible"] = [a.split(demos_lib.SEP) if a else [] for a in r["admissible"]]
  return sorted(records, key=lambda r: r["index"])


def demo_rows(records, tok: Tokenizer, cfg: ExperimentConfig,
              fmt: prompts.PromptFormat = prompts.PLAIN) -> list[data_lib.Row]:
  """Behaviour-cloning rows: every expert step, with the prompt the policy would see."""
  rows = []
  for rec in records:
    history: list[tuple[str, str]] = []
    for t, action in enumerate(rec["actions"]):
      prompt = prompts.encode_prompt(
          tok, rec["task"], history, rec["observations"][t], rec["admissible"][t],
          history_turns=cfg.rollout.history_turns, max_tokens=cfg.rollout.max_prompt_tokens,
          fmt=fmt)
      rows.append(data_lib.sft_row(prompt, action_target(tok, action, cfg, fmt)))
      history.append((action, rec["observations"][t + 1] if t + 1 < len(rec["observations"])
                      else ""))
  return rows


def action_target(tok: Tokenizer, action: str, cfg: ExperimentConfig,
                  fmt: prompts.PromptFormat = prompts.PLAIN) -> list[int]:
  """The token ids the policy writes for `action`: its answer text, cut to the action
  budget, then the end token that stops the sampler."""
  return tok.encode(fmt.answer_text(action))[: cfg.rollout.max_action_tokens - 1] + [tok.eos_id]


def demo_corpus(records, fmt: prompts.PromptFormat = prompts.PLAIN) -> list[str]:
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
