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

Bits are a property of the CPU as well as the code: XLA compiles for the host, and on
another CPU model the same run rounds differently (on an AMD EPYC with AVX-512 the file
made on an earlier machine differs in the last bits of every parameter, relative 1e-7 to
1e-6, and of the float metrics), and so does a run with another XLA backend optimisation
level (the suite compiles at level 0, tests/xla_env.py; the records made before it did are
near such a run, not equal). So each record in tests/golden/ names the CPU it was made on
and the level where it is not XLA's default (`cpu_fingerprint()`), and the test is:

- bitwise, against the record of this CPU (or against any record the run equals bit for
  bit: the first record, one_rl_iteration.json, was made before records named their CPU);
- on a CPU with no record, near: every discrete value exact (shapes, dtypes, the integer
  leaves, the tokenizer, the checkpoint's record, the episode outcomes, the metric names)
  and every float within a bound 7.8-24 times the drift measured between two CPU models
  (`NEAR_BOUNDS`), while one RL iteration moves the parameter sums 1,000-10,000 times that
  drift: a change to what the iteration computes still fails (a flipped KL sign does; a
  clip range the run never reaches fails neither tier: tests/test_wiring.py covers those). The test then says how to add
  a bitwise record for this CPU.

Regenerating:

    CSA_JAX_REGEN_GOLDEN=1 python -m pytest -q -n 0 tests/test_golden.py

rewrites this CPU's record from this run, removes the records of other CPUs (made by the
code before the change, they are stale), and then fails on purpose (review
`git diff tests/golden` and commit it with the change). `CSA_JAX_REGEN_GOLDEN=add` adds a
record for this CPU and keeps the others, only when this run is near every one of them
(for a CPU the test has not seen, on code that did not mean to change results). Regenerating is legitimate ONLY when a change is meant to
change results (a new default, a bug fix in the update, a new metric, an upgrade of
jax/jaxlib/flax/optax/numpy: the file records the versions it was made with, and the
failure message says when they differ from the installed ones). A refactor that needs a
new golden file has changed behaviour: find out why instead.

Determinism: the run is one process on CPU with fixed seeds; the result is the same in a
fresh process, under `pytest -n 2` (xdist workers) and on one core (`taskset -c 0`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import platform

import jax
import numpy as np
import pytest

from csa_jax.run.checkpoint import Checkpointer
from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import list_envs, register_env
from tests import xla_env

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
GOLDEN = os.path.join(GOLDEN_DIR, "one_rl_iteration.json")  # the first record (no CPU named)
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


def cpu_fingerprint() -> dict[str, str]:
  """What names the CPU model XLA compiles for: /proc/cpuinfo's model and a hash of its
  feature flags (two machines with the same model name can expose other features); and the
  backend optimisation level where XLA_FLAGS sets one (the suite's is 0, tests/xla_env.py:
  another level rounds as another CPU would)."""
  fields = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if not line.strip():
          break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
  except OSError:
    pass
  flags = " ".join(sorted(fields.get("flags", "").split()))
  out = {"model": fields.get("model name", platform.processor() or "unknown"),
         "family": fields.get("cpu family", ""), "model_id": fields.get("model", ""),
         "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16]}
  level = xla_env.opt_level()
  if level != "default":  # (records made at XLA's default do not name it)
    out["xla_opt_level"] = level
  return out


def record_path(cpu: dict[str, str]) -> str:
  level = f"-xla_o{cpu['xla_opt_level']}" if "xla_opt_level" in cpu else ""
  return os.path.join(GOLDEN_DIR, f"one_rl_iteration.cpu-{cpu['flags_sha256'][:8]}"
                                  f"-{cpu['family']}-{cpu['model_id']}{level}.json")


def run_and_record(tmp_path) -> dict:
  from csa_jax.run.trainer import Trainer  # pylint: disable=g-import-not-at-top
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
      "cpu": cpu_fingerprint(),
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


def _common_leaves(section: str, w: dict, g: dict, out: list[str]) -> list[str]:
  """The leaf names both records hold; a leaf only one holds is a difference."""
  if w.keys() != g.keys():
    out.append(f"{section}: leaves differ: missing {sorted(w.keys() - g.keys())}, "
               f"new {sorted(g.keys() - w.keys())}")
  return sorted(w.keys() & g.keys())


def _exact_sections(sections, want: dict, got: dict, out: list[str]) -> tuple[list, list]:
  """Compares `sections` exactly and the metrics' line counts; returns both metric lists."""
  for section in sections:
    if not _same(want[section], got[section]):
      out.append(f"{section}: want {want[section]}, got {got[section]}")
  wm, gm = want["metrics"], got["metrics"]
  if len(wm) != len(gm):
    out.append(f"metrics.jsonl: {len(wm)} lines wanted, {len(gm)} written")
  return wm, gm


def differences(want: dict, got: dict) -> list[str]:
  out = []
  for section in ("sft_params", "rl_state"):
    w, g = want[section], got[section]
    for k in _common_leaves(section, w, g, out):
      if not _same(w[k], g[k]):
        out.append(f"{section}{k}: want {w[k]}, got {g[k]}")
  wm, gm = _exact_sections(("tokenizer_sha256", "rl_param_values", "checkpoint_meta",
                             "summary"), want, got, out)
  for i, (w, g) in enumerate(zip(wm, gm)):
    for k in sorted(w.keys() | g.keys()):
      if not _same(w.get(k, "<absent>"), g.get(k, "<absent>")):
        out.append(f"metrics line {i} (step {w.get('step')}) {k}: want {w.get(k, '<absent>')}, "
                   f"got {g.get(k, '<absent>')}")
  return out


# Near comparison (a CPU with no record). The drift measured between two CPU models (the
# first record's machine and an AMD EPYC with AVX-512, the same code and libraries), as the
# largest normalised error over the leaves / values of each kind, and the bound used:
#   parameters (SFT and after RL)   1.1e-6  -> 1e-5
#   Adam's moments after one update 1.2e-4  -> 1e-3  (one update's gradients, not averaged)
#   the exact parameter values      4.2e-7 absolute -> 1e-5
#   float metrics, relative         8.4e-5 (sft/grad_norm) -> 1e-3
# A leaf's error is |d sum| / (sqrt(n) |x|) and |d sum_sq| / (2 |x|^2): each is at most the
# relative L2 distance of the leaf (Cauchy-Schwarz), and for a change of random sign much
# less, so the leaf check is coarse: it resolves about a 10 % change of one RL update's step
# on the largest leaf (tests below). The metrics (the losses, the KL, the entropy, the
# gradient norm, the ratio statistics of the update) resolve 0.1 %. One RL iteration moves
# the parameter sums by 1e-2 to 7e-1 against a drift of 1e-7 to 3e-5.
NEAR_BOUNDS = {"params": 1e-5, "moments": 1e-3, "values": 1e-5, "metrics": 1e-3}


def _leaf_errors(w: dict, g: dict) -> float:
  n = math.prod(w["shape"]) if w["shape"] else 1
  norm_sq = max(w["sum_sq"], g["sum_sq"])
  if norm_sq == 0:
    return 0.0 if w["sum"] == g["sum"] == 0 else math.inf
  return max(abs(w["sum"] - g["sum"]) / math.sqrt(n * norm_sq),
             abs(w["sum_sq"] - g["sum_sq"]) / (2 * norm_sq))


def _near_value(w, g, bound: float) -> bool:
  """Floats within `bound` relative; everything else (ints, bools, strings) exact."""
  if isinstance(w, float) and isinstance(g, float):
    if math.isnan(w) or math.isnan(g):
      return math.isnan(w) and math.isnan(g)
    return abs(w - g) <= bound * max(abs(w), abs(g))
  if isinstance(w, dict) and isinstance(g, dict):
    return w.keys() == g.keys() and all(_near_value(w[k], g[k], bound) for k in w)
  if isinstance(w, list) and isinstance(g, list):
    return len(w) == len(g) and all(_near_value(x, y, bound) for x, y in zip(w, g))
  return _same(w, g)


def near_differences(want: dict, got: dict, bounds=NEAR_BOUNDS) -> tuple[list[str], dict]:
  """What differs beyond the near bounds, and the largest error of each kind (to read the
  drift against the bounds)."""
  out, worst = [], dict.fromkeys(bounds, 0.0)
  for section in ("sft_params", "rl_state"):
    w, g = want[section], got[section]
    for k in _common_leaves(section, w, g, out):
      a, b = w[k], g[k]
      if (a["shape"], a["dtype"]) != (b["shape"], b["dtype"]):
        out.append(f"{section}{k}: shape/dtype {a['shape']} {a['dtype']} -> {b['shape']} {b['dtype']}")
      elif not a["dtype"].startswith("float"):
        if not _same(a, b):
          out.append(f"{section}{k}: want {a}, got {b} (an integer leaf: exact)")
      else:
        kind = "moments" if "opt_state" in k else "params"
        err = _leaf_errors(a, b)
        worst[kind] = max(worst[kind], err)
        if err > bounds[kind]:
          out.append(f"{section}{k}: relative error {err:.2e} > {bounds[kind]:g} "
                     f"(want sum {a['sum']}, sum_sq {a['sum_sq']}; got {b['sum']}, {b['sum_sq']})")
  wv, gv = want["rl_param_values"], got["rl_param_values"]
  if wv.keys() != gv.keys() or any(len(wv[k]) != len(gv[k]) for k in wv):
    out.append(f"rl_param_values: leaves or lengths differ: {sorted(wv)} / {sorted(gv)}")
  else:
    err = max((abs(a - b) for k in wv for a, b in zip(wv[k], gv[k])), default=0.0)
    worst["values"] = err
    if err > bounds["values"]:
      out.append(f"rl_param_values: largest error {err:.2e} > {bounds['values']:g}")
  wm, gm = _exact_sections(("tokenizer_sha256", "checkpoint_meta", "summary"), want, got, out)
  for i, (w, g) in enumerate(zip(wm, gm)):
    if w.keys() != g.keys():
      out.append(f"metrics line {i}: keys differ: missing {sorted(w.keys() - g.keys())}, "
                 f"new {sorted(g.keys() - w.keys())}")
    for k in sorted(w.keys() & g.keys()):
      a, b = w[k], g[k]
      if isinstance(a, float) and isinstance(b, float) and a != b and max(abs(a), abs(b)) > 0:
        worst["metrics"] = max(worst["metrics"], abs(a - b) / max(abs(a), abs(b)))
      if not _near_value(a, b, bounds["metrics"]):
        out.append(f"metrics line {i} (step {w.get('step')}) {k}: want {a}, got {b}")
  return out, worst


def golden_records() -> dict[str, dict]:
  out = {}
  for path in sorted(glob.glob(os.path.join(GOLDEN_DIR, "one_rl_iteration*.json"))):
    with open(path) as f:
      out[path] = json.load(f)
  return out


def _write_record(path: str, got: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"_about": "tests/test_golden.py pins one RL iteration; regenerate only "
                         "for a change meant to change results (see its docstring).",
               **got}, f, indent=1, sort_keys=True)
    f.write("\n")


def _regenerate(mode: str, got: dict, records: dict[str, dict]) -> None:
  mine = record_path(got["cpu"])
  if mode == "add":
    far = {p: near_differences(w, got)[0] for p, w in records.items()}
    far = {p: d for p, d in far.items() if d}
    if far:
      pytest.fail(f"{REGEN_VAR}=add: this run is not near {sorted(far)} (first: "
                  f"{next(iter(far.values()))[:5]}); a new record for a CPU is added only for "
                  f"code that reproduces the others")
    _write_record(mine, got)
    pytest.fail(f"{REGEN_VAR}=add: wrote {mine} for {got['cpu']}; review and commit it")
  stale = [p for p in records if p != mine]
  for p in stale:
    os.remove(p)
  _write_record(mine, got)
  pytest.fail(f"{REGEN_VAR} is set: wrote {mine}, removed the records of other CPUs "
              f"{stale}; review `git diff tests/golden` and commit it only if this change is "
              f"meant to change results")


def test_one_rl_iteration_matches_the_golden_file(tmp_path):
  """Catches any change in what one RL iteration computes (rollouts, rows, advantages,
  the update, the optimizer, the metrics), and in the SFT stage before it: bit for bit on a
  CPU with a record, within the cross-CPU bounds on another."""
  got = json.loads(json.dumps(run_and_record(tmp_path)))  # compared as the file stores it
  # The run is one that exercises the update: mixed groups and real advantages.
  rl = next(m for m in got["metrics"] if "adv/std" in m)
  assert 0 < rl["rollout/success"] < 1 and rl["rollout/invalid_action_frac"] > 0
  assert rl["adv/std"] > 0 and rl["perf/update_skipped"] == 0.0
  records = golden_records()
  assert records, f"no golden record in {GOLDEN_DIR}"
  if os.environ.get(REGEN_VAR):
    _regenerate(os.environ[REGEN_VAR], got, records)
  note = ""
  if any(w["versions"] != got["versions"] for w in records.values()):
    note = (f"\nNOTE: a record was made with other library versions ({got['versions']} here): "
            f"a library upgrade alone can change the bits.")
  regen = (f"\nIf (and only if) the change is meant to change results, regenerate with "
           f"{REGEN_VAR}=1 (tests/test_golden.py's docstring).")
  same_cpu = [p for p, w in records.items() if w.get("cpu") == got["cpu"]]
  if any(not differences(w, got) for w in records.values()):
    return  # bit for bit (the record of this CPU, or one made before records named a CPU)
  if same_cpu:
    diffs = differences(records[same_cpu[0]], got)
    pytest.fail(f"one RL iteration differs from {same_cpu[0]} (this CPU's record) in "
                f"{len(diffs)} places:\n  " + "\n  ".join(diffs[:40]) + note + regen)
  # No record for this CPU: near every record, or the run changed.
  for path, want in records.items():
    diffs, worst = near_differences(want, got)
    if diffs:
      pytest.fail(f"on this CPU ({got['cpu']}, no record of its own) one RL iteration is "
                  f"not near {path} in {len(diffs)} places (largest errors {worst}, bounds "
                  f"{NEAR_BOUNDS}):\n  " + "\n  ".join(diffs[:40]) + note + regen)
  print(f"no golden record for this CPU {got['cpu']}: near every record (largest errors "
        f"{worst}); {REGEN_VAR}=add adds a bitwise record for it")


# The pair NEAR_BOUNDS was set from, kept apart from the live records (which a change meant
# to change results regenerates): one code (main at 31d6c9c), the same libraries, two CPUs.
DRIFT_PAIR = tuple(os.path.join(GOLDEN_DIR, "cpu_drift", f"{name}.json")
                   for name in ("first_machine", "amd_epyc_avx512"))


def _drift_pair() -> tuple[dict, dict]:
  out = []
  for path in DRIFT_PAIR:
    with open(path) as f:
      out.append(json.load(f))
  return out[0], out[1]


def test_the_records_of_two_cpus_differ_in_bits_and_are_near():
  """The cross-CPU tier against what it was set from: the two records (two CPU models, one
  code, the same libraries) differ bit for bit and are within NEAR_BOUNDS, with every bound
  at least 7.8 times the largest error measured."""
  a, b = _drift_pair()
  assert differences(a, b)
  diffs, worst = near_differences(a, b)
  assert diffs == []
  for kind, bound in NEAR_BOUNDS.items():
    assert 0 < worst[kind] <= bound / 7.8, (kind, worst[kind])


def test_the_cross_cpu_tier_fails_a_changed_run():
  """Catches a near tier that lets a change of what the iteration computes through: a loss
  metric 1% off, one episode's outcome, the optimizer's step count, one RL update's change
  to a parameter leaf scaled by 1.1 (the lm_head sum: the leaf check is coarse), a new
  metric."""
  want = _drift_pair()[0]
  mutations = []

  def mutate(edit):
    got = json.loads(json.dumps(want))
    edit(got)
    mutations.append(near_differences(want, got)[0])

  rl_line = next(i for i, m in enumerate(want["metrics"]) if "adv/std" in m)
  mutate(lambda g: g["metrics"][rl_line].update({"loss/pg_loss": 1.01 * g["metrics"][rl_line]["loss/pg_loss"]}))
  mutate(lambda g: g["summary"]["rl"].update({"eval_sampled/success": 0.5}))
  count = next(k for k in want["rl_state"] if k.endswith("['count']"))
  mutate(lambda g: g["rl_state"][count].update({"sum": g["rl_state"][count]["sum"] + 1}))
  head = "['lm_head']['kernel']['value']"
  change = want["rl_state"]["['params']" + head]["sum"] - want["sft_params"][head]["sum"]
  mutate(lambda g: g["rl_state"]["['params']" + head].update(
      {"sum": want["sft_params"][head]["sum"] + 1.1 * change}))
  mutate(lambda g: g["metrics"][rl_line].update({"loss/new": 0.0}))
  assert [len(d) for d in mutations] == [1] * 5, mutations
