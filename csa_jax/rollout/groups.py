"""The task group: B training tasks, each played G times, the unit every group-relative
method compares within (GRPO's A_E, CSA's and GiGPO's step terms, DAPO's dynamic sampling,
iStar's and M-DPO's pairs).

Its one home: sampling an iteration's tasks, playing them (with DAPO's dynamic sampling),
the padded [B, G, T] arrays the estimators read, the training rows the update reads, and
the units (a whole group, one episode, a pair of episodes) that the model-based methods
pack. `rollout.group_size` is read here and nowhere else in the loop; a trajectory's place
is (group b, rollout g), never a position in a flat list.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from csa_jax.config import ExperimentConfig
from csa_jax.distributed import processes as dist
from csa_jax.estimators import dapo
from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout.episodes import Trajectory
from csa_jax.update import data as data_lib


@dataclasses.dataclass(frozen=True)
class GroupArrays:
  """What the estimators read of B task groups of G episodes, padded to T steps
  (`group_arrays` makes them)."""

  rewards_BxG: np.ndarray  # float32 outcome reward (1 if won)
  logp_BxGxT: np.ndarray  # float32 step log-prob (sum or mean over action tokens)
  mask_BxGxT: np.ndarray  # bool, step exists
  step_rewards_BxGxT: np.ndarray  # float32, outcome reward on the last step
  state_id_BxGxT: np.ndarray  # int32 anchor ids
  oracle_BxGxT: np.ndarray  # float32 oracle labels, NaN where none
  action_len_BxGxT: np.ndarray  # int32 generated tokens per step (DAPO overlong shaping)
  invalid_BxGxT: np.ndarray  # bool, the environment rejected the step's action


@dataclasses.dataclass(frozen=True)
class GroupBatch:
  """An iteration's task groups: `groups[b][g]` is rollout g of task group b, and `arrays`
  their padded [B, G, T] arrays."""

  groups: tuple[tuple[Trajectory, ...], ...]
  arrays: GroupArrays

  @property
  def trajs(self) -> list[Trajectory]:
    """Every episode, group by group (the order of the arrays' [B, G] axes)."""
    return [tr for grp in self.groups for tr in grp]

  def places(self) -> list[tuple[int, int, Trajectory]]:
    """(b, g, episode) for every episode, group by group."""
    return [(b, g, tr) for b, grp in enumerate(self.groups) for g, tr in enumerate(grp)]


def group_arrays(groups: Sequence[Sequence[Trajectory]], max_turns: int,
                 logp_reduce: str = "sum") -> GroupArrays:
  """Pads the groups' episodes into [B, G, T] arrays (every group G episodes long)."""
  sizes = {len(grp) for grp in groups}
  if len(sizes) > 1:
    raise ValueError(f"task groups of different sizes {sorted(sizes)}")
  shape = (len(groups), sizes.pop() if sizes else 0, max_turns)
  logp = np.zeros(shape, np.float32)
  mask = np.zeros(shape, bool)
  step_r = np.zeros(shape, np.float32)
  sid = np.zeros(shape, np.int32)
  oracle = np.full(shape, np.nan, np.float32)
  action_len = np.zeros(shape, np.int32)
  invalid = np.zeros(shape, bool)
  rewards = np.zeros(shape[:2], np.float32)
  for b, grp in enumerate(groups):
    for g, tr in enumerate(grp):
      rewards[b, g] = float(tr.won)
      for t, st in enumerate(tr.steps[:max_turns]):
        lp = np.asarray(st.action_logps, np.float64)
        logp[b, g, t] = lp.sum() if logp_reduce == "sum" else lp.mean() if lp.size else 0.0
        mask[b, g, t] = True
        sid[b, g, t] = st.anchor_id
        action_len[b, g, t] = len(st.action_ids)
        invalid[b, g, t] = not st.valid
        if st.oracle_label is not None:
          oracle[b, g, t] = st.oracle_label
      if tr.steps:
        step_r[b, g, min(len(tr.steps), max_turns) - 1] = rewards[b, g]
  return GroupArrays(rewards, logp, mask, step_r, sid, oracle, action_len, invalid)


def make_batch(groups: Sequence[Sequence[Trajectory]], max_turns: int,
               logp_reduce: str = "sum") -> GroupBatch:
  groups = tuple(tuple(grp) for grp in groups)
  return GroupBatch(groups, group_arrays(groups, max_turns, logp_reduce))


def split(trajs: Sequence[Trajectory], group_size: int) -> list[list[Trajectory]]:
  """Episodes played group by group (as `tasks` lists them) back into their groups."""
  if len(trajs) % group_size:
    raise ValueError(f"{len(trajs)} episodes are not whole groups of {group_size}")
  return [list(trajs[i:i + group_size]) for i in range(0, len(trajs), group_size)]


def from_episodes(trajs: Sequence[Trajectory], group_size: int, max_turns: int,
                  logp_reduce: str = "sum") -> GroupBatch:
  """A GroupBatch from episodes listed group by group."""
  return make_batch(split(trajs, group_size), max_turns, logp_reduce)


# ----------------------------------------------------------------------------------------
# Sampling and playing an iteration's groups.


def tasks(np_rng: np.random.Generator, cfg: ExperimentConfig) -> list[tuple[str, int]]:
  """B distinct training tasks, each listed G times (group by group), of which this
  process plays its share of whole groups (every process draws them all)."""
  r = cfg.rollout
  idx = np_rng.choice(cfg.env.num_train_tasks, size=r.tasks_per_iter, replace=False)
  flat = [(cfg.env.train_split, int(i)) for i in idx for _ in range(r.group_size)]
  return dist.share(flat, r.group_size)


def collect(pool, policy, tok, cfg: ExperimentConfig, np_rng: np.random.Generator, *,
            fmt, perf=None) -> tuple[GroupBatch | None, int]:
  """(this process's groups of one iteration, environment steps played). With dynamic
  sampling (DAPO), groups whose rewards are all equal are dropped and more are played (at
  most `algo.dynamic_sampling_rounds` rounds) to fill the batch; dropped groups' steps
  still count. None when no group is left to learn from."""
  r = cfg.rollout
  kept: list[list[Trajectory]] = []
  played = 0
  target = dist.share_count(r.tasks_per_iter)  # this process's groups
  for _ in range(cfg.algo.dynamic_sampling_rounds if cfg.algo.dynamic_sampling else 1):
    trajs = rollout_lib.run_episodes(pool, policy, tok, tasks(np_rng, cfg), r, np_rng,
                                     fmt=fmt, perf=perf)
    played += sum(t.length for t in trajs)
    groups = split(trajs, r.group_size)
    if cfg.algo.dynamic_sampling:
      won_BxG = np.array([[t.won for t in g] for g in groups], np.float32)
      keep_B = np.asarray(dapo.dynamic_sampling_keep(jnp.asarray(won_BxG)))
      groups = [g for g, k in zip(groups, keep_B) if k]
    kept.extend(groups)
    if len(kept) >= target:
      break
  if not kept:
    return None, played
  return make_batch(kept[:target], r.max_turns, r.logp_reduce), played


# ----------------------------------------------------------------------------------------
# Training rows and the units the model-based methods pack.


def step_rows(tr: Trajectory, max_turns: int) -> list[data_lib.Row]:
  """One row per step (prompt + action, sampling log-probs, advantage 0, step t)."""
  return [{"prompt_ids": st.prompt_ids, "action_ids": st.action_ids,
           "old_logps": st.action_logps, "advantage": 0.0, "t": t}
          for t, st in enumerate(tr.steps[:max_turns]) if st.action_ids]


def rl_rows(batch: GroupBatch, adv_BxGxT: np.ndarray, row_weight: str = "step",
            keep_BxGxT: np.ndarray | None = None) -> list[data_lib.Row]:
  """One row per real step, with that step's advantage (group by group); with
  `keep_BxGxT`, only the steps where it is true (csa_jax/update/oracle_rows.py).

  row_weight "episode" scales each row's advantage by mean_len / len(its episode), so
  every episode carries the same total weight in the loss whatever its length (the
  clipped objective is linear in a positive advantage scale, so this is a row weight).
  """
  T = adv_BxGxT.shape[2]
  lens = [min(tr.length, T) for tr in batch.trajs]
  mean_len = float(np.mean([n for n in lens if n > 0])) if any(lens) else 1.0
  rows = []
  for (b, g, tr), n in zip(batch.places(), lens):
    scale = mean_len / n if row_weight == "episode" and n else 1.0
    for t, st in enumerate(tr.steps[:T]):
      if st.action_ids and (keep_BxGxT is None or keep_BxGxT[b, g, t]):
        rows.append({"prompt_ids": st.prompt_ids, "action_ids": st.action_ids,
                     "old_logps": st.action_logps,
                     "advantage": float(adv_BxGxT[b, g, t]) * scale})
  return rows


def group_units(batch: GroupBatch, max_turns: int):
  """One unit per task group: (rollout g, row) for every step of the group."""
  return [[(g, row) for g, tr in enumerate(grp) for row in step_rows(tr, max_turns)]
          for grp in batch.groups]


def episode_units(batch: GroupBatch, max_turns: int):
  """One unit per episode (group by group): (0, row) for every step; `batch.places()`
  gives each unit's (b, g)."""
  return [[(0, row) for row in step_rows(tr, max_turns)] for tr in batch.trajs]


def pair_units(batch: GroupBatch, pairs: Sequence[tuple[int, int, int]], max_turns: int):
  """One unit per (group b, winner w, loser l) pair: (0, row) for the winner's steps,
  (1, row) for the loser's."""
  return [[(0, row) for row in step_rows(batch.groups[b][w], max_turns)]
          + [(1, row) for row in step_rows(batch.groups[b][l], max_turns)]
          for b, w, l in pairs]
