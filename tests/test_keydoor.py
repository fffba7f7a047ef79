"""Tests of the KeyDoor delayed-credit task (environments/keydoor.py): over many random
episodes at each horizon the outcome is decided by the decisive step(s) alone and the
oracle labels say so; the anchors are the exact state; the noisy expert; demonstrations."""

import collections
import random
import subprocess
import sys

import pytest

from environments import demos, make_env
from environments.keydoor import PARTNER, ROUTINE, SPLIT_SIZES
from experiments import get_experiment, list_experiments
from experiments.keydoor import HORIZONS


def random_episode(env, split, index, rng, p_admissible=0.9):
  """Plays random actions (mostly admissible, some garbage); returns the steps as
  (anchor before, action, label, valid) and the final result."""
  r = env.reset(split, index)
  steps = []
  while not r.done:
    adm = r.info.admissible_actions
    action = rng.choice(adm) if rng.random() < p_admissible else rng.choice(["dance", "take key", ""])
    anchor = r.info.anchor
    r = env.step(action)
    steps.append((anchor, action, r.info.oracle_label, r.info.action_valid))
  return steps, r


@pytest.mark.parametrize("horizon,decisions", [(h, 1) for h in HORIZONS] + [(16, 2)])
def test_outcome_is_decided_by_the_decisive_steps_and_labels_say_so(horizon, decisions):
  env = make_env("keydoor", horizon=horizon, decisions=decisions)
  rng = random.Random(horizon * 10 + decisions)
  outcomes = collections.Counter()
  for index in range(300):
    steps, last = random_episode(env, "train", index % 40, rng)
    assert len(steps) == horizon + decisions  # fixed length: nothing truncated
    assert last.done and not last.info.truncated
    labels = [lab for _, _, lab, _ in steps]
    decisive = [t for t, lab in enumerate(labels) if lab != 0.0]
    # Exactly the decisive steps carry non-zero labels (+1 right, -1 wrong).
    want_decisive = [0] + ([1 + horizon // 2] if decisions == 2 else [])
    assert decisive == want_decisive
    assert all(labels[t] in (1.0, -1.0) for t in decisive)
    won = all(labels[t] == 1.0 for t in decisive)
    assert last.info.won == won and last.reward == float(won)
    # The reward is revealed only at the end.
    outcomes[won] += 1
  assert outcomes[True] > 10 and outcomes[False] > 10  # both outcomes were seen


def test_routine_actions_change_nothing_but_the_text():
  """Replaying an episode's decisive actions with any routine actions (even invalid
  ones) gives the same outcome, the same anchors and the same length."""
  env = make_env("keydoor", horizon=16, decisions=2)
  rng = random.Random(0)
  for index in range(30):
    steps, last = random_episode(env, "test", index, rng)
    r = env.reset("test", index)
    for t, (anchor, action, _, _) in enumerate(steps):
      assert r.info.anchor == anchor
      decisive = r.info.admissible_actions[0].startswith(("take", "go"))
      r = env.step(action if decisive else rng.choice(list(ROUTINE) + ["nonsense"]))
    assert r.info.won == last.info.won and r.done


def test_anchor_is_the_state_that_decides_the_rest():
  env = make_env("keydoor", horizon=4)
  r = env.reset("train", 3)
  assert r.info.anchor == "key room" and r.info.oracle_label is None
  task = env.task("train", 3)
  r = env.step(f"take {task['key']} key")
  assert r.info.anchor == f"corridor 1 key={task['key']} branch=None"
  r2 = env.step("walk on")
  assert r2.info.anchor.startswith("corridor 2") and r2.info.action_valid
  r3 = env.step("not an action")
  assert not r3.info.action_valid and r3.info.anchor.startswith("corridor 3")
  # The observation names the held key: the policy sees the state it is in.
  assert f"hold the {task['key']} key" in r2.observation


def test_an_invalid_key_choice_takes_no_key_and_loses():
  env = make_env("keydoor", horizon=2)
  env.reset("train", 0)
  r = env.step("take a key")
  assert not r.info.action_valid and r.info.oracle_label == -1.0
  assert "no key" in r.observation
  while not r.done:
    r = env.step("walk on")
  assert not r.info.won and r.reward == 0.0


@pytest.mark.parametrize("decisions", [1, 2])
def test_oracle_action_is_the_right_choice_at_decisive_steps_only(decisions):
  """Following the oracle at the decisive steps (anything elsewhere) always wins; it
  names nothing on routine steps."""
  env = make_env("keydoor", horizon=6, decisions=decisions)
  rng = random.Random(decisions)
  for index in range(40):
    r = env.reset("test", index)
    while not r.done:
      action = env.oracle_action()
      assert (action is None) == (r.info.anchor.startswith("corridor") and
                                  "A fork" not in r.observation)
      r = env.step(action if action is not None else rng.choice(r.info.admissible_actions))
      if action is not None:
        assert r.info.oracle_label == 1.0
    assert r.info.won and env.oracle_action() is None


def test_tasks_are_deterministic_and_splits_differ():
  env = make_env("keydoor")
  assert env.num_tasks("train") == SPLIT_SIZES["train"]
  assert env.task("test", 5) == make_env("keydoor").task("test", 5)
  train = {(t["keys"], t["key"]) for t in (env.task("train", i) for i in range(200))}
  test = [(t["keys"], t["key"]) for t in (env.task("test", i) for i in range(200))]
  assert len(set(test)) > 100 and sum(x in train for x in test) < 100
  with pytest.raises(ValueError, match="unknown split"):
    env.reset("nosuch", 0)
  for bad in (dict(horizon=0), dict(num_keys=1), dict(decisions=3),
              dict(expert_noise=1.5), dict(decisions=2, horizon=1)):
    with pytest.raises(ValueError):
      make_env("keydoor", **bad)


@pytest.mark.parametrize("noise,num_keys,decisions", [(0.0, 4, 1), (0.55, 4, 1), (1.0, 2, 1),
                                                      (0.3, 3, 2)])
def test_expert_is_right_with_the_stated_probability(noise, num_keys, decisions):
  env = make_env("keydoor", horizon=3, num_keys=num_keys, expert_noise=noise,
                 routine_noise=0.5, decisions=decisions)
  n, won, distractors, wrong_keys = 1500, 0, 0, set()
  for index in range(n):
    r = env.reset("train", index)
    task = env.task("train", index)
    while not r.done:
      action = env.expert_action()
      assert action in r.info.admissible_actions
      distractors += action in ("look around", "whistle")
      if action.startswith("take") and action != f"take {task['key']} key":
        wrong_keys.add((task["key"], action.split()[1]))  # the confusion, always the same
      r = env.step(action)
    won += r.info.won
  assert wrong_keys <= set(PARTNER.items())
  p = (1 - noise) ** decisions
  assert abs(won / n - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-9
  # Routine noise 0.5: a random one of the 3 routine actions half the time.
  # horizon 3: three corridor steps per episode (the fork is not one of them).
  assert abs(distractors / (3 * n) - 0.5 * 2 / 3) < 0.04
  assert env.expert_action() is None  # after the episode


def test_expert_demonstrations_are_reproducible(tmp_path):
  kwargs = {"horizon": 4, "expert_noise": 0.55}
  a = demos.collect_demos("keydoor", kwargs, "train", range(20))
  b = demos.collect_demos("keydoor", kwargs, "train", range(20))
  assert a == b
  assert 0 < sum(r["won"] for r in a) < 20
  assert all(len(r["actions"]) == 5 for r in a)


def test_families_are_registered_at_three_horizons_with_csa_state():
  names = list_experiments()
  for h in HORIZONS:
    for m in ("grpo", "csa", "csa_state", "gigpo", "dapo", "istar", "spa", "mtdpo"):
      assert f"keydoor_h{h}_{m}" in names
  assert "keydoor2_h16_csa_state" in names
  families = {n[:-len("_rloo")] for n in names if n.endswith("_rloo")}
  for fam in families:  # csa_state beside every family's grpo
    assert f"{fam}_csa_state" in names, fam
  cfg = get_experiment("keydoor_h48_csa_state")
  assert cfg.algo.estimator == "csa_state" and cfg.rollout.max_turns == 49
  assert cfg.sft.demo_filter == "all" and cfg.eval.num_episodes >= 400


def test_mechanism_variants_change_one_thing_of_grpo():
  """grpo_lr2x: GRPO at twice the family's learning rate; grpo_decisive: GRPO trained on
  the decisive rows alone. Nothing else differs from the family's GRPO."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  grpo = get_experiment("keydoor_h4_grpo")
  lr2x, decisive = get_experiment("keydoor_h4_grpo_lr2x"), get_experiment("keydoor_h4_grpo_decisive")
  assert lr2x.optim.learning_rate == 2 * grpo.optim.learning_rate
  assert dataclasses.replace(lr2x, name=grpo.name, optim=grpo.optim) == grpo
  assert decisive.algo.update_rows == "decisive" and grpo.algo.update_rows == "all"
  assert dataclasses.replace(decisive, name=grpo.name,
                             algo=dataclasses.replace(decisive.algo, update_rows="all")) == grpo


def test_demo_prints_three_won_expert_episodes():
  out = subprocess.run([sys.executable, "-m", "environments.demo", "keydoor", "--expert", "3",
                        "--random", "0"], capture_output=True, text=True, check=True).stdout
  assert out.count("--- won=True") == 3
