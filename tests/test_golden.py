"""Golden test of one RL iteration (as nanodo pins its train step): a tiny fixed run through
the real `Trainer` (expert demonstrations -> tokenizer -> SFT -> one RL iteration of CSA
-> evaluation) whose parameters, optimizer state and metrics are compared with the values
stored in tests/golden/one_rl_iteration.json, so that a refactor that means to change
nothing (issue 27: the task group's module, the trainer split up) is shown to change
nothing, bit for bit.

What it pins: the SHA-256 of the bytes of every leaf of the SFT parameters and of the
train state after the RL iteration (parameters, Adam's moments, the step counter), with
each leaf's shape, dtype, sum and sum of squares (to read how far a mismatch is off) and a
few exact values; the tokenizer file's hash; every line of metrics.jsonl except wall-clock
times; the checkpoint's host-side record (environment steps, the sampler key, the packed
sequence counts).

The environment is a pure-Python toy defined here (no JVM, no engine whose upgrade would
move the numbers): a line of cells, a coin in one of them; "go east", "go west",
"take coin". SFT is short enough that the policy is mediocre (the rollout groups are mixed:
some episodes won, some actions invalid), so the advantages, the clipped update (the
clip-higher range and the dual clip are set to values that differ from the defaults), the
entropy bonus and the KL anchor all shape the result.

Regenerating the golden file:

    CSA_JAX_REGEN_GOLDEN=1 python -m pytest -q -n 0 tests/test_golden.py

rewrites it from this run and then fails on purpose (review `git diff tests/golden` and
commit it with the change). Regenerating is legitimate ONLY when a change is meant to
change results (a new default, a bug fix in the update, a new metric, an upgrade of
jax/jaxlib/flax/optax/numpy: the file records the versions it was made with, and the
failure message says when they differ from the installed ones). A refactor that needs a
new golden file has changed behaviour: find out why instead.

Determinism: the run is one process on CPU with fixed seeds; the result is the same in a
fresh process, under `pytest -n 2` (xdist workers) and on one core (`taskset -c 0`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform

import jax
import numpy as np
import pytest

from csa_jax.checkpoint import Checkpointer
from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import list_envs, register_env

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden",
                      "one_rl_iteration.json")
REGEN_VAR = "CSA_JAX_REGEN_GOLDEN"
ENV_NAME = "golden_line"
# Wall-clock and throughput metrics differ from run to run; every other metric is pinned
# (perf/ counters such as env_steps_total and the padding fractions included).
_TIMING_SUFFIXES = ("_s", "_per_s")
_TIMING_PREFIXES = ("perf/frac_",)


class LineEnv(TextEnv):
  """Cells 0 .. cells-1 in a row; the agent starts in cell 0, the coin lies in cell
  1 + (7 * index + [split is test]) % (cells - 1). Reward 1 for "take coin" in its cell.
  Moving off the line, taking where there is no coin, or any other text is invalid
  ("Nothing happens."). The anchor is the cell; the oracle label the decrease in distance
  to the coin (+1 for the win)."""

  splits = ("train", "test")
  ACTIONS = ("go east", "go west", "take coin")

  def __init__(self, cells: int = 4):
    self.cells = cells
    self.pos = self.coin = 0

  def num_tasks(self, split: str) -> int:
    if split not in self.splits:
      raise ValueError(f"unknown split {split!r}")
    return 50

  def _obs(self) -> str:
    return f"You are in cell {self.pos}." + (" You see a coin." if self.pos == self.coin else "")

  def _info(self, **kw) -> StepInfo:
    return StepInfo(task=f"take the coin in cell {self.coin}", admissible_actions=self.ACTIONS,
                    anchor=str(self.pos), **kw)

  def reset(self, split: str, index: int) -> StepResult:
    self.coin = 1 + (7 * index + (split == "test")) % (self.cells - 1)
    self.pos = 0
    return StepResult(self._obs(), 0.0, False, self._info())

  def expert_action(self) -> str:
    return "go east" if self.pos < self.coin else "take coin"

  def step(self, action: str) -> StepResult:
    a, before = action.strip(), abs(self.coin - self.pos)
    valid, won = True, False
    if a == "go east" and self.pos < self.cells - 1:
      self.pos += 1
    elif a == "go west" and self.pos > 0:
      self.pos -= 1
    elif a == "take coin" and self.pos == self.coin:
      won = True
    else:
      valid = False
    obs = "You win." if won else (self._obs() if valid else "Nothing happens. " + self._obs())
    label = float(before - abs(self.coin - self.pos)) + float(won)
    return StepResult(obs, float(won), won,
                      self._info(won=won, action_valid=valid, oracle_label=label))


if ENV_NAME not in list_envs():  # this module may be imported twice (xdist, reruns)
  register_env(ENV_NAME)(LineEnv)


def golden_config(demos_dir: str) -> ExperimentConfig:
  """The pinned run. Change nothing here without regenerating (see the module docstring)."""
  return ExperimentConfig(
      name="golden", seed=0,
      env=EnvConfig(name=ENV_NAME, kwargs={}, num_train_tasks=20),
      tokenizer=TokenizerConfig(vocab_size=300),
      model=ModelConfig.tiny(vocab_size=300, hidden_size=16, intermediate_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                             max_seq_len=96),
      rollout=RolloutConfig(tasks_per_iter=2, group_size=3, max_turns=4, history_turns=1,
                            max_prompt_tokens=64, max_action_tokens=4, num_envs=6),
      # Knobs set off their defaults where a wiring bug would otherwise hide: clip-higher,
      # the dual clip, an entropy bonus; two epochs of minibatches so that the later
      # steps run at ratios away from 1. KL anchor and invalid penalty at their defaults.
      algo=AlgoConfig(estimator="csa", minibatch_size=8, clip_low=0.2, clip_high=0.28,
                      dual_clip=3.0, entropy_coef=0.01, epochs=2),
      # Unpacked rows: one update shape per phase instead of one per packed sequence count
      # (three SFT and two RL compiles here, ~10 s); the packed update is checked against the
      # unpacked one in tests/test_trainer_rl.py::test_packed_rows_update_like_unpacked_rows.
      optim=OptimConfig(learning_rate=3e-4, pack_rows=False),
      sft=SFTConfig(num_demos=6, epochs=12, batch_size=8, learning_rate=1e-2,
                    demos_dir=demos_dir),
      eval=EvalConfig(num_episodes=2, greedy=False, sampled=True),
      rl_iterations=1, checkpoint_every=1)


# ----------------------------------------------------------------------------------------
# What is pinned.


def _leaf_record(x) -> dict:
  a = np.asarray(x)
  f = a.astype(np.float64)
  return {"shape": list(a.shape), "dtype": str(a.dtype),
          "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
          "sum": float(f.sum()), "sum_sq": float((f * f).sum())}


def tree_record(tree) -> dict[str, dict]:
  return {jax.tree_util.keystr(path): _leaf_record(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _exact_values(tree, n=4) -> dict[str, list]:
  """The first n entries of a few parameter leaves, as exact floats."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = jax.tree_util.keystr(path)
    if any(k in name for k in ("lm_head", "q_proj", "norm']['weight", "embed_tokens")):
      out[name] = [float(v) for v in np.asarray(leaf).ravel()[:n]]
  return out


def _pinned_metrics(path: str) -> list[dict]:
  lines = []
  with open(path) as f:
    for line in f:
      rec = json.loads(line)
      if "sft/batch" in rec:  # the SFT loss curve (one line per log_every batches): logging
        continue             # added after this file was written, not a result
      lines.append({k: v for k, v in rec.items()
                    if not (k.endswith(_TIMING_SUFFIXES) or k.startswith(_TIMING_PREFIXES))})
  return lines


def _versions() -> dict[str, str]:
  import flax
  import jaxlib
  import optax
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "numpy": np.__version__,
          "machine": platform.machine()}


def run_and_record(tmp_path) -> dict:
  from csa_jax.trainer import Trainer  # pylint: disable=g-import-not-at-top
  work = str(tmp_path / "run")
  cfg = golden_config(str(tmp_path / "demos"))
  summary = Trainer(cfg, work).run()
  sft_ckpt, rl_ckpt = (Checkpointer(os.path.join(work, d)) for d in ("sft", "checkpoints"))
  try:
    sft_tree, _ = sft_ckpt.read()
    rl_tree, meta = rl_ckpt.read()
  finally:
    sft_ckpt.close()
    rl_ckpt.close()
  with open(os.path.join(work, "tokenizer.json"), "rb") as f:
    tok_sha = hashlib.sha256(f.read()).hexdigest()
  return {
      "versions": _versions(),
      "tokenizer_sha256": tok_sha,
      "sft_params": tree_record(sft_tree),
      "rl_state": tree_record(rl_tree),
      "rl_param_values": _exact_values(rl_tree["params"]),
      "checkpoint_meta": {k: meta[k] for k in ("phase", "iteration", "env_steps",
                                               "rollout_key", "pack_counts")},
      "metrics": _pinned_metrics(os.path.join(work, "metrics.jsonl")),
      "summary": summary,
  }


# ----------------------------------------------------------------------------------------
# Comparison.


def _same(a, b) -> bool:
  """Exact equality of JSON values, NaN equal to NaN."""
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
    return True
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return type(a) is type(b) and a == b


def differences(want: dict, got: dict) -> list[str]:
  out = []
  for section in ("sft_params", "rl_state"):
    w, g = want[section], got[section]
    if w.keys() != g.keys():
      out.append(f"{section}: leaves differ: missing {sorted(w.keys() - g.keys())}, "
                 f"new {sorted(g.keys() - w.keys())}")
    for k in sorted(w.keys() & g.keys()):
      if not _same(w[k], g[k]):
        out.append(f"{section}{k}: want {w[k]}, got {g[k]}")
  for section in ("tokenizer_sha256", "rl_param_values", "checkpoint_meta", "summary"):
    if not _same(want[section], got[section]):
      out.append(f"{section}: want {want[section]}, got {got[section]}")
  wm, gm = want["metrics"], got["metrics"]
  if len(wm) != len(gm):
    out.append(f"metrics.jsonl: {len(wm)} lines wanted, {len(gm)} written")
  for i, (w, g) in enumerate(zip(wm, gm)):
    for k in sorted(w.keys() | g.keys()):
      if not _same(w.get(k, "<absent>"), g.get(k, "<absent>")):
        out.append(f"metrics line {i} (step {w.get('step')}) {k}: want {w.get(k, '<absent>')}, "
                   f"got {g.get(k, '<absent>')}")
  return out


def test_one_rl_iteration_matches_the_golden_file(tmp_path):
  """Catches any change in what one RL iteration computes (rollouts, rows, advantages,
  the update, the optimizer, the metrics), and in the SFT stage before it."""
  got = json.loads(json.dumps(run_and_record(tmp_path)))  # compared as the file stores it
  # The run is one that exercises the update: mixed groups and real advantages.
  rl = next(m for m in got["metrics"] if "adv/std" in m)
  assert 0 < rl["rollout/success"] < 1 and rl["rollout/invalid_action_frac"] > 0
  assert rl["adv/std"] > 0 and rl["perf/update_skipped"] == 0.0
  if os.environ.get(REGEN_VAR):
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
      json.dump({"_about": "tests/test_golden.py pins one RL iteration; regenerate only "
                           "for a change meant to change results (see its docstring).",
                 **got}, f, indent=1, sort_keys=True)
      f.write("\n")
    pytest.fail(f"{REGEN_VAR} is set: rewrote {GOLDEN}; review `git diff tests/golden` and "
                "commit it only if this change is meant to change results")
  with open(GOLDEN) as f:
    want = json.load(f)
  diffs = differences(want, got)
  if diffs:
    note = ""
    if want["versions"] != got["versions"]:
      note = (f"\nNOTE: the golden file was made with {want['versions']}, this is "
              f"{got['versions']}: a library upgrade alone can change the bits.")
    pytest.fail(f"one RL iteration differs from {GOLDEN} in {len(diffs)} places:\n  "
                + "\n  ".join(diffs[:40]) + note
                + f"\nIf (and only if) the change is meant to change results, regenerate "
                f"with {REGEN_VAR}=1 (tests/test_golden.py's docstring).")
