"""How the trainer feeds the estimators: DAPO's overlong shaping on rewards and step
rewards, checked against the formula written out here."""

import dataclasses

import numpy as np
import pytest

from csa_jax.algorithms.estimator import compute_advantages, shaped_rewards
from csa_jax.config import AlgoConfig, RolloutConfig
from csa_jax.rollout.groups import GroupArrays


def _arrays():
  # One group of 3: lengths per step; rollout 2 writes a cut-off 8-token action once.
  lens = [[3, 4, 0], [2, 0, 0], [8, 5, 2]]
  mask = np.array([[[l > 0 for l in row] for row in lens]])
  act = np.array([lens], np.int32)
  won = np.array([[1.0, 0.0, 1.0]], np.float32)
  step_r = np.zeros((1, 3, 3), np.float32)
  for g, row in enumerate(lens):
    step_r[0, g, sum(l > 0 for l in row) - 1] = won[0, g]
  rng = np.random.default_rng(0)
  return GroupArrays(won, rng.normal(size=(1, 3, 3)).astype(np.float32) * mask, mask,
                     step_r, rng.integers(0, 2, (1, 3, 3)).astype(np.int32),
                     np.full((1, 3, 3), np.nan, np.float32), act,
                     np.array([[[True, False, False], [False, False, False],
                                [True, True, False]]]))


def _penalty(length, max_len, cache):
  if length <= max_len - cache:
    return 0.0
  return -1.0 if length > max_len else ((max_len - cache) - length) / cache


@pytest.mark.parametrize("per", ["step", "episode"])
def test_overlong_shaping_matches_formula(per):
  arr = _arrays()
  roll = RolloutConfig(max_action_tokens=8, max_turns=3)
  algo = AlgoConfig(overlong_cache_frac=0.25, overlong_per=per, invalid_penalty=0.0)
  rewards, step_rewards = shaped_rewards(arr, algo, roll)
  for g in range(3):
    lens = [int(l) for l in arr.action_len_BxGxT[0, g] if l > 0]
    if per == "step":
      pen = np.mean([_penalty(l, 8, 2) for l in lens])
    else:
      pen = _penalty(sum(lens), 24, 6)
    assert rewards[0, g] == pytest.approx(arr.rewards_BxG[0, g] + pen, abs=1e-6)
    last = len(lens) - 1
    assert step_rewards[0, g, last] == pytest.approx(arr.step_rewards_BxGxT[0, g, last] + pen,
                                                     abs=1e-6)
    assert (step_rewards[0, g, :last] == arr.step_rewards_BxGxT[0, g, :last]).all()
  if per == "step":  # the cut-off 8-token action was penalised (its episode total is not)
    assert rewards[0, 2] < arr.rewards_BxG[0, 2]


def test_shaping_off_leaves_rewards_and_feeds_every_estimator():
  arr = _arrays()
  roll = RolloutConfig(max_action_tokens=8, max_turns=3)
  r, s = shaped_rewards(arr, AlgoConfig(invalid_penalty=0.0), roll)
  assert r is arr.rewards_BxG and s is arr.step_rewards_BxGxT
  for est in ("grpo", "dr_grpo", "rloo", "csa", "gigpo", "csa_gigpo"):
    for frac in (0.0, 0.25):
      algo = dataclasses.replace(AlgoConfig(estimator=est, invalid_penalty=0.0),
                                 overlong_cache_frac=frac)
      adv = compute_advantages(arr, algo, roll)
      assert adv.shape == (1, 3, 3) and np.isfinite(adv).all()
      assert (adv[~arr.mask_BxGxT] == 0).all()


def test_invalid_action_penalty_matches_formula():
  """Each rejected step costs `invalid_penalty` in its episode's return and in its own
  step reward (verl-agent's invalid-action penalty); steps beyond the mask never count."""
  arr = _arrays()
  roll = RolloutConfig(max_action_tokens=8, max_turns=3)
  rewards, step_rewards = shaped_rewards(arr, AlgoConfig(invalid_penalty=0.1), roll)
  # Rejected active steps: rollout 0 step 0; rollout 2 steps 0 and 1 (rollout 1 none).
  np.testing.assert_allclose(rewards[0], arr.rewards_BxG[0] - 0.1 * np.array([1, 0, 2]),
                             rtol=0, atol=1e-7)
  want = arr.step_rewards_BxGxT.copy()
  want[0, 0, 0] -= 0.1
  want[0, 2, 0] -= 0.1
  want[0, 2, 1] -= 0.1
  np.testing.assert_allclose(step_rewards, want, rtol=0, atol=1e-7)
  # A group whose outcomes tie is no longer uniform: fewer invalid steps rank higher.
  adv = compute_advantages(arr, AlgoConfig(estimator="grpo", invalid_penalty=0.1), roll)
  assert adv[0, 0, 0] > adv[0, 2, 0]  # both won; rollout 0 made one bad step, rollout 2 two
