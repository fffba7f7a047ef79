"""Prompt and action lengths, in the policy's tokens, of an experiment's expert episodes.

    PYTHONPATH=. python -m benchmarks.prompt_lengths --exp keydoor_h4_smollm2_csa
    PYTHONPATH=. python -m benchmarks.prompt_lengths --exp alfworld_smollm2_csa --demos 20

Every prompt a pretrained policy reads costs compute per token, so the presets' budgets are
set just above what their prompts need. This plays the expert's demonstrations (the SFT
stage's own, `load_demos`) through the experiment's prompt builder: each step's prompt
through the model's chat template with the experiment's system message, once with the
experiment's budget (as training and evaluation see it) and once with no budget. Prints
the token counts (mean, median, 95th percentile, max), how many prompts the budget cut and
by how much, the chat markup's share, the budget `check_budgets` asks for, and the expert's
action lengths with the end token against `max_action_tokens`. A pretrained experiment's
model is resolved first (a packaged one imported into the cache if it is not there yet).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

import experiments
from csa_jax import pretrained
from csa_jax.config import apply_overrides
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import prompts
from csa_jax.rollout.sft_rows import load_demos


def _stats(x) -> str:
  x = np.asarray(x)
  return (f"mean {x.mean():.1f}, median {np.median(x):.0f}, p95 {np.percentile(x, 95):.0f}, "
          f"max {x.max()} (min {x.min()})")


def measure(cfg) -> list[str]:
  r = cfg.rollout
  tok = Tokenizer.from_hf_dir(cfg.model_path)
  fmt = (prompts.PromptFormat.chat(tok, r.action_format, r.system_prompt)
         if tok.chat_template else prompts.PromptFormat(action_prefix=" "))
  full, cut, actions, need = [], [], [], []
  records = load_demos(cfg)
  for rec in records:
    history: list[tuple[str, str]] = []
    for t, action in enumerate(rec["actions"]):
      args = (tok, rec["task"], history, rec["observations"][t], rec["admissible"][t])
      kw = dict(history_turns=r.history_turns, fmt=fmt)
      full.append(len(prompts.encode_prompt(*args, max_tokens=1 << 20, **kw)))
      cut.append(len(prompts.encode_prompt(*args, max_tokens=r.max_prompt_tokens, **kw)))
      need.append(prompts.prompt_budget_needed(tok, rec["task"], rec["admissible"][t],
                                               fmt=fmt))
      actions.append(len(tok.encode(fmt.answer_text(action))) + 1)
      history.append((action, rec["observations"][t + 1]
                      if t + 1 < len(rec["observations"]) else ""))
  full, cut = np.asarray(full), np.asarray(cut)
  shortened = full > cut
  return [
      f"{cfg.name}: {len(records)} expert episodes, {len(full)} steps, history_turns "
      f"{r.history_turns}, system prompt {r.system_prompt!r}",
      f"  prompt tokens, no budget: {_stats(full)}; chat markup and system message "
      f"{len(fmt.prefix_ids) + len(fmt.suffix_ids)} of them",
      f"  prompt tokens, budget {r.max_prompt_tokens}: {_stats(cut)}; cut: "
      f"{shortened.sum()} of {len(full)} prompts"
      + (f", by {_stats(full[shortened] - cut[shortened])} tokens" if shortened.any() else ""),
      f"  budget check_budgets asks for (task line and action list whole): max {max(need)}",
      f"  expert action tokens with the end token: {_stats(actions)}; budget "
      f"{r.max_action_tokens}",
  ]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--exp", required=True)
  p.add_argument("--demos", type=int, default=0,
                 help="expert episodes to measure (default: the experiment's sft.num_demos)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  args = p.parse_args(argv)
  cfg = apply_overrides(experiments.get_experiment(args.exp), args.overrides)
  if args.demos:
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, num_demos=args.demos))
  cfg = pretrained.resolve(cfg)
  if not cfg.model_path:
    raise SystemExit(f"{cfg.name} trains its policy from scratch: its tokenizer is trained "
                     "on its demonstrations; this measures pretrained policies' prompts")
  print("\n".join(measure(cfg)))


if __name__ == "__main__":
  main()
