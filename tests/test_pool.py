"""Tests for EnvPool: batched results equal a sequential loop; faults stay in their slot."""

import functools
import os
import signal

import pytest

from environments import make_env
from environments.faulty import EXIT, HANG, RAISE
from environments.pool import EnvPool

TWX = {"game": "cookingworld", "step_limit": 40}
FAULTY = {"inner": "twx", "inner_kwargs": TWX, "hang_s": 30.0}
TASKS = (("train", 3), ("dev", 5), ("test", 1))


@functools.lru_cache(maxsize=None)
def _reference_runs(tasks, num_steps):
  """Plays the expert for `num_steps` steps on each task with one plain env, sequentially."""
  env = make_env("twx", **TWX)
  try:
    runs = []
    for split, index in tasks:
      results, actions = [env.reset(split, index)], []
      for _ in range(num_steps):
        actions.append(env.expert_action())
        results.append(env.step(actions[-1]))
      runs.append((results, actions))
    return runs
  finally:
    env.close()


def _check_batch_survives_fault(pool, fault_slot, inject):
  """Plays TASKS in slots [2, 0, 1] (out of order); `inject` breaks `fault_slot` at step 3."""
  slots = [2, 0, 1]
  ref = _reference_runs(TASKS, 6)
  assert pool.reset(slots, TASKS) == [r[0][0] for r in ref]
  for t in range(6):
    actions = [r[1][t] for r in ref]
    if t == 3:
      inject(slots.index(fault_slot), actions)
    results = pool.step(slots, actions)
    for i, slot in enumerate(slots):
      if slot == fault_slot and t >= 3:
        assert results[i].done and results[i].info.truncated, results[i]
        assert results[i].info.error and f"slot {fault_slot}" in results[i].info.error
        assert results[i].info.task == ref[i][0][0].info.task
      else:
        assert results[i] == ref[i][0][t + 1]
  assert pool.num_restarts == 1
  # The broken slot is fresh again after a reset and replays its task exactly.
  i = slots.index(fault_slot)
  assert pool.reset([fault_slot], [TASKS[i]]) == [ref[i][0][0]]
  for t in range(6):
    assert pool.step([fault_slot], [ref[i][1][t]]) == [ref[i][0][t + 1]]
  return results


def test_batched_results_equal_a_sequential_loop():
  ref = _reference_runs(TASKS, 5)
  with EnvPool("twx", TWX, 3) as pool:
    assert pool.num_envs == 3
    slots = [1, 2, 0]
    assert pool.reset(slots, TASKS) == [r[0][0] for r in ref]
    for t in range(5):
      assert pool.expert_action(slots) == [r[1][t] for r in ref]
      assert pool.step(slots, [r[1][t] for r in ref]) == [r[0][t + 1] for r in ref]
    # A subset of slots steps alone.
    assert pool.step([2], ["inventory"])[0].info.action_valid
    assert pool.num_restarts == 0


def test_thread_backend_survives_an_exception():
  with EnvPool("faulty", FAULTY, 3) as pool:
    results = _check_batch_survives_fault(pool, 0, lambda i, acts: acts.__setitem__(i, RAISE))
    assert "injected fault" in results[1].info.error


def test_thread_backend_survives_a_hang():
  with EnvPool("faulty", FAULTY, 3, step_timeout_s=3.0) as pool:
    _check_batch_survives_fault(pool, 1, lambda i, acts: acts.__setitem__(i, HANG))


def test_thread_backend_survives_a_killed_jvm():
  with EnvPool("faulty", FAULTY, 3) as pool:
    def kill_jvm(i, actions):
      os.kill(pool._workers[2].env.inner.engine_pid, signal.SIGKILL)  # pylint: disable=protected-access
    _check_batch_survives_fault(pool, 2, kill_jvm)


def test_process_backend_survives_a_killed_worker():
  with EnvPool("faulty", FAULTY, 3, backend="process") as pool:
    pids = {}
    def kill_worker(i, actions):
      pids["old"] = pool.worker_pid(0)
      os.kill(pids["old"], signal.SIGKILL)
    results = _check_batch_survives_fault(pool, 0, kill_worker)
    assert "died" in results[1].info.error
    assert pool.worker_pid(0) not in (None, pids["old"])


def test_process_backend_survives_a_worker_exit_then_an_exception():
  """The slow test's two faults, fast: one pool of two workers, a few steps."""
  ref = _reference_runs(TASKS, 6)[:2]
  first = [r[0][0] for r in ref]
  with EnvPool("faulty", FAULTY, 2, backend="process") as pool:
    assert pool.reset([0, 1], TASKS[:2]) == first
    out = pool.step([0, 1], [EXIT, ref[1][1][0]])
    assert out[0].done and out[0].info.truncated and out[0].info.task == first[0].info.task
    assert out[0].info.error.startswith("slot 0: step failed: worker process died (exit code 3)")
    assert out[1] == ref[1][0][1]
    out = pool.step([0, 1], [ref[0][1][0], RAISE])
    assert out[0].done and out[0].info.error.startswith("slot 0: step failed")  # until reset
    assert out[1].done and out[1].info.error.startswith("slot 1: step failed")
    assert "injected fault" in out[1].info.error
    assert pool.num_restarts == 2
    # Fresh workers after a reset replay both tasks exactly.
    assert pool.reset([0, 1], TASKS[:2]) == first
    for t in range(2):
      assert pool.step([0, 1], [r[1][t] for r in ref]) == [r[0][t + 1] for r in ref]


@pytest.mark.slow
def test_process_backend_survives_a_worker_exit_and_an_exception():
  with EnvPool("faulty", FAULTY, 3, backend="process") as pool:
    _check_batch_survives_fault(pool, 2, lambda i, acts: acts.__setitem__(i, EXIT))
  with EnvPool("faulty", FAULTY, 3, backend="process") as pool:
    _check_batch_survives_fault(pool, 1, lambda i, acts: acts.__setitem__(i, RAISE))


def test_step_before_reset_and_bad_arguments():
  with EnvPool("twx", TWX, 2) as pool:
    r = pool.step([0], ["look around"])[0]  # the env raises "step() before reset()"
    assert r.done and r.info.truncated and "before reset" in r.info.error
    with pytest.raises(ValueError, match="distinct"):
      pool.step([1, 1], ["a", "b"])
    with pytest.raises(ValueError, match="2 slots but 1 actions"):
      pool.step([0, 1], ["a"])
    with pytest.raises(IndexError, match="out of range"):
      pool.reset([2], [("train", 0)])
  with pytest.raises(KeyError, match="unknown environment"):
    EnvPool("nope", {}, 1)
  with pytest.raises(ValueError, match="unknown backend"):
    EnvPool("twx", TWX, 1, backend="fibers")
