"""Tests of the ScienceWorld adapter against the engine itself (no mocks)."""

import contextlib
import os
import random

import pytest

from environments import make_env
from environments import scienceworld_env as swe

# Short gold paths (5-40 steps) keep the default run quick.
QUICK_TASKS = ("find-non-living-thing", "power-component", "use-thermometer")


@pytest.fixture(scope="module")
def env():
  e = make_env("scienceworld", task=list(QUICK_TASKS) + ["boil"], step_limit=400,
               admissible="full")
  yield e
  e.close()
  assert e._proc is None


@contextlib.contextmanager
def reference_engine():
  """The package's own ScienceWorldEnv, its JVM started with the same hashCode flag."""
  from scienceworld import ScienceWorldEnv  # pylint: disable=g-import-not-at-top
  old = os.environ.get("JAVA_TOOL_OPTIONS")
  os.environ["JAVA_TOOL_OPTIONS"] = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
  try:
    ref = ScienceWorldEnv("", envStepLimit=10_000)
  finally:
    if old is None:
      del os.environ["JAVA_TOOL_OPTIONS"]
    else:
      os.environ["JAVA_TOOL_OPTIONS"] = old
  try:
    yield ref
  finally:
    ref.close()
    ref._gateway.java_process.wait(timeout=10)


def index_of(env, split, task, variation):
  for i in range(env.num_tasks(split)):
    if env.task_variation(split, i) == (task, variation):
      return i
  raise KeyError((split, task, variation))


def run_expert(env, split, index):
  r = env.reset(split, index)
  start_score = r.info.extra["score"]
  total, n, n_invalid = 0.0, 0, 0
  while not r.done:
    a = env.expert_action()
    assert a is not None, f"expert stopped after {n} steps"
    r = env.step(a)
    n_invalid += not r.info.action_valid
    total += r.reward
    n += 1
  # The engine's own gold paths contain a few steps it rejects (mendelian-genetics, melt).
  env.last_expert_invalid_steps = n_invalid
  return r, total, start_score


def test_bad_arguments_fail_with_clear_errors():
  with pytest.raises(ValueError, match="unknown ScienceWorld task 'boiling'"):
    make_env("scienceworld", task="boiling")
  with pytest.raises(ValueError, match="admissible='some'; valid: full, objects, none"):
    make_env("scienceworld", admissible="some")
  with pytest.raises(ValueError, match="step_limit"):
    make_env("scienceworld", step_limit=0)


def test_splits_are_the_engine_variation_folds(env):
  # The engine's folds for boil: 30 variations, 14 train / 7 dev / 9 test, contiguous.
  per_task = {t: env._folds(t) for t in env._tasks}
  assert per_task["boil"] == {"train": tuple(range(0, 14)), "dev": tuple(range(14, 21)),
                              "test": tuple(range(21, 30))}
  for split in ("train", "dev", "test"):
    expected = [(t, v) for t in env._tasks for v in per_task[t][split]]
    assert env.num_tasks(split) == len(expected)
    got = [env.task_variation(split, i) for i in range(env.num_tasks(split))]
    assert got == expected
    assert not set(expected) & {(t, v) for s in ("train", "dev", "test") if s != split
                                for t in env._tasks for v in per_task[t][s]}
  with pytest.raises(IndexError, match="out of range"):
    env.reset("dev", env.num_tasks("dev"))
  with pytest.raises(ValueError, match="unknown split 'valid'"):
    env.reset("valid", 0)
  assert swe._resolve_tasks("all") == swe.all_task_names() and len(swe.all_task_names()) == 30
  assert swe._resolve_tasks("1-1") == ("boil",)


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_expert_wins_a_sample_of_each_split(env, split):
  for task in QUICK_TASKS:
    fold = env._folds(task)[split]
    for variation in (fold[0], fold[-1]):
      r, total, start_score = run_expert(env, split, index_of(env, split, task, variation))
      assert env.last_expert_invalid_steps == 0
      assert r.info.won and not r.info.truncated, (task, variation, r.info.extra)
      assert r.info.extra["score"] == 100
      assert total == pytest.approx(1.0 - start_score / 100, abs=1e-9)
      assert r.info.extra["on_gold_path"] is True
      assert env.expert_action() is None  # episode over


def test_observations_match_the_engine(env):
  """Same actions in the package's own wrapper give the same text, score and valid list."""
  split, index = "train", index_of(env, "train", "boil", 3)
  task, variation = env.task_variation(split, index)
  r = env.reset(split, index)
  rng = random.Random(0)
  with reference_engine() as ref:
    ref.load(task, variation, "easy")
    obs, info = ref.reset()
    assert r.observation == obs
    assert r.info.task == ref.get_task_description()
    assert set(r.info.admissible_actions) == set(info["valid"])
    assert r.info.anchor.startswith(info["look"])
    for t in range(25):
      a = (rng.choice(r.info.admissible_actions) if t % 3 else
           rng.choice(["jump over the moon", "open", "go to kitchen", "0"]))
      r = env.step(a)
      obs, reward, done, info = ref.step(a)
      assert r.observation == obs, (t, a)
      assert r.info.extra["score"] == info["score"]
      assert r.reward == pytest.approx(reward / 100, abs=1e-12)
      assert r.info.extra["moves"] == info["moves"]
      if not r.info.extra["awaiting_choice"]:
        assert set(r.info.admissible_actions) == set(info["valid"])
      assert r.info.anchor.startswith(info["look"] + "\n" + info["inv"])
      if r.done:
        break


def test_invalid_and_random_text_is_reported_not_raised(env):
  r0 = env.reset("test", 0)
  rng = random.Random(1)
  junk = ["", "xyzzy", "take", "open", "\n", "look around\nlook around", "ünïcödé ✓",
          "a" * 5000, "move to to to", "0"]
  junk += ["".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(1, 30)))
           for _ in range(10)]
  for a in junk:
    moves = env._server.getNumMoves()
    r = env.step(a)
    assert isinstance(r.observation, str)
    if r.observation.startswith("No known action matches that input."):
      assert not r.info.action_valid
      assert r.info.oracle_label == 0.0 and r.reward == 0.0
      assert env._server.getNumMoves() == moves
    if r.done:
      break
  # Only no-ops so far: the state is as at reset and the expert is still on its path.
  assert r.info.anchor == r0.info.anchor
  assert env.expert_action() == env.gold_path()[0]


def test_reset_is_deterministic(env):
  index = index_of(env, "dev", "boil", 15)
  first = env.reset("dev", index)
  acts = [random.Random(2).choice(first.info.admissible_actions)]
  obs1 = [env.step(acts[0]).observation]
  again = env.reset("dev", index)
  assert again == first
  assert [env.step(acts[0]).observation] == obs1
  # A fresh JVM gives the same initial state and the same gold path.
  with make_env("scienceworld", task="boil", admissible="full") as other:
    other_first = other.reset("dev", index_of(other, "dev", "boil", 15))
    assert other_first == first
    env.reset("dev", index)
    assert other.gold_path() == env.gold_path()


def test_ambiguous_actions_follow_the_engine_protocol(env):
  env.reset("train", index_of(env, "train", "boil", 0))
  env.step("go to kitchen")
  r = env.step("focus on door")
  assert r.observation.startswith("Ambiguous request:")
  assert r.info.action_valid and r.info.extra["awaiting_choice"]
  choices = [l.split(":")[0] for l in r.observation.splitlines()[1:] if l.strip()]
  assert len(choices) >= 2 and r.info.admissible_actions == tuple(choices)
  # Anything but a number answers the prompt with "Unknown action." and uses up a move.
  moves = r.info.extra["moves"]
  r = env.step("go to hallway")
  assert r.observation.startswith("Unknown action.") and not r.info.action_valid
  assert r.info.extra["moves"] == moves + 1 and not r.info.extra["awaiting_choice"]
  r = env.step("focus on door")
  r = env.step("0")
  assert r.info.action_valid and not r.info.extra["awaiting_choice"]
  # Focusing on a door ends the boil task as failed: negative score, done, not won.
  assert r.done and not r.info.won and r.reward < 0 and r.info.oracle_label == r.reward


def test_step_limit_truncates(env):
  with make_env("scienceworld", task="boil", step_limit=3, admissible="none") as e:
    e.reset("train", 0)
    rs = [e.step("look around") for _ in range(3)]
    assert [r.done for r in rs] == [False, False, True]
    assert rs[-1].info.truncated and not rs[-1].info.won
    with pytest.raises(RuntimeError, match="after the episode ended"):
      e.step("look around")


def test_admissible_modes_and_lazy_gold_path(env):
  index = index_of(env, "train", "use-thermometer", 0)
  env.reset("train", index)
  gold = env.gold_path()
  with make_env("scienceworld", task=list(QUICK_TASKS) + ["boil"], admissible="none") as e:
    r = e.reset("train", index)
    assert r.info.admissible_actions == () and e._gold is None
    # Three gold steps before the gold path exists, then the lazy reload-and-replay.
    for a in gold[:3]:
      r = e.step(a)
    assert r.info.extra["on_gold_path"] is None
    assert e.expert_action() == gold[3]
    assert e._server.freeActionLook() == r.info.anchor.split("\nIn your inventory")[0]
    r = e.step(gold[3])
    assert r.info.extra["on_gold_path"] is True
    e.step("look around")  # a valid action off the gold path
    assert e.expert_action() is None
    full = e.valid_actions()
    assert len(full) > 50
  with make_env("scienceworld", task="use-thermometer", admissible="objects") as e:
    r = e.reset("train", 0)
    help_text = e._server.step("help")  # what the engine prints for "help" / "objects"
    objects_text = e._server.step("objects")
    assert r.info.admissible_actions == tuple(
        l.strip() for l in help_text.splitlines()[1:] if l.strip())
    assert r.info.extra["objects"] == tuple(
        l.strip() for l in objects_text.splitlines()[1:] if l.strip())


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_expert_wins_every_task_of_each_split(split):
  failures = []
  with make_env("scienceworld", task="all", step_limit=1000, admissible="none") as e:
    for task in swe.all_task_names():
      fold = e._folds(task)[split]
      idx = index_of(e, split, task, fold[len(fold) // 2])
      r, _, _ = run_expert(e, split, idx)
      if not r.info.won:
        failures.append((task, e.task_variation(split, idx), r.info.extra["score"],
                         e.last_expert_invalid_steps))
  assert not failures


def test_closing_after_the_engine_died_leaves_no_proxy_reaching_for_it(caplog):
  # A Java proxy collected after its JVM died must not try to connect: py4j would log a
  # traceback from inside the garbage collector, wherever it runs.
  import gc  # pylint: disable=g-import-not-at-top
  import logging  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  from py4j.protocol import Py4JNetworkError  # pylint: disable=g-import-not-at-top
  e = make_env("scienceworld", task=[QUICK_TASKS[0]], step_limit=50)
  proxy = e._gateway.jvm.java.util.ArrayList()
  os.kill(e._proc.pid, signal.SIGKILL)
  e._proc.wait(timeout=10)
  with pytest.raises(Py4JNetworkError):  # the call that finds the engine gone (a step's)
    proxy.size()
  e.close()
  caplog.set_level("DEBUG", logger="py4j")
  caplog.clear()
  del proxy
  gc.collect()
  # What the live engines of other tests log (commands, at DEBUG) is no harm: a traceback is.
  assert [r.getMessage() for r in caplog.records
          if r.name.startswith("py4j") and (r.exc_info or r.levelno >= logging.WARNING)] == []
