"""The task group (csa_jax/rollout/groups.py): an iteration's tasks, their episodes padded into
[B, G, T] arrays, the training rows and the units the model-based methods pack, each
against a plain-Python reading of the episodes; and one iteration's groups played on a real
pool. `GroupArrays`' every field is also checked in tests/test_wiring.py."""

import numpy as np
import pytest

from csa_jax.config import AlgoConfig, EnvConfig, ExperimentConfig, RolloutConfig
from csa_jax.rollout import groups
from csa_jax.rollout import prompts
from environments.pool import EnvPool
from tests import factories
from tests.factories import episode, step


def _seeded_episode(task, n_steps, won, seed):
  """n_steps of 1-3 action tokens with random log-probs and anchors; every other step
  labelled."""
  rng = np.random.default_rng(seed)
  steps = [step((1, 2), [3] * int(rng.integers(1, 4)), [], anchor_id=int(rng.integers(0, 3)),
                oracle_label=None if t % 2 else float(t)) for t in range(n_steps)]
  for s in steps:
    s.action_logps = list(rng.normal(size=len(s.action_ids)))
  return episode(steps, won=won, task=task)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_group_arrays_match_loop(reduce):
  B, G, T = 2, 3, 5
  trajs = [_seeded_episode(("train", b), n, won, 10 * b + g)
           for b in range(B) for g, (n, won) in enumerate([(2, True), (5, False), (7, True)])]
  arr = groups.group_arrays(groups.split(trajs, G), T, reduce)
  for k, tr in enumerate(trajs):
    b, g = k // G, k % G
    assert arr.rewards_BxG[b, g] == float(tr.won)
    n = min(len(tr.steps), T)
    assert arr.mask_BxGxT[b, g].tolist() == [t < n for t in range(T)]
    for t in range(T):
      if t < n:
        lp = tr.steps[t].action_logps
        want = sum(lp) if reduce == "sum" else sum(lp) / len(lp)
        assert arr.logp_BxGxT[b, g, t] == pytest.approx(want, rel=1e-6)
        assert arr.state_id_BxGxT[b, g, t] == tr.steps[t].anchor_id
        lab = tr.steps[t].oracle_label
        assert (np.isnan(arr.oracle_BxGxT[b, g, t]) if lab is None
                else arr.oracle_BxGxT[b, g, t] == lab)
        assert arr.step_rewards_BxGxT[b, g, t] == (float(tr.won) if t == n - 1 else 0.0)
      else:
        assert arr.logp_BxGxT[b, g, t] == 0 and arr.step_rewards_BxGxT[b, g, t] == 0


def test_groups_reject_ragged_or_partial_groups():
  trajs = [_seeded_episode(("train", 0), 2, True, k) for k in range(5)]
  with pytest.raises(ValueError, match="not whole groups of 3"):
    groups.split(trajs, 3)
  with pytest.raises(ValueError, match="different sizes"):
    groups.group_arrays([trajs[:3], trajs[3:]], 4)
  batch = groups.from_episodes(trajs[:4], 2, 4)
  assert [(b, g) for b, g, _ in batch.places()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert batch.trajs == trajs[:4] and batch.arrays.mask_BxGxT.shape == (2, 2, 4)


def _tagged_episode(n_steps, tag):
  """An episode whose every prompt starts with `tag`, its step index next."""
  return episode([step((tag, t), (7, 1), (-0.5, -0.1), action=f"a{t}", observation="")
                  for t in range(n_steps)], task=("train", tag))


@pytest.mark.parametrize("weight", ["step", "episode"])
def test_rl_rows_weighting(weight):
  """"step": every row carries its step's advantage. "episode": rows of an episode of
  length L carry adv * mean_len / L, so an episode's rows weigh the same in total
  whatever its length (a 15-step failure no longer outweighs a 3-step success 5:1)."""
  trajs = [_tagged_episode(3, 0), _tagged_episode(15, 1)]  # one group of G=2
  adv = np.zeros((1, 2, 15), np.float32)
  adv[0, 0, :3] = 1.0
  adv[0, 1, :15] = -1.0
  rows = groups.rl_rows(groups.make_batch([trajs], 15), adv, row_weight=weight)
  assert len(rows) == 18
  per_ep = [sum(r["advantage"] for r in rows if r["prompt_ids"][0] == k) for k in (0, 1)]
  if weight == "step":
    assert per_ep == [3.0, -15.0]
  else:  # mean length 9: each episode's rows sum to +-9
    assert per_ep == pytest.approx([9.0, -9.0], abs=1e-5)
    assert rows[0]["advantage"] == pytest.approx(3.0)


def test_rows_and_units_follow_the_groups_and_skip_empty_actions():
  """Rows and units carry each real step once, at its (b, g, t), cut at T; a step whose
  action is empty trains nothing and is left out."""
  g0 = [_tagged_episode(2, 10), _tagged_episode(4, 11)]
  g1 = [_tagged_episode(1, 20), _tagged_episode(3, 21)]
  g1[1].steps[1].action_ids = []
  batch = groups.make_batch([g0, g1], 3)
  adv = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)
  rows = groups.rl_rows(batch, adv)
  want = [(b, g, t) for b, grp in enumerate([g0, g1]) for g, tr in enumerate(grp)
          for t in range(min(tr.length, 3)) if tr.steps[t].action_ids]
  assert [tuple(r["prompt_ids"]) for r in rows] == [
      tuple(batch.groups[b][g].steps[t].prompt_ids) for b, g, t in want]
  assert [r["advantage"] for r in rows] == [float(adv[b, g, t]) for b, g, t in want]
  units = groups.group_units(batch, 3)
  assert [[(g, r["t"]) for g, r in u] for u in units] == [
      [(g, t) for bb, g, t in want if bb == b] for b in range(2)]
  eps = groups.episode_units(batch, 3)
  assert [len(u) for u in eps] == [2, 3, 1, 2]
  (pair,) = groups.pair_units(batch, [(1, 1, 0)], 3)
  assert [(k, r["prompt_ids"][0]) for k, r in pair] == [(0, 21), (0, 21), (1, 20)]


def _cfg(**rollout):
  return ExperimentConfig(
      env=EnvConfig(name="keydoor", kwargs={"horizon": 2}, train_split="train",
                    num_train_tasks=50),
      rollout=RolloutConfig(**({"tasks_per_iter": 3, "group_size": 4, "max_turns": 3,
                                "num_envs": 6, "max_prompt_tokens": 256} | rollout)),
      algo=AlgoConfig(dynamic_sampling=False))


def test_tasks_are_b_distinct_training_tasks_each_g_times():
  cfg = _cfg()
  tasks = groups.tasks(np.random.default_rng(0), cfg)
  assert len(tasks) == 3 * 4
  per_group = [tasks[i:i + 4] for i in range(0, 12, 4)]
  assert all(len(set(grp)) == 1 for grp in per_group)
  assert len({grp[0] for grp in per_group}) == 3
  assert all(split == "train" and 0 <= i < 50 for split, i in tasks)
  assert groups.tasks(np.random.default_rng(0), cfg) == tasks  # the rng decides


def test_collect_plays_the_iterations_groups_on_a_real_pool():
  """One iteration's groups on KeyDoor: every group's G episodes play its one task, the
  arrays are [B, G, max_turns] in that order, and the steps played are counted."""
  cfg = _cfg()
  tok = factories.tokenizer()
  answers = [" take red key", " walk on"]

  def policy(prompt_ids, rng):
    del rng
    ids = [tok.encode(answers[i % 2]) + [tok.eos_id] for i, _ in enumerate(prompt_ids)]
    return ids, [[-0.5] * len(x) for x in ids]

  tasks = groups.tasks(np.random.default_rng(1), cfg)
  with EnvPool("keydoor", {"horizon": 2}, cfg.rollout.num_envs) as pool:
    batch, played = groups.collect(pool, policy, tok, cfg, np.random.default_rng(1),
                                   fmt=prompts.PLAIN)
  assert [tuple(tr.task for tr in grp) for grp in batch.groups] == [
      tuple(tasks[i:i + 4]) for i in range(0, 12, 4)]
  assert batch.arrays.mask_BxGxT.shape == (3, 4, 3)
  assert played == sum(tr.length for tr in batch.trajs) == int(batch.arrays.mask_BxGxT.sum())
