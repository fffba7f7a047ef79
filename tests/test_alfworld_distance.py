"""The fast exact ALFWorld oracle (environments/alfworld_distance.py) against the planner.

Two environments play the same actions in lockstep: one labels steps with the fast distance
(oracle="fast"), the other with Fast Downward's plan (oracle="planner", the label the
project used before). Every step's label and distance must be equal. The walk mixes the
planner's own action (to reach states near the goal), manipulation commands (take, put,
open, heat, cool, clean, use: objects in hand, moved, treated, receptacles open) and any
admissible command, so the sampled states are not just the start state's neighbours.
"""

import random

import pytest

from environments import alfworld_distance as dist
from environments import alfworld_gen as gen
from environments import make_env

_VERBS = ("take", "put", "open", "heat", "cool", "clean", "use", "close")


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("alfworld_cache"))
  kw = dict(source="generated", num_train=18, seed=0, cache_dir=cache)
  fast, planner = make_env("alfworld", oracle="fast", **kw), make_env("alfworld", oracle="planner", **kw)
  yield fast, planner
  fast.close()
  planner.close()


def lockstep(fast, planner, index: int, steps: int, seed: int) -> list[tuple]:
  """Plays `steps` steps of a mixed walk; returns (task type, fast, planner) per step."""
  rf, rp = fast.reset("train", index), planner.reset("train", index)
  assert rf.info.extra["plan_len"] == rp.info.extra["plan_len"]
  rng = random.Random(seed)
  out = []
  for _ in range(steps):
    u = rng.random()
    acts = rf.info.admissible_actions
    manip = [a for a in acts if a.split()[0] in _VERBS]
    if u < 0.35 and planner.expert_action():
      a = planner.expert_action()
    elif u < 0.75 and manip:
      a = rng.choice(manip)
    else:
      a = rng.choice(acts)
    rf, rp = fast.step(a), planner.step(a)
    assert rf.observation == rp.observation
    out.append((rf.info.extra["task_type"], a, (rf.info.oracle_label, rf.info.extra["plan_len"]),
                (rp.info.oracle_label, rp.info.extra["plan_len"])))
    if rf.done:
      break
  return out


def check(results):
  bad = [r for r in results if r[2] != r[3]]
  assert not bad, f"{len(bad)} of {len(results)} steps differ (type, action, fast, planner): {bad[:5]}"
  assert all(r[3][0] is not None for r in results), "the planner found no plan somewhere"


@pytest.mark.parametrize("index", [1, 3, 5])  # look_at_obj_in_light, heat, pick_two
def test_fast_labels_equal_planner_labels(envs, index):
  check(lockstep(*envs, index, steps=8, seed=index))


@pytest.mark.slow
def test_fast_labels_equal_planner_labels_all_types(envs):
  """About 340 steps: three games of each of the six task types, up to 25 steps each (an
  episode ends early when the walk wins)."""
  results = []
  for index in range(18):
    results += lockstep(*envs, index, steps=25, seed=100 + index)
  check(results)
  types = {r[0] for r in results}
  assert types == set(gen.TASK_TYPES) and len(results) >= 300
  assert {r[2][0] for r in results} >= {1.0, 0.0, -1.0}  # progress, wasted and regress steps


def test_expert_plan_counts_down(envs):
  fast, planner = envs
  r = fast.reset("train", 0)
  d = r.info.extra["plan_len"]
  planner.reset("train", 0)
  while not r.done:
    a = planner.expert_action()
    planner.step(a)
    r = fast.step(a)
    assert r.info.oracle_label == 1.0 and r.info.extra["plan_len"] == d - 1
    d -= 1
  assert r.info.won and d == 0


def test_goal_from_params_and_unknown_type():
  g = dist.Goal.from_pddl_params("pick_heat_then_place_in_recep",
                                 {"object_target": "Apple", "parent_target": "CounterTop",
                                  "toggle_target": ""})
  assert (g.obj_type, g.parent_type, g.toggle_type) == ("apple", "countertop", "")
  with pytest.raises(ValueError, match="no exact distance"):
    dist.Goal.from_pddl_params("pick_and_place_with_movable_recep", {})
  with pytest.raises(ValueError, match="oracle"):
    make_env("alfworld", oracle="bfs")


def test_lamp_switched_on_before_the_object_is_held(envs):
  """A look task where the lamp is used while holding the wrong object: the goal then needs
  a walk back to the lamp with the book, a move no other test state needed."""
  fast, planner = envs
  fast.reset("train", 1), planner.reset("train", 1)
  for a in ("go to drawer 2", "go to sidetable 2", "take box 2 from sidetable 2",
            "move box 2 to sidetable 2", "take box 2 from sidetable 2", "go to dresser 1",
            "use floorlamp 1"):
    rf, rp = fast.step(a), planner.step(a)
    assert rf.info.action_valid, a
    assert (rf.info.oracle_label, rf.info.extra["plan_len"]) == (
        rp.info.oracle_label, rp.info.extra["plan_len"]), a
