"""Tests for the ALFWorld environment (environments/alfworld_env.py, alfworld_gen.py).

Games are generated into a temporary cache (a few seconds each: the planner checks them).
The reference for observations is the official engine stack run in a separate process, so
that the grammar-parse cache this module installs cannot touch it.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from environments import make_env
from environments import alfworld_env
from environments import alfworld_gen as gen

SPLITS = ("train", "eval_seen", "eval_unseen")

# One task per split, four task types: simple, look_at_obj_in_light, clean, heat.
SAMPLE = (("train", 0), ("train", 1), ("eval_seen", 2), ("eval_unseen", 3))
# And cool and pick_two (index % 6 is the type): each of the six task types once.
# test_all_six_task_types_expert_wins (slow) plays all six on every split.
ALL_TYPES = SAMPLE + (("train", 4), ("train", 5))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("alfworld_cache"))


@pytest.fixture(scope="module")
def env(cache_dir):
  e = make_env("alfworld", source="generated", num_train=6, num_eval=6, seed=0, cache_dir=cache_dir)
  yield e
  e.close()


def play_expert(env, split, index):
  r = env.reset(split, index)
  plan_len = r.info.extra["plan_len"]
  results = [r]
  while not r.done:
    a = env.expert_action()
    assert a in r.info.admissible_actions
    r = env.step(a)
    results.append(r)
  return plan_len, results


def test_the_env_module_and_the_generator_name_the_same_splits():
  # alfworld_env repeats them so that importing it does not import the generator.
  assert alfworld_env.SPLITS == gen.SPLITS == SPLITS
  assert alfworld_env.AlfworldEnv.splits == SPLITS


def test_floorplan_splits_and_generator_purity():
  train, unseen = set(gen.split_floorplans("train")), set(gen.split_floorplans("eval_unseen"))
  assert gen.split_floorplans("eval_seen") == gen.split_floorplans("train")
  assert train and unseen and not train & unseen
  assert len(train | unseen) == len(gen.all_floorplans()) == 120
  for split in SPLITS:
    for task_type in gen.TASK_TYPES:
      assert any(gen._goal_candidates(gen._load_scene(fp), task_type)
                 for fp in gen.split_floorplans(split)), (split, task_type)
  a = gen.generate_problem(0, "train", 7)
  assert a == gen.generate_problem(0, "train", 7)
  assert a[1]["pddl_problem"] != gen.generate_problem(1, "train", 7)[1]["pddl_problem"]
  assert a[1]["pddl_problem"] != gen.generate_problem(0, "eval_seen", 7)[1]["pddl_problem"]
  assert a[0]["task_type"] == gen.TASK_TYPES[7 % 6]
  assert "(increase (total-cost) 5)" not in a[1]["pddl_domain"]


@pytest.mark.parametrize("split,index", ALL_TYPES)
def test_expert_wins_with_unit_labels(env, split, index):
  plan_len, results = play_expert(env, split, index)
  last = results[-1]
  assert last.info.won and last.done and last.reward == 1.0 and not last.info.truncated
  assert len(results) - 1 == plan_len > 0
  assert [r.info.extra["plan_len"] for r in results] == list(range(plan_len, -1, -1))
  assert [r.info.oracle_label for r in results] == [None] + [1.0] * plan_len
  assert all(r.info.action_valid for r in results)
  assert all(r.reward == 0.0 and not r.done for r in results[:-1])
  info = results[0].info
  assert info.extra["source"] == "generated" and info.extra["task_type"] == gen.TASK_TYPES[index % 6]
  assert results[0].observation.endswith(f"Your task is to: {info.task}.")
  assert list(info.admissible_actions) == sorted(info.admissible_actions)
  # Every expert step changes the state, so every state anchor along the plan is new.
  assert len({r.info.anchor for r in results}) == len(results)
  scene = env.tasks.traj_data(split, index)["scene"]["scene_num"]
  assert scene in gen.split_floorplans(split)


def test_invalid_actions_are_reported_not_raised(env):
  r0 = env.reset("train", 0)
  for bad in ["", "dance", "GO TO SINKBASIN 1", "go to", "take the moon", "é" * 500, 12, None,
              r0.info.admissible_actions[0] + " please"]:
    r = env.step(bad)
    assert r.observation == "Nothing happens."
    assert not r.info.action_valid and r.info.oracle_label == 0.0 and not r.done
    assert r.info.admissible_actions == r0.info.admissible_actions
    assert r.info.extra["plan_len"] == r0.info.extra["plan_len"]
  # The engine strips whitespace before matching, so this one is valid.
  r = env.step("  look  ")
  assert r.info.action_valid and r.observation != "Nothing happens." and r.info.oracle_label == 0.0


def test_state_anchor_tells_locations_apart(env):
  """GiGPO's anchor is the engine state, not the text: "Nothing happens." and the
  inventory read alike wherever the agent is."""
  r0 = env.reset("train", 0)
  here = [r0] + [env.step(a) for a in ("dance", "inventory", "look")]
  go = next(a for a in r0.info.admissible_actions if a.startswith("go to "))
  there = [env.step(go)] + [env.step(a) for a in ("dance", "inventory")]
  assert here[1].observation == there[1].observation == "Nothing happens."
  assert here[2].observation == there[2].observation
  assert len({r.info.anchor for r in here}) == 1 and len({r.info.anchor for r in there}) == 1
  assert here[0].info.anchor != there[0].info.anchor
  assert r0.info.anchor == env.reset("train", 0).info.anchor  # a reset is the same state


def test_step_limit_and_step_after_done(cache_dir):
  e = make_env("alfworld", num_train=6, seed=0, step_limit=3, cache_dir=cache_dir)
  e.reset("train", 0)
  rs = [e.step("look") for _ in range(3)]
  assert [r.done for r in rs] == [False, False, True]
  assert rs[-1].info.truncated and not rs[-1].info.won and rs[-1].reward == 0.0
  r = e.step("look")
  assert r.done and not r.info.action_valid and "reset" in r.info.error
  assert e.expert_action() is None


def test_random_walk_labels_match_fresh_planner(env):
  """Labels from the memoised/shortcut plans equal a fresh planner run on a replayed engine."""
  rng = random.Random(0)
  r = env.reset("train", 1)
  ref = gen.Engine()
  ref.load(r.info.extra["game_file"])
  ref.reset()
  for _ in range(6):
    a = rng.choice(r.info.admissible_actions)
    before = r.info.extra["plan_len"]
    r = env.step(a)
    ref.step(a)
    assert r.info.action_valid
    assert r.observation == ref.state.feedback
    d = 0 if ref.won else len(ref.replan())
    assert r.info.extra["plan_len"] == d
    assert r.info.oracle_label == before - d <= 1  # shortest plans: a step gains at most 1
    if r.done:
      break


def test_reset_is_deterministic(env, tmp_path):
  a, b = env.reset("train", 1), env.reset("train", 1)
  assert a == b
  # The same (seed, split, index) generated again from scratch gives the same game.
  other = make_env("alfworld", num_train=6, seed=0, cache_dir=str(tmp_path))
  c = other.reset("train", 1)
  assert c.info.extra["game_file"] != a.info.extra["game_file"]
  for x in (lambda r: r.observation, lambda r: r.info.admissible_actions, lambda r: r.info.task,
            lambda r: r.info.extra["plan_len"], lambda r: r.info.extra["task_type"]):
    assert x(c) == x(a)
  assert other.expert_action() == env.expert_action()
  g1, g2 = (json.load(open(x.info.extra["game_file"])) for x in (a, c))
  assert g1 == g2
  assert make_env("alfworld", num_train=6, seed=1, cache_dir=str(tmp_path)).reset(
      "train", 1).observation != a.observation


_REFERENCE = textwrap.dedent("""
    import json, sys
    import textworld, textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos, AlfredExpert
    game, actions = sys.argv[1], json.loads(sys.argv[2])
    assert "environments" not in sys.modules
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["expert_plan"])
    expert = textworld.gym.make(textworld.gym.register_game(game, infos, max_episode_steps=100,
        wrappers=[AlfredDemangler(), AlfredInfos, AlfredExpert(expert_type="planner")]))
    _, info = expert.reset()
    plan = list(info["extra.expert_plan"])
    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    env = textworld.gym.make(textworld.gym.register_game(game, infos, max_episode_steps=100,
        wrappers=[AlfredDemangler(), AlfredInfos]))
    obs, info = env.reset()
    out = [[obs, info["admissible_commands"], info["won"]]]
    for a in actions:
      obs, _, _, info = env.step(a)
      out.append([obs, info["admissible_commands"], info["won"]])
    print(json.dumps({"plan": plan, "steps": out}))
""")


def test_observations_match_official_engine_stack(env):
  """Same text, admissible commands, won and expert as textworld.gym + the ALFWorld wrappers."""
  r = env.reset("eval_seen", 2)
  game = r.info.extra["game_file"]
  plan = json.load(open(game))["walkthrough"]
  rng = random.Random(1)
  actions = ["examine " + plan[0][6:], "jump", plan[0], "inventory", rng.choice(r.info.admissible_actions)]
  ours = [r]
  for a in actions:
    ours.append(env.step(a))
  env.reset("eval_seen", 2)
  expert_first = env.expert_action()
  proc = subprocess.run([sys.executable, "-c", _REFERENCE, game, json.dumps(actions)],
                        capture_output=True, text=True, timeout=600,
                        env={**os.environ, "ALFWORLD_DATA": os.environ.get("ALFWORLD_DATA", "")
                             or os.path.join(os.path.dirname(game), ".alfworld_data")})
  assert proc.returncode == 0, proc.stderr[-2000:]
  ref = json.loads(proc.stdout.strip().splitlines()[-1])
  assert ref["plan"] == plan and ref["plan"][0] == expert_first
  assert len(ref["steps"]) == len(ours)
  for (obs, adm, won), r in zip(ref["steps"], ours):
    assert r.observation == obs
    assert r.info.admissible_actions == tuple(adm)
    assert r.info.won == won


def _official_tree(root, env, picks):
  """A tiny json_2.1.1 tree in the layout alfworld-download writes, from generated games."""
  for split, index in picks:
    traj = env.tasks.traj_data(split, index)
    p = traj["pddl_params"]
    name = f"{traj['task_type']}-{p['object_target']}-None-{p['parent_target'] or p['toggle_target']}-{traj['scene']['scene_num']}"
    d = os.path.join(root, "json_2.1.1", gen.OFFICIAL_SPLIT_DIRS[split], name, "trial_T0000_000000")
    os.makedirs(d)
    src = env.tasks.game_dir(split, index)
    for f in ("traj_data.json", "game.tw-pddl"):
      shutil.copy(os.path.join(src, f), d)
  return os.path.join(root, "json_2.1.1")


def test_official_data_layout(env, tmp_path):
  for split, index in SAMPLE:
    env.tasks.game_file(split, index, env._engine)
  tree = _official_tree(str(tmp_path), env, SAMPLE)
  # Games upstream skips: movable/sliced trajectories, unsolvable games, other task types.
  src = env.tasks.game_dir("train", 0)
  for bad in ("train/pick_and_place_with_movable_recep-A-B-C-1/trial_T1",
              "train/pick_and_place_simple-Apple-None-Sliced-1/trial_T2",
              "train/pick_and_place_simple-X-None-Y-2/trial_T3"):
    os.makedirs(os.path.join(tree, bad))
    shutil.copy(os.path.join(src, "traj_data.json"), os.path.join(tree, bad))
    game = json.load(open(os.path.join(src, "game.tw-pddl")))
    game["solvable"] = "trial_T3" not in bad and game["solvable"]
    json.dump(game, open(os.path.join(tree, bad, "game.tw-pddl"), "w"))
  off = make_env("alfworld", source="official", data_dir=str(tmp_path))
  assert [off.num_tasks(s) for s in SPLITS] == [2, 1, 1]
  for split in SPLITS:
    plan_len, results = play_expert(off, split, 0)
    assert results[-1].info.won and len(results) - 1 == plan_len
    assert results[0].info.extra["source"] == "official"
  assert make_env("alfworld", source="official", data_dir=str(tmp_path), num_train=1).num_tasks("train") == 1


def test_bad_arguments_raise_clear_errors(env, tmp_path):
  with pytest.raises(ValueError, match="source"):
    make_env("alfworld", source="web")
  with pytest.raises(ValueError, match="eval_unseen"):
    env.reset("test", 0)
  with pytest.raises(ValueError, match=r"\[0, 6\)"):
    env.reset("train", 6)
  with pytest.raises(ValueError, match="num_train"):
    make_env("alfworld", num_train=0)
  with pytest.raises(FileNotFoundError, match="alfworld-download"):
    make_env("alfworld", source="official", data_dir=str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("split", SPLITS)
def test_all_six_task_types_expert_wins(env, split):
  for index in range(6):
    plan_len, results = play_expert(env, split, index)
    assert results[-1].info.won and len(results) - 1 == plan_len
    assert [r.info.oracle_label for r in results[1:]] == [1.0] * plan_len


def test_cli_generates_with_progress(cache_dir):
  proc = subprocess.run(
      [sys.executable, "-m", "environments.alfworld_env", "--generate", "2", "--split", "train",
       "--cache-dir", cache_dir], capture_output=True, text=True, timeout=600,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[1].startswith("[1/2] train/000000 pick_and_place_simple")
  assert lines[2].startswith("[2/2] train/000001 look_at_obj_in_light")
