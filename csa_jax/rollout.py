"""Multi-turn episodes (host side): prompts, actions, `Trajectory` records.

The loop follows verl-agent's multi-turn rollout: every turn, the prompts of all live
episodes go through the policy in one batched call, and the environment pool steps
them in parallel. The policy is any callable from prompt ids to action ids and their
per-token log-probs (the jitted sampler, in training), so this file never touches jax.

A prompt holds the task, the last few (action, observation) turns, the current
observation and the admissible actions. In the "bare" action format whatever the policy
writes is sent to the environment as is: an unparsable or invalid action is the
environment's business, and its feedback comes back as the next observation. In the
"think" format (full-size models) the policy reasons first and wraps its action in
<action>...</action>; `parse_action` extracts it, and an answer without exactly one
wrapper is sent as the empty action (the environment's own invalid-action reply) and
counted invalid, so it pays `algo.invalid_penalty` (verl-agent's projection does the same).
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Callable, Sequence

import numpy as np

from csa_jax.config import RolloutConfig
from csa_jax.perf import Timer
from csa_jax.tokenizer import Tokenizer

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
  # Admissible actions left out of the prompt's list to fit its budget (see encode_prompt).
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


# ----------------------------------------------------------------------------------------
# Prompts.


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
          shape: tuple[int, int]) -> None:
    """Steps the environments of `idx` with the policy's answers and records the steps;
    the call sampled `shape` = (rows, prompt width) (`_sampler_shape`)."""
    live = [False] * len(prompts)
    for i in idx:
      live[i - first] = True
    self.perf.count_sampler_call([len(p) for p in prompts], live,
                                 [len(a) for a in action_ids], *shape)
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


def _sampler_shape(policy, prompts: list[list[int]], cfg: RolloutConfig) -> tuple[int, int]:
  """(rows, prompt width) a policy call samples for `prompts`: the policy's own
  `sampler_shape` where it has one (policy.SamplerPolicy drops dummy rows and buckets
  widths), else every row at the prompt budget."""
  shape = getattr(policy, "sampler_shape", None)
  return shape(prompts) if shape is not None else (len(prompts), cfg.max_prompt_tokens)


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
             _sampler_shape(policy, prompts, wave.cfg))


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
                      _sampler_shape(policy, prompts, wave.cfg))
      turns[k] += 1

  launch(0)
  launch(1)
  while pending[0] or pending[1]:
    for k in (0, 1):
      if pending[k] is None:
        continue
      idx, prompts, dropped, handle, shape = pending[k]
      with wave.perf.phase("sample"):
        action_ids, action_logps = collect(handle)
      # The other half's sampling (dispatched last) runs on the device meanwhile.
      wave.act(idx, firsts[k], prompts, dropped, action_ids, action_logps, shape)
      launch(k)


# ----------------------------------------------------------------------------------------
# Padded [B, G, T] arrays for the advantage estimators.


@dataclasses.dataclass(frozen=True)
class GroupArrays:
  """What the estimators read of B task groups of G episodes (csa_jax/groups.py makes
  them, `group_arrays`)."""

  rewards_BxG: np.ndarray  # float32 outcome reward (1 if won)
  logp_BxGxT: np.ndarray  # float32 step log-prob (sum or mean over action tokens)
  mask_BxGxT: np.ndarray  # bool, step exists
  step_rewards_BxGxT: np.ndarray  # float32, outcome reward on the last step
  state_id_BxGxT: np.ndarray  # int32 anchor ids
  oracle_BxGxT: np.ndarray  # float32 oracle labels, NaN where none
  action_len_BxGxT: np.ndarray  # int32 generated tokens per step (DAPO overlong shaping)
  invalid_BxGxT: np.ndarray  # bool, the environment rejected the step's action
