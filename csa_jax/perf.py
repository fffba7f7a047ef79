"""Where an RL iteration's time goes (host side): phase timers and padding counters.

One `Timer` lives for the run; the trainer resets it at the start of every RL iteration
and writes `metrics()` into that iteration's line. The phases are disjoint wall-clock
spans measured with `time.perf_counter` on the host:

  env         pool.reset / pool.step (environment stepping)
  prompt      prompt building and tokenisation (prompts.build_prompt)
  sample      the sampler: dispatch and the wait for its tokens (prefill and decode run in
              one jitted call, so they are not split here; benchmarks/iteration.py times a
              prefill alone on the same prompts)
  adv         the method's prepare (advantages and any auxiliary model work)
  batch       building training batches (grain shuffle, row arrays, packing, to device)
  update      the jitted update steps (the host waits on each step's metrics)
  eval        held-out evaluation
  checkpoint  the checkpoint save that ended the previous iteration (a save comes after its
              iteration's line is written, so it is reported with the next one)

With `rollout.overlap` the environment steps of one half of the slots run while the
device samples for the other, so `sample` is then the time the host waited for tokens
(the device's busy time minus what hid behind environment steps).

Counters give the padding fractions: sampler prompt rows (pad slots / all slots of the
prompt batches the sampler ran, rows it ran beyond the live ones counted as padding),
generated-token slots (rows x decode steps run), and training rows (pad tokens / all token
slots of the update batches).
"""

from __future__ import annotations

import collections
import contextlib
import time

PHASES = ("env", "prompt", "sample", "adv", "batch", "update", "eval", "checkpoint")


class Timer:
  """Seconds per phase and token counters, accumulated until `reset`."""

  def __init__(self):
    self.reset()

  def reset(self, checkpoint_s: float = 0.0) -> None:
    """Starts a new iteration; `checkpoint_s` is the save that ended the last one."""
    self.seconds: dict[str, float] = collections.defaultdict(float)
    self.counts: dict[str, float] = collections.defaultdict(float)
    self.seconds["checkpoint"] = checkpoint_s
    self._start = time.perf_counter()

  @contextlib.contextmanager
  def phase(self, name: str):
    if name not in PHASES:
      raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] += time.perf_counter() - t0

  def add(self, name: str, value: float) -> None:
    self.counts[name] += value

  def count_sampler_call(self, prompt_lens: list[int], live: list[bool], gen_lens: list[int],
                         groups: list[tuple[list[int], int, int]]) -> None:
    """One policy call over len(prompt_lens) slots, `live` marking real prompts (the
    others are dummies of finished or idle slots), that sampled the batches `groups`:
    (the slots a batch holds, its rows: at least those, the sampler may skip dummies, its
    prompt width). A batch's decode loop runs until its longest row stops, so each of its
    rows costs its longest live answer."""
    self.add("prompt_tokens", sum(n for n, ok in zip(prompt_lens, live) if ok))
    self.add("gen_tokens", sum(n for n, ok in zip(gen_lens, live) if ok))
    for slots, rows, prompt_width in groups:
      self.add("prompt_slots", rows * prompt_width)
      self.add("gen_slots", rows * max((gen_lens[i] for i in slots if live[i]), default=0))

  def count_train_batch(self, real_tokens: int, slots: int) -> None:
    self.add("train_tokens", real_tokens)
    self.add("train_slots", slots)

  def metrics(self, prefix: str = "perf/") -> dict[str, float]:
    """`perf/<phase>_s`, `perf/iteration_s` (wall time since `reset` plus the previous
    checkpoint), `perf/frac_<phase>` (share of the iteration) and `perf/frac_other`,
    tokens per second, and the padding fractions where something was counted."""
    s, c = self.seconds, self.counts
    total = time.perf_counter() - self._start + s["checkpoint"]
    out = {f"{prefix}{p}_s": s[p] for p in PHASES}
    out[f"{prefix}iteration_s"] = total
    for p in PHASES:
      out[f"{prefix}frac_{p}"] = s[p] / total if total > 0 else 0.0
    out[f"{prefix}frac_other"] = max(0.0, 1.0 - sum(s[p] for p in PHASES) / total) if total else 0.0
    out[f"{prefix}gen_tokens_per_s"] = c["gen_tokens"] / s["sample"] if s["sample"] else 0.0
    for name, real, slots in (("sampler_prompt", "prompt_tokens", "prompt_slots"),
                              ("sampler_gen", "gen_tokens", "gen_slots"),
                              ("train", "train_tokens", "train_slots")):
      if c[slots]:
        out[f"{prefix}{name}_pad_frac"] = 1.0 - c[real] / c[slots]
    return out


def is_wall_clock(key: str) -> bool:
  """Whether a metric depends on wall-clock time (seconds, rates per second, a phase's
  share): the keys a resumed run may not repeat; everything else in a line must."""
  return key.endswith("_s") or key.startswith("perf/frac_")
