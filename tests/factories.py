"""What several test files build: episodes (`step`, `episode`, `random_episodes`), the tiny
config the algorithm tests pack rows for (`method_config`), and a small tokenizer."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from csa_jax.config import AlgoConfig, ExperimentConfig, RolloutConfig
from csa_jax.model import ModelConfig
from csa_jax.model.tokenizer import Tokenizer, train_bpe
from csa_jax.rollout.episodes import Step, Trajectory

# The tiny method config's vocabulary, prompt length and largest action, in tokens.
VOCAB, PROMPT, ACT = 48, 10, 4


def step(prompt_ids: Sequence[int] = (1,), action_ids: Sequence[int] = (2,),
         action_logps: Sequence[float] | None = None, *, action: str = "a",
         observation: str = "o", reward: float = 0.0, anchor_id: int = 0, valid: bool = True,
         oracle_label: float | None = None, actions_dropped: int = 0) -> Step:
  """A step; its action's log-probs default to 0 per token."""
  return Step(prompt_ids=list(prompt_ids), action_ids=list(action_ids),
              action_logps=(list(action_logps) if action_logps is not None
                            else [0.0] * len(action_ids)),
              action=action, observation=observation, reward=reward, anchor_id=anchor_id,
              valid=valid, oracle_label=oracle_label, actions_dropped=actions_dropped)


def episode(steps: Sequence[Step], *, won: bool = False, task: tuple[str, int] = ("train", 0),
            error: str | None = None) -> Trajectory:
  return Trajectory(task=task, steps=list(steps), won=won, error=error)


def random_episodes(cfg: ExperimentConfig, rng: np.random.Generator, won) -> list[Trajectory]:
  """One episode per entry of `won` (flattened), won or lost as it says: 1 .. max_turns
  steps of PROMPT random prompt ids and 1 .. ACT random action ids below VOCAB, sampling
  log-probs in (-3, 0], 70% of the actions valid."""
  out = []
  for w in np.asarray(won).ravel():
    steps = [step(rng.integers(2, VOCAB, PROMPT).tolist(),
                  rng.integers(2, VOCAB, rng.integers(1, ACT + 1)).tolist(), [],
                  valid=bool(rng.random() < 0.7))
             for _ in range(rng.integers(1, cfg.rollout.max_turns + 1))]
    for st in steps:
      st.action_logps = (-rng.random(len(st.action_ids)) * 3).tolist()
    out.append(episode(steps, won=bool(w)))
  return out


def method_config(method: str, **algo) -> ExperimentConfig:
  """A one-layer decoder of VOCAB tokens and 3 task groups of 3 episodes of up to 3 steps:
  small enough to pack an iteration's rows in a few batches."""
  model = ModelConfig.tiny(VOCAB, hidden_size=16, intermediate_size=32, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8, max_seq_len=32)
  rollout = RolloutConfig(tasks_per_iter=3, group_size=3, max_turns=3,
                          max_prompt_tokens=PROMPT + 2, max_action_tokens=ACT, num_envs=6)
  return ExperimentConfig(model=model, rollout=rollout,
                          algo=AlgoConfig(method=method, minibatch_size=8, kl_coef=0.0, **algo))


@functools.cache
def tokenizer() -> Tokenizer:
  """A small byte-level BPE over room descriptions and the prompt's markup."""
  return train_bpe(["You are in the kitchen. To the North you see the pantry.", " move north",
                    " take coin", "Task: Now: Actions: Action: > |"] * 10, 400)
