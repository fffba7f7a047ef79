"""Tests for the TextWorldExpress adapter against the raw `textworld_express` engine."""

import random

import pytest

from environments import make_env
from environments.twx_env import DEFAULT_GAME_PARAMS, GAMES, progress_label

SPLITS = ("train", "dev", "test")


@pytest.fixture(scope="module")
def envs():
  made = {g: make_env("twx", game=g) for g in GAMES}
  yield made
  for env in made.values():
    env.close()


def _raw_engine(game):
  from textworld_express import TextWorldExpressEnv
  raw = TextWorldExpressEnv(envStepLimit=10**9)
  raw.load(game, DEFAULT_GAME_PARAMS[game])
  return raw


def _close_raw(raw):
  raw.close()
  raw.close = lambda: None  # The wrapper's __del__ would close again and print noise.


@pytest.mark.parametrize("game", GAMES)
def test_expert_wins_a_sample_of_each_split(envs, game):
  env = envs[game]
  for split in SPLITS:
    assert env.num_tasks(split) == 1000
    for index in (0, 7, 500):
      r = env.reset(split, index)
      steps = 0
      while not r.done:
        action = env.expert_action()
        assert action is not None, (split, index, steps)
        r = env.step(action)
        steps += 1
      assert r.info.won and not r.info.truncated, (split, index, r.observation)
      assert env.expert_action() is None


@pytest.mark.parametrize("game", GAMES)
def test_random_and_garbage_actions_never_crash(envs, game):
  env = envs[game]
  rng = random.Random(1)
  garbage = ["", " ", "\n", "LOOK AROUND", "take the moon", "é\"'{}\\;", "x" * 3000, "go\tnorth"]
  for index in range(3):
    r = env.reset("train", index)
    while not r.done:
      if rng.random() < 0.5:
        action = rng.choice(garbage)
        before = r
        r = env.step(action)
        assert not r.info.action_valid, action
        assert r.reward == 0.0 and r.info.oracle_label == 0.0
        assert r.info.extra["score"] == before.info.extra["score"]
      else:
        action = rng.choice(r.info.admissible_actions)
        r = env.step(action)
        assert r.info.action_valid, action
      assert isinstance(r.observation, str)
      assert r.info.admissible_actions == tuple(sorted(r.info.admissible_actions))
      assert r.info.oracle_label in (-1.0, 0.0, 1.0)


def test_resets_are_deterministic_across_env_objects():
  a = make_env("twx", game="cookingworld")
  b = make_env("twx", game="cookingworld")
  try:
    for split in SPLITS:
      for index in (0, 3):
        ra, rb = a.reset(split, index), b.reset(split, index)
        assert ra == rb
        assert a.gold_path == b.gold_path
        for action in a.gold_path[:4]:
          assert a.step(action) == b.step(action)
    tasks = set()
    for index in range(5):
      r = a.reset("train", index)
      tasks.add((r.observation, a.gold_path))
    assert len(tasks) == 5  # different indices are different tasks
    assert a.seed_of("dev", 0) != a.seed_of("train", 0)
  finally:
    a.close()
    b.close()


@pytest.mark.parametrize("game", GAMES)
def test_observations_match_the_raw_engine(envs, game):
  """Same seed and actions into the raw engine: same text, actions, score, success."""
  env = envs[game]
  raw = _raw_engine(game)
  try:
    seeds = {"train": raw.getValidSeedsTrain(), "dev": raw.getValidSeedsDev()}
    # The adapter reads each fold's seeds in one call (their string); the package's own
    # element-by-element copy is the reference (catches a misparsed or unsorted list).
    test_fold = raw.getValidSeedsTest()
    for split, want in (*seeds.items(), ("test", test_fold)):
      assert [env.seed_of(split, i) for i in range(env.num_tasks(split))] == sorted(want)
    rng = random.Random(7)
    for split, index in (("train", 4), ("dev", 9)):
      r = env.reset(split, index)
      obs, infos = raw.reset(seed=sorted(seeds[split])[index], gameFold=split)
      assert r.observation == obs
      assert r.info.task == infos["taskDescription"]
      assert set(r.info.admissible_actions) == set(infos["validActions"])
      prev_score = infos["score"]
      for _ in range(12):
        if r.done:
          break
        action = rng.choice(list(r.info.admissible_actions) + ["dance wildly"])
        r = env.step(action)
        obs, _, _, infos = raw.step(action)
        assert r.observation == obs
        assert set(r.info.admissible_actions) == set(infos["validActions"])
        assert r.reward == pytest.approx(infos["score"] - prev_score, abs=1e-12)
        assert r.info.won == infos["tasksuccess"]
        assert r.done == (infos["tasksuccess"] or infos["taskfailure"])
        assert r.info.action_valid == (action != "dance wildly")
        prev_score = infos["score"]
  finally:
    _close_raw(raw)


def test_step_limit_truncates():
  env = make_env("twx", game="coin", step_limit=3)
  try:
    r = env.reset("train", 0)
    for t in range(3):
      assert not r.done
      r = env.step("inventory")
    assert r.done and r.info.truncated and not r.info.won
    with pytest.raises(RuntimeError, match="after the episode ended"):
      env.step("inventory")
  finally:
    env.close()


def test_oracle_label_follows_the_engine_score(envs):
  # simonsays: every gold step scores; any other action fails the game.
  env = envs["simonsays"]
  env.reset("test", 3)
  labels = [env.step(a).info.oracle_label for a in env.gold_path]
  assert labels == [1.0] * len(labels)
  r = env.reset("test", 3)
  wrong = next(a for a in r.info.admissible_actions if a != env.expert_action())
  r = env.step(wrong)
  assert r.done and not r.info.won and r.info.oracle_label == -1.0
  assert env.expert_action() is None and not r.info.extra["on_gold_path"]
  # Reference: the label is the sign of the score change, failure counting as a decrease.
  assert progress_label(0.25, 0.5, False) == 1.0
  assert progress_label(0.5, 0.25, False) == -1.0
  assert progress_label(0.5, 0.5, True) == -1.0
  assert progress_label(0.5, 0.5, False) == 0.0


def test_bad_arguments_have_clear_errors(envs):
  with pytest.raises(ValueError, match="unknown TextWorldExpress game"):
    make_env("twx", game="zork")
  with pytest.raises(ValueError, match="bad game_params"):
    make_env("twx", game="coin", game_params="numLocations=99")
  with pytest.raises(ValueError, match="unknown split"):
    envs["coin"].reset("validation", 0)
  with pytest.raises(IndexError, match="out of range"):
    envs["coin"].reset("train", 1000)


def test_state_anchor_tells_rooms_apart(envs):
  """GiGPO's anchor is the state (room, inventory, score), not the observation text:
  "Unknown action" and the inventory read alike in every room."""
  env = envs["coin"]
  r0 = env.reset("train", 0)
  assert r0.observation.startswith("You are in the kitchen.")
  kitchen = [r0] + [env.step(a) for a in ("dance", "inventory", "look around")]
  pantry = [env.step("move north")] + [env.step(a) for a in ("dance", "inventory")]
  assert pantry[0].observation.startswith("You are in the pantry.")
  # Same text, different rooms: the faithful anchor would merge these.
  assert kitchen[1].observation == pantry[1].observation
  assert kitchen[2].observation == pantry[2].observation
  assert len({r.info.anchor for r in kitchen}) == 1
  assert len({r.info.anchor for r in pantry}) == 1
  assert kitchen[0].info.anchor != pantry[0].info.anchor
  # Progress is part of the state: taking an item changes inventory and score.
  r = env.reset("train", 0)
  anchors = [r.info.anchor]
  for a in env.gold_path:
    anchors.append(env.step(a).info.anchor)
  assert anchors[-1] != anchors[-2]


def test_state_anchor_without_a_room_follows_progress(envs):
  # simonsays has no room description: its state is how many instructions were obeyed
  # (the score), whatever the last observation said.
  env = envs["simonsays"]
  r = env.reset("train", 2)
  assert r.info.extra["look"] == ""
  assert env.step("dance").info.anchor == r.info.anchor
  r = env.reset("train", 2)
  anchors = [r.info.anchor] + [env.step(a).info.anchor for a in env.gold_path]
  assert len(set(anchors)) == len(anchors)


def test_the_jvm_gets_its_own_session_without_python_in_the_forked_child(monkeypatch):
  """py4j's own way (preexec_fn=os.setpgrp) runs Python between fork and exec, which hung an
  env-pool thread here when another thread held a lock at fork time (environments/jvm.py)."""
  import os

  from py4j import java_gateway
  popen_kwargs, real_popen = [], java_gateway.Popen

  def spy(*args, **kwargs):
    popen_kwargs.append(kwargs)
    return real_popen(*args, **kwargs)

  monkeypatch.setattr(java_gateway, "Popen", spy)
  env = make_env("twx", game="coin", step_limit=5)
  try:
    pid = env._env._gateway.java_process.pid
    assert os.getsid(pid) == pid != os.getsid(0)  # a session (and process group) of its own
    assert env.reset("train", 0).observation
  finally:
    env.close()
  assert len(popen_kwargs) == 1
  assert "preexec_fn" not in popen_kwargs[0] and popen_kwargs[0]["start_new_session"]


def test_extra_java_options_reach_the_engine_jvm(monkeypatch):
  """Catches CSA_JAX_TWX_JAVA_OPTS not reaching the JVM, replacing the package's own
  options, or the JVM left in the terminal's process group (where Ctrl-C would kill it)."""
  import os  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("CSA_JAX_TWX_JAVA_OPTS", "-Dcsa_jax_probe=1 -XX:+UseSerialGC")
  env = make_env("twx", game="coin", step_limit=4)
  try:
    proc = env._env._gateway.java_process
    with open(f"/proc/{proc.pid}/cmdline") as f:
      argv = f.read().split("\0")
    assert "-Dcsa_jax_probe=1" in argv and "-XX:+UseSerialGC" in argv, argv
    assert "-Xverify:none" in argv, argv  # the package's option is kept
    assert os.getpgid(proc.pid) != os.getpgrp()
    assert env.reset("train", 0).observation
  finally:
    env.close()
