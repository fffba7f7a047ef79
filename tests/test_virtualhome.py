"""VirtualHome on the real EAI scene-1 data: gold programs win, goals are counted as the
scene graph says, bad actions are answered and never raised, splits hold, demo and launch run."""

import contextlib
import io
import os
import subprocess
import sys

import pytest

pytest.importorskip("virtualhome_eval")

from environments import make_env  # noqa: E402
from environments import virtualhome_env as vh  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def env():
  return make_env("virtualhome", admissible="all")


def _play_gold(env, task):
  first = r = env.reset_task(task)
  results = []
  while not r.done:
    action = env.expert_action()
    if action is None:
      break
    r = env.step(action)
    results.append((action, r))
  return first, results


def _included():
  return [t for s in vh.SPLITS for t in vh.split_tasks()[s]]


def _goals_hold_in(state: dict, task: vh.Task) -> tuple[int, int]:
  """(node goals, edge goals) satisfied in a to_dict() scene graph, read independently."""
  states = {n["id"]: set(n["states"]) for n in state["nodes"]}
  edges = {(e["from_id"], e["relation_type"], e["to_id"]) for e in state["edges"]}
  nodes = sum(s in states.get(i, ()) for i, _, s in task.node_goals)
  return nodes, sum(e in edges for e in task.edge_goals)


def _check_gold_wins(env, task):
  first, results = _play_gold(env, task)
  assert results, task.task_id
  assert all(r.info.action_valid for _, r in results), task.task_id
  last = results[-1][1]
  assert last.info.won and last.done and last.reward == 1.0, task.task_id
  # A prefix of the program (an episode ends when every goal holds, which for some tasks is
  # before the program's last lines: the toilet is sat on before the hands are washed).
  assert [a for a, _ in results] == list(task.gold[:len(results)])
  assert all(r.reward == 0.0 and not r.done for _, r in results[:-1])
  # Every goal condition holds in the final scene graph, read from the graph itself.
  assert _goals_hold_in(env.state_dict(), task) == (len(task.node_goals), len(task.edge_goals))
  # Oracle labels add up to the goals the program completed from the start.
  total = first.info.extra["goals_total"]
  labels = [r.info.oracle_label for _, r in results]
  assert sum(labels) == total - first.info.extra["goals_satisfied"]
  assert last.info.extra["goal_fraction"] == 1.0


def test_splits_are_disjoint_deterministic_and_hold_out_whole_categories():
  splits = vh.split_tasks()
  assert {s: len(v) for s, v in splits.items()} == {"train": 232, "test": 48, "unseen": 57}
  ids = [t.task_id for s in vh.SPLITS for t in splits[s]]
  assert len(ids) == len(set(ids)) == len(vh.all_tasks()) - len(vh.EXCLUDED) - 4 == 337
  # Left out: exactly the tasks without any goal condition (any action would win them).
  empty = {t.task_id for t in vh.all_tasks()
           if not (t.node_goals or t.edge_goals or t.action_goals)}
  assert empty == set(vh.NO_GOALS)
  assert all(t.node_goals or t.edge_goals or t.action_goals
             for s in vh.SPLITS for t in splits[s])
  seen = {t.category for s in ("train", "test") for t in splits[s]}
  assert seen.isdisjoint({t.category for t in splits["unseen"]})
  assert {t.category for t in splits["unseen"]} == set(vh.UNSEEN_CATEGORIES)
  assert {t.category for t in splits["test"]} <= {t.category for t in splits["train"]}
  assert len(seen) == 21
  e = make_env("virtualhome")
  assert e.reset("test", 3).observation == e.reset("test", 3).observation


def test_a_sample_of_gold_programs_wins_their_tasks(env):
  for task in _included()[::12]:  # 29 tasks across every split; the full sweep is slow-marked
    _check_gold_wins(env, task)


@pytest.mark.slow
def test_every_included_gold_program_wins_its_task(env):
  for task in _included():
    _check_gold_wins(env, task)


def test_the_excluded_gold_program_is_refused_by_the_simulator(env):
  (task,) = [t for t in vh.all_tasks() if t.task_id in vh.EXCLUDED]
  env.reset_task(task)
  for k, line in enumerate(task.gold):
    assert env.expert_action() == line
    r = env.step(line)
    if not r.info.action_valid:
      break
  assert k == 16 and "already grabbed" in r.observation and not r.done
  assert env.expert_action() == task.gold[16]  # a refused line changes nothing: still the path


def test_goal_check_agrees_with_upstream_scene_evaluate_on_its_own_terms(env):
  """Upstream's `scene_evaluate_wID` stops at the first satisfied edge goal, so it can only
  agree with ours where a task has at most one edge goal; there it must, on the gold end state
  and on the start state."""
  from virtualhome_eval.simulation.evolving_graph.eval_utils import scene_evaluate_wID
  tasks = [t for t in _included() if len(t.edge_goals) <= 1][::20]
  assert len(tasks) >= 8
  for task in tasks:
    first = env.reset_task(task)
    for end in (False, True):
      if end:
        _play_gold(env, task)
      node_goals = [{"id": i, "class_name": c, "state": s} for i, c, s in task.node_goals]
      edge_goals = [{"from_id": a, "relation_type": r, "to_id": b} for a, r, b in task.edge_goals]
      history = list(task.gold) if end else []
      n, e, a, ok, *_ = scene_evaluate_wID(env.state_dict(), node_goals, edge_goals, 65,
                                          action_seq=history, action_goals=list(task.action_goals))
      ours = env._satisfied  # pylint: disable=protected-access
      assert n + e + max(a, 0) == ours, task.task_id
      assert ok == (ours == first.info.extra["goals_total"]), task.task_id


HOSTILE = ["", "   ", "\x00", "look", "[FLY] <soap> (1002)", "[GRAB]", "[GRAB] <soap>",
           "[GRAB] <soap> (abc)", "[GRAB] <soap> (99999999999999999999)", "[GRAB] <soap> (-1)",
           "[WALK] <nothing> (424242)", "[PUTBACK] <soap> (1002)", "x" * 100_000,
           "[WALK] <bathroom> (1) <bathroom> (1)", "🪙 [GRAB] <coin> (1)", "[putoff] <bed> (73)",
           "[GRAB] <soap> (²)", "[GRAB] <soap> (٣)", "[" * 10_000]


@pytest.mark.parametrize("action", HOSTILE)
def test_a_bad_action_is_answered_with_a_reason_and_changes_nothing(action):
  e = make_env("virtualhome")
  first = e.reset("train", 5)
  r = e.step(action)
  assert not r.info.action_valid and r.reward == 0.0 and r.info.oracle_label == 0.0
  assert r.observation.startswith("Cannot do that: ") and len(r.observation.splitlines()[0]) < 300
  assert r.info.anchor == first.info.anchor  # the state is as it was
  assert e.expert_action() == e.task("train", 5).gold[0]  # still on the expert's path


def test_the_simulators_own_refusal_is_the_observation():
  e = make_env("virtualhome")
  task = e.task("train", 0)
  e.reset("train", 0)
  far = [i for i in e._objects if i >= 2000][0]  # pylint: disable=protected-access
  name = e.state_dict()["nodes"]
  cls = next(n["class_name"] for n in name if n["id"] == far)
  r = e.step(f"[SWITCHOFF] <{cls}> ({far})")
  assert not r.info.action_valid
  assert f'when executing "[SWITCHOFF] <{cls}> ({far})' in r.observation
  assert task.category in r.info.task


def test_step_limit_is_three_times_the_gold_length_and_truncates():
  e = make_env("virtualhome")
  n = len(e.task("test", 0).gold)
  r = e.reset("test", 0)
  assert r.info.extra["step_limit"] == 3 * n
  for k in range(3 * n):
    assert not r.done
    r = e.step("[STANDUP]")  # refused: the character is standing
  assert r.done and r.info.truncated and not r.info.won
  with pytest.raises(RuntimeError):
    e.step("[STANDUP]")


def test_observation_shows_room_held_close_and_states():
  e = make_env("virtualhome")
  task = next(t for t in vh.split_tasks()["train"] if t.task_id == "27_2")  # Wash clothes
  e.reset_task(task)
  for a in task.gold[:7]:  # ... [GRAB] <soap> (1002)
    r = e.step(a)
  assert task.gold[6] == "[GRAB] <soap> (1002)"
  obs = r.observation
  assert "You are in the dining_room (201)." in obs
  assert "You hold: soap (1002)." in obs
  assert "washing_machine (1001)" in obs.split("You are close to: ")[1].splitlines()[0]
  assert "washing_machine (1001) [CLEAN, CLOSED, OFF, PLUGGED_IN]" in obs
  assert "[OPEN] <washing_machine> (1001)" in r.info.admissible_actions
  assert "[PUTIN] <soap> (1002) <washing_machine> (1001)" in r.info.admissible_actions
  # Off the gold path the expert has no action.
  r = e.step("[WALK] <bathroom> (1)")
  assert r.info.action_valid and e.expert_action() is None


def test_bad_constructor_arguments_are_refused():
  with pytest.raises(ValueError):
    make_env("virtualhome", step_limit_factor=0)
  with pytest.raises(ValueError):
    make_env("virtualhome", admissible="some")
  with pytest.raises(ValueError):
    make_env("virtualhome", categories=["Fly a kite"])
  e = make_env("virtualhome", categories=["Wash clothes"])
  assert e.num_tasks("train") + e.num_tasks("test") == 4 and e.num_tasks("unseen") == 0
  with pytest.raises(IndexError):
    e.reset("train", 99)


def test_demo_prints_three_won_expert_episodes():
  from environments import demo
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    demo.main(["virtualhome", "--expert", "3", "--random", "0"])
  ends = [l for l in out.getvalue().splitlines() if l.startswith("--- ")]
  assert len(ends) == 3 and all("won=True" in l for l in ends), ends


@pytest.mark.slow
def test_launch_runs_sft_then_rl_on_a_tiny_budget(tmp_path):
  args = [f"sft.demos_dir={tmp_path / 'demos'}", "sft.num_demos=4", "sft.epochs=1",
          "sft.batch_size=8", "rollout.tasks_per_iter=1", "rollout.group_size=2",
          "rollout.num_envs=2", "rollout.max_turns=3", "rollout.max_prompt_tokens=1536",
          "algo.minibatch_size=8", "eval.num_episodes=2", "eval.every=0", "rl_iterations=1",
          "env.num_train_tasks=4", "model.max_seq_len=1568", "model.hidden_size=32",
          "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
          "model.num_kv_heads=1", "model.head_dim=16", "env.pool_backend=thread"]
  cmd = [sys.executable, "launch.py", "--exp", "virtualhome_csa", "--workdir",
         str(tmp_path / "run")]
  for a in args:
    cmd += ["--set", a]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "| SFT + RL |" in out.stdout
  from csa_jax.rollout import metrics as M
  recs = M.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert len(rl) == 1 and rl[0]["rollout/episodes"] == 2
  assert rl[0]["credit/labelled_steps"] == rl[0]["rollout/env_steps"] > 0


def test_an_episode_leaves_the_shared_scene_graph_as_it_was():
  """Episodes share each task's parsed initial graph (a cache); playing one must not change it."""
  e = make_env("virtualhome")
  before = e.reset("train", 7)
  state0 = e.state_dict()
  _play_gold(e, e.task("train", 7))
  again = e.reset("train", 7)
  assert again == before
  canon = lambda d: (sorted(map(str, d["nodes"])), sorted(map(str, d["edges"])))
  assert canon(e.state_dict()) == canon(state0)


def test_the_family_registers_every_method():
  import experiments
  from experiments.variants import VARIANTS
  for method in VARIANTS:
    cfg = experiments.get_experiment(f"virtualhome_{method}")
    assert cfg.env.name == "virtualhome" and cfg.env.eval_split == "test"
    assert cfg.env.num_train_tasks == len(vh.split_tasks()["train"])
