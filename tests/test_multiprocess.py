"""The trainer across several processes, with JAX's own multi-process runtime on this CPU.

`python -m csa_jax.distributed.multiprocess_local --processes 2 --devices 4 -- <launch.py args>` runs
two `launch.py` processes (4 simulated CPU devices each) that form one 8-device mesh, 4x2,
as two hosts of a pod slice would: a tiny quickstart (SFT, 2 RL iterations, held-out
evaluation, checkpoints). The same run on one process with 8 devices is the independent
path it is compared with; a third run is killed (both processes, SIGKILL) after its first
RL checkpoint and resumed. All runs share a JAX compilation cache and the session's
demonstrations (tests/tiny_runs.py).
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from csa_jax import perf
from csa_jax.rollout import metrics as M
from csa_jax.run.checkpoint import Checkpointer
from tests import tiny_runs
from tests import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shared tiny TWX run (tests/tiny_runs.py) with 2 environments a process, greedy
# held-out evaluation only, and the SFT start of the other RL-loop tests (30 epochs).
TINY = [*tiny_runs.TWX_TINY, "sft.epochs=30", "rollout.num_envs=4", "eval.num_episodes=4",
        "eval.greedy=true", "eval.sampled=false", "rl_iterations=2"]


def test_distributed_primitives_across_two_processes():
  """csa_jax/distributed/processes.py's shares and reductions in a real 2-process runtime
  (tests/multiprocess_probe.py), against values computed here; and the helper's rank
  prefixes and worst exit code."""
  out = subprocess.run(
      [sys.executable, "-m", "csa_jax.distributed.multiprocess_local", "--processes", "2",
       "--devices", "4", "--script", "tests/multiprocess_probe.py", "--", "--fail"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)  # (it sets the device count)
  assert out.returncode == 4, out.stderr[-3000:]  # the worst of 3 and 4
  got = {}
  for line in out.stdout.splitlines():
    rank, _, text = line.partition("] ")
    if text.startswith("{"):
      got[int(rank.lstrip("["))] = json.loads(text)
  assert sorted(got) == [0, 1], out.stdout
  a, b = got[0], got[1]
  assert [a["rank"], b["rank"], a["count"], b["count"]] == [0, 1, 2, 2]
  assert (a["writer"], b["writer"]) == (True, False)
  assert (a["share"], b["share"]) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9])  # 3 + 2 units
  assert (a["share_count"], b["share_count"]) == (3, 2)
  assert a["gathered"] == b["gathered"] == a["mine"] + b["mine"]  # float64, exact
  assert a["sum"] == b["sum"] == [1.5 + 2.5, 2.0**41 + 1]
  # Episode metrics from the sums: every episode of both processes counted once.
  eps = [(((i + k) % 2 == 0), 2 + i + k, k) for k in (0, 1) for i in range(2 + k)]
  steps = sum(n for _, n, _ in eps)
  want = {"x/success": sum(w for w, _, _ in eps) / len(eps),
          "x/episode_len": steps / len(eps), "x/episodes": float(len(eps)),
          "x/env_steps": float(steps),
          "x/invalid_action_frac": sum(min(k, n) for _, n, k in eps) / steps,
          "x/errors": 0.0,
          "x/actions_dropped": sum(sum(t % 2 for t in range(n)) for _, n, _ in eps) / steps}
  assert a["episodes"] == b["episodes"] == want
  # A whole batch every process holds, and process-local rows: one global array each.
  assert a["whole_sum"] == b["whole_sum"] == np.arange(24).reshape(8, 3).sum(0).tolist()
  assert a["local_sum"] == b["local_sum"] == 4 * 3 * 1 + 4 * 3 * 2
  # 5 and 12 rows, 4 per process per batch of 8: both pad to 3 batches.
  assert (a["rows"], b["rows"], a["local_bs"], b["local_bs"]) == (12, 12, 4, 4)
  assert len(a["sampler_devices"]) == len(b["sampler_devices"]) == 4
  assert not set(a["sampler_devices"]) & set(b["sampler_devices"])
  assert a["stop"] == b["stop"] == 15  # one process's signal stops both


@pytest.mark.parametrize("sets, needle", [
    (["--mesh", "1x8"], "the 'model' axis spans several hosts"),
    (["--mesh", "4x2", "--set", "algo.method=istar"],
     "algo.method istar runs on one process only"),
], ids=["model-axis-across-hosts", "aux-method"])
def test_what_two_processes_cannot_run_is_refused_in_one_line(tmp_path, sets, needle):
  work = tmp_path / "w"
  out = subprocess.run(
      [sys.executable, "-m", "csa_jax.distributed.multiprocess_local", "--processes", "2",
       "--devices", "4", "--", "--exp", "quickstart_coin", "--workdir", str(work), "--set", "sft.num_demos=4",
       "--set", "env.kwargs.step_limit=4", "--set", "rollout.num_envs=2", *sets],
      cwd=ROOT, capture_output=True, text=True, timeout=300)  # (it sets the device count)
  assert out.returncode == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr
  for rank in (0, 1):
    lines = [l for l in out.stderr.splitlines() if l.startswith(f"[{rank}] launch.py: error: ")]
    assert len(lines) == 1 and needle in lines[0], out.stderr[-3000:]
  assert not work.exists()


class Runs:
  def __init__(self, root):
    self.root = root
    self.env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

  def args(self, workdir, *sets, resume=False):
    out = ["--exp", "twx_coin_csa", "--mesh", "4x2", "--workdir", str(workdir)]
    for s in [*TINY, f"sft.demos_dir={tiny_runs.demos_dir()}", *sets]:  # the session's
      out += ["--set", s]
    return out + (["--resume"] if resume else [])

  def two(self, workdir, *sets, resume=False) -> list[str]:
    return [sys.executable, "-m", "csa_jax.distributed.multiprocess_local", "--processes", "2",
            "--devices", "4", "--", *self.args(workdir, *sets, resume=resume)]

  def one(self, workdir, *sets, resume=False) -> list[str]:
    return [sys.executable, "launch.py", *self.args(workdir, *sets, resume=resume)]

  def run(self, cmd, devices=None):
    env = xla_env.env_with_devices(devices, self.env) if devices else self.env
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  runs = Runs(tmp_path_factory.mktemp("multiprocess"))
  runs.two_dir, runs.one_dir = runs.root / "two", runs.root / "one"
  t0 = time.monotonic()
  runs.two_out = runs.run(runs.two(runs.two_dir))
  print(f"2 processes x 4 devices: {time.monotonic() - t0:.0f} s")
  assert runs.two_out.returncode == 0, runs.two_out.stderr[-4000:]
  return runs


def _metrics(workdir):
  return M.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def _state(workdir, sub="checkpoints"):
  ckpt = Checkpointer(os.path.join(workdir, sub))
  tree, meta = ckpt.read()
  ckpt.close()
  return tree, meta


# The trainer's runs across two processes are slow (their shared run 1.5-2.5 min, the kill
# and resume 2-2.5 min more): `make test-slow` runs them. The default suite keeps the
# primitives across two processes and the one-line refusals.
@pytest.mark.slow
def test_two_processes_sft_rl_eval_checkpoint(runs):
  work, out = runs.two_dir, runs.two_out
  # Both processes ran the program: each printed the (global) held-out table.
  for rank in (0, 1):
    assert f"[{rank}] | SFT + RL " in out.stdout, out.stdout[-3000:]
  # Process 0 alone wrote the metrics: one line per record, not two.
  recs = [r for r in _metrics(work) if "sft/batch" not in r]  # less the SFT loss curve
  assert [r["step"] for r in recs] == [0, 0, 1, 2, 2], [r["step"] for r in recs]
  assert len(os.listdir(work / "tb")) == 1
  assert sorted(p for p in os.listdir(work) if not p.startswith(".")) == [
      "checkpoints", "config.json", "eval", "learning_curve.png", "metrics.jsonl", "sft", "tb",
      "tokenizer.json"]
  # The per-episode outcomes, written once (by process 0) for both processes' episodes.
  episodes = M.read_jsonl(str(work / M.EPISODES_FILE))
  assert sorted({(r["step"], r["policy"]) for r in episodes}) == [(0, "eval"), (2, "eval")]
  for key in {(r["step"], r["policy"]) for r in episodes}:  # every process's share gathered
    assert sorted(r["index"] for r in episodes if (r["step"], r["policy"]) == key) == [0, 1, 2, 3]
  rl = [r for r in recs if "rollout/success" in r]
  total = 0
  for r in rl:
    # Each process played its own group (3 episodes) and counted its own steps; the
    # record holds the sum over both.
    mine = [r["rollout/env_steps_process0"], r["rollout/env_steps_process1"]]
    assert min(mine) > 0
    assert r["rollout/env_steps"] == sum(mine)
    assert r["rollout/episodes"] == 2 * 3
    total += sum(mine)
    assert r["perf/env_steps_total"] == total
  evals = [r for r in recs if "eval/success" in r]
  assert [e["eval/episodes"] for e in evals] == [4, 4]  # split 2 + 2, then summed
  _, meta = _state(work)
  assert meta["phase"] == "done" and meta["iteration"] == 2
  assert meta["processes"] == 2 and meta["env_steps"] == total
  assert len(meta["rollout_keys"]) == 2 and meta["rollout_keys"][0] != meta["rollout_keys"][1]


@pytest.mark.slow
def test_one_process_8_devices_gives_the_same_held_out_success(runs):
  """The same run on one process (its own code path: one sampler over the whole mesh, one
  evaluation of all 4 episodes) and on 2 x 4. SFT sees the same batches in both, so its
  held-out evaluation must agree metric for metric. The RL iterations cannot repeat each
  other (each process samples its own waves with its own key stream: other episodes, other
  updates), so after RL only the task set is common; both results are printed."""
  out = runs.run(runs.one(runs.one_dir), devices=8)
  assert out.returncode == 0, out.stderr[-4000:]
  one, two = _metrics(runs.one_dir), _metrics(runs.two_dir)
  evals = lambda recs: [{k: v for k, v in r.items() if k.startswith("eval/")}
                        for r in recs if "eval/success" in r]
  (sft_one, rl_one), (sft_two, rl_two) = evals(one), evals(two)
  assert sft_one == sft_two  # every eval/ metric of the SFT policy
  assert rl_one["eval/episodes"] == rl_two["eval/episodes"] == 4
  print(f"held-out success after RL: {rl_one['eval/success']} on 1 process, "
        f"{rl_two['eval/success']} on 2")
  # The SFT parameters agree to float32 rounding (two processes add the data-parallel
  # gradients in another order): relative L2 distance 1.3e-6 and 1.5e-6 in two runs.
  (a, _), (b, _) = _state(runs.one_dir, "sft"), _state(runs.two_dir, "sft")
  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(a)]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(b)]
  assert len(la) == len(lb) > 0
  dist = np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(la, lb)))
  assert dist / np.sqrt(sum((x ** 2).sum() for x in la)) < 1e-5


@pytest.mark.slow
def test_both_processes_killed_after_a_checkpoint_resume_bitwise(runs):
  work = runs.root / "killed"
  sets = [f"sft.init_from={runs.two_dir}"]
  proc = subprocess.Popen(runs.two(work, *sets), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=runs.env)
  first = work / "checkpoints" / "1"
  t0 = time.monotonic()
  while not first.exists():
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.monotonic() - t0 < 600, "no first RL checkpoint"
    time.sleep(0.05)
  children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                            text=True).stdout.split()
  assert len(children) == 2
  for pid in children:
    os.kill(int(pid), signal.SIGKILL)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGKILL, err[-2000:]
  assert not (work / "checkpoints" / "2").exists()

  # Another process count is refused with one line naming both counts.
  out = runs.run(runs.one(work, *sets, resume=True), devices=8)
  assert out.returncode == 2, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("launch.py: error: --resume: the checkpoint in "), last
  assert "written by 2 process(es) and this run has 1; resume with 2" in last, last

  out = runs.run(runs.two(work, *sets, resume=True))
  assert out.returncode == 0, out.stderr[-4000:]
  assert "[0] resumed from" in out.stdout and "[1] resumed from" in out.stdout
  # The resumed run ends where the uninterrupted one (same SFT parameters) ended.
  got, got_meta = _state(work)
  want, want_meta = _state(runs.two_dir)
  for k in ("phase", "iteration", "env_steps", "rollout_keys", "np_rng"):
    assert got_meta[k] == want_meta[k], k
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  strip = lambda recs: [{k: v for k, v in r.items() if not perf.is_wall_clock(k)}
                        for r in recs if r["step"] > 0]
  assert strip(_metrics(work)) == strip(_metrics(runs.two_dir))
  assert json.loads((work / "config.json").read_text())["rollout"]["group_size"] == 3
