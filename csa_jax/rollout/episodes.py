"""Multi-turn episodes (host side): playing them, and their `Trajectory` records.

The loop follows verl-agent's multi-turn rollout: every turn, the prompts of all live
episodes (csa_jax/rollout/prompts.py builds them and reads the answers) go through the policy in
one batched call, and the environment pool steps them in parallel. The policy is any
callable from prompt ids to action ids and their per-token log-probs (the jitted sampler,
in training), so this file never touches jax.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Sequence

import numpy as np

from csa_jax.config import RolloutConfig
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.perf import Timer
from csa_jax.rollout.prompts import PLAIN, PromptFormat, build_prompt

# (prompt ids per row, rng) -> (action ids per row, per-token log-probs per row); the
# action ids include the end-of-action token when the policy wrote it.
PolicyFn = Callable[[list[list[int]], np.random.Generator], tuple[list[list[int]], list[list[float]]]]


@dataclasses.dataclass
class Step:
  prompt_ids: list[int]
  action_ids: list[int]
  action_logps: list[float]
  action: str
  observation: str  # what the agent saw before acting
  reward: float
  anchor_id: int  # hash of the anchor state before acting (GiGPO step groups)
  valid: bool
  oracle_label: float | None
  # Admissible actions left out of the prompt's list to fit its budget (prompts.build_prompt).
  actions_dropped: int = 0


@dataclasses.dataclass
class Trajectory:
  task: tuple[str, int]  # (split, index)
  steps: list[Step]
  won: bool = False
  truncated: bool = False
  error: str | None = None

  @property
  def length(self) -> int:
    return len(self.steps)


def anchor_id(anchor: str) -> int:
  """A stable 31-bit id of an anchor's text (equal text, equal id)."""
  return zlib.crc32(anchor.strip().encode()) & 0x7FFFFFFF


def step_anchor(kind: str, observation: str, info) -> str:
  """The text GiGPO groups a step by: the environment's state anchor, or ("faithful",
  as verl-agent) the observation the agent saw."""
  if kind == "state":
    return info.anchor
  if kind == "faithful":
    return observation
  raise ValueError(f"rollout.anchor must be 'state' or 'faithful', got {kind!r}")


def action_text(tok: Tokenizer, action_ids: Sequence[int]) -> str:
  ids = [i for i in action_ids if i != tok.eos_id]
  return tok.decode(ids).strip()


# ----------------------------------------------------------------------------------------
# Episodes.


def run_episodes(pool, policy: PolicyFn, tok: Tokenizer, tasks: Sequence[tuple[str, int]],
                 cfg: RolloutConfig, rng: np.random.Generator,
                 on_wave: Callable[[int], None] | None = None,
                 fmt: PromptFormat = PLAIN, perf: Timer | None = None) -> list[Trajectory]:
  """Plays one episode per task, `pool.num_envs` at a time; results in task order.

  The policy always gets `pool.num_envs` prompts (finished or idle slots send
  `dummy_prompt`), one per slot; policy.SamplerPolicy samples only the live ones, in one of
  three row counts, so finished slots cost (almost) nothing and few shapes compile. With
  `cfg.overlap` the wave's slots play in two halves whose sampling and environment steps
  alternate (`_play_overlapped`). `perf` (a csa_jax.perf.Timer) times environment steps,
  prompt building and sampling, and counts the sampler's padding.
  """
  out: list[Trajectory] = []
  n = pool.num_envs
  perf = perf if perf is not None else Timer()  # nobody reads it
  for start in range(0, len(tasks), n):
    wave = _Wave(pool, tok, list(tasks[start:start + n]), cfg, fmt, perf)
    if cfg.overlap and n >= 2:
      _play_overlapped(wave, policy, rng)
    else:
      _play_serial(wave, policy, rng)
    out.extend(wave.finish())
    if on_wave is not None:
      on_wave(len(wave.trajs))
  return out


class _Wave:
  """The episodes of one wave, slot by slot: prompts out, actions in."""

  def __init__(self, pool, tok: Tokenizer, tasks: list[tuple[str, int]], cfg: RolloutConfig,
               fmt: PromptFormat, perf):
    self.pool, self.tok, self.cfg, self.fmt, self.perf = pool, tok, cfg, fmt, perf
    self.slots = list(range(len(tasks)))
    with perf.phase("env"):
      results = pool.reset(self.slots, tasks)
    self.trajs = [Trajectory(task=t, steps=[]) for t in tasks]
    self.obs = [r.observation for r in results]
    self.infos = [r.info for r in results]
    self.history: list[list[tuple[str, str]]] = [[] for _ in tasks]
    self.live = [not r.done for r in results]
    for i, r in enumerate(results):
      if r.done:  # a reset that failed
        self.trajs[i].truncated, self.trajs[i].error = True, r.info.error

  def live_in(self, slots: Sequence[int]) -> list[int]:
    return [i for i in slots if i < len(self.live) and self.live[i]]

  def prompts(self, idx: list[int], first: int, width: int
              ) -> tuple[list[list[int]], list[int]]:
    """`width` prompts for slots first .. first + width - 1: the live ones in `idx`
    built from their state, the others one-token dummies; and the actions each dropped."""
    prompts = [dummy_prompt(self.tok) for _ in range(width)]
    dropped = [0] * width
    c = self.cfg
    with self.perf.phase("prompt"):
      for i in idx:
        enc = build_prompt(self.tok, self.infos[i].task, self.history[i], self.obs[i],
                           self.infos[i].admissible_actions, history_turns=c.history_turns,
                           max_tokens=c.max_prompt_tokens, fmt=self.fmt)
        prompts[i - first], dropped[i - first] = enc.ids, enc.actions_dropped
    return prompts, dropped

  def act(self, idx: list[int], first: int, prompts, dropped, action_ids, action_logps,
          groups) -> None:
    """Steps the environments of `idx` with the policy's answers and records the steps;
    the call sampled the batches `groups` (`_sampler_groups`)."""
    live = [False] * len(prompts)
    for i in idx:
      live[i - first] = True
    self.perf.count_sampler_call([len(p) for p in prompts], live,
                                 [len(a) for a in action_ids], groups)
    answers = [self.fmt.read_answer(action_text(self.tok, action_ids[i - first])) for i in idx]
    with self.perf.phase("env"):
      stepped = self.pool.step(idx, [a for a, _ in answers])
    for i, (a, well_formed), r in zip(idx, answers, stepped):
      k = i - first
      self.trajs[i].steps.append(Step(
          prompt_ids=prompts[k], action_ids=list(action_ids[k]),
          action_logps=list(action_logps[k]), action=a, observation=self.obs[i],
          reward=float(r.reward),
          anchor_id=anchor_id(step_anchor(self.cfg.anchor, self.obs[i], self.infos[i])),
          valid=r.info.action_valid and well_formed, oracle_label=r.info.oracle_label,
          actions_dropped=dropped[k]))
      self.history[i].append((a, r.observation))
      self.obs[i], self.infos[i] = r.observation, r.info
      if r.done:
        self.live[i] = False
        self.trajs[i].won = bool(r.info.won)
        self.trajs[i].truncated = bool(r.info.truncated) and not r.info.won
        self.trajs[i].error = r.info.error

  def finish(self) -> list[Trajectory]:
    for i in self.slots:
      if self.live[i]:  # ran out of turns
        self.trajs[i].truncated = True
    return self.trajs


def dummy_prompt(tok: Tokenizer) -> list[int]:
  """The one-token prompt of a finished or idle slot (a policy may skip it:
  policy.SamplerPolicy samples only the other rows)."""
  return [tok.eos_id]


def _sampler_groups(policy, prompts: list[list[int]], cfg: RolloutConfig
                    ) -> list[tuple[list[int], int, int]]:
  """The batches a policy call samples for `prompts`, as (slots, rows, prompt width): the
  policy's own `sampler_groups` where it has one (policy.SamplerPolicy drops dummy rows
  and buckets or fits widths), else one batch of its `sampler_shape`, else every row at
  the prompt budget."""
  groups = getattr(policy, "sampler_groups", None)
  if groups is not None:
    return groups(prompts)
  shape = getattr(policy, "sampler_shape", None)
  rows, width = (shape(prompts) if shape is not None
                 else (len(prompts), cfg.max_prompt_tokens))
  return [(list(range(len(prompts))), rows, width)]


def _play_serial(wave: _Wave, policy: PolicyFn, rng: np.random.Generator) -> None:
  """Every turn: all live slots' prompts in one policy call, then all their steps."""
  n = wave.pool.num_envs
  for _ in range(wave.cfg.max_turns):
    idx = wave.live_in(wave.slots)
    if not idx:
      break
    prompts, dropped = wave.prompts(idx, 0, n)
    with wave.perf.phase("sample"):
      action_ids, action_logps = policy(prompts, rng)
    wave.act(idx, 0, prompts, dropped, action_ids, action_logps,
             _sampler_groups(policy, prompts, wave.cfg))


def _play_overlapped(wave: _Wave, policy: PolicyFn, rng: np.random.Generator) -> None:
  """The slots in two halves, each with its own turns: while the device samples for one
  half, the host steps the other half's environments and builds its next prompts.

  A policy with `dispatch(prompts, rng) -> pending` and `collect(pending) -> (ids,
  logps)` (policy.SamplerPolicy: JAX dispatch returns before the device is done) is
  overlapped; a plain callable is called at dispatch, so the halves only alternate. Each
  half always sends ceil(num_envs / 2) prompts (one compiled shape). An episode's steps
  are what the serial loop would record for the same answers; a sampler with its own key
  stream draws different answers (two calls of half the rows per turn instead of one).
  """
  n = wave.pool.num_envs
  half = -(-n // 2)
  firsts = (0, half)
  dispatch = getattr(policy, "dispatch", None) or (lambda p, r: policy(p, r))
  collect = getattr(policy, "collect", None) or (lambda pending: pending)
  turns, pending = [0, 0], [None, None]

  def launch(k: int) -> None:
    idx = wave.live_in(range(firsts[k], firsts[k] + half))
    pending[k] = None
    if idx and turns[k] < wave.cfg.max_turns:
      prompts, dropped = wave.prompts(idx, firsts[k], half)
      with wave.perf.phase("sample"):
        pending[k] = (idx, prompts, dropped, dispatch(prompts, rng),
                      _sampler_groups(policy, prompts, wave.cfg))
      turns[k] += 1

  launch(0)
  launch(1)
  while pending[0] or pending[1]:
    for k in (0, 1):
      if pending[k] is None:
        continue
      idx, prompts, dropped, handle, groups = pending[k]
      with wave.perf.phase("sample"):
        action_ids, action_logps = collect(handle)
      # The other half's sampling (dispatched last) runs on the device meanwhile.
      wave.act(idx, firsts[k], prompts, dropped, action_ids, action_logps, groups)
      launch(k)
