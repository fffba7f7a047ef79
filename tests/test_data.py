"""Training rows: loss exactly on action tokens, fixed shapes, every row once per epoch."""

import pytest

from csa_jax import data as D


def test_row_arrays_against_a_loop():
  row = {"prompt_ids": [5, 6, 7], "action_ids": [8, 9, 1], "old_logps": [-0.1, -0.2, -0.3],
         "advantage": 1.5}
  a = D.row_arrays(row, seq_len=8, action_len=4)
  seq = [5, 6, 7, 8, 9, 1]
  for p in range(8):
    real = p < len(seq) - 1
    assert a["inputs"][p] == (seq[p] if real else 0)
    assert a["attn_mask"][p] == int(real)
  for k in range(4):
    if k < 3:  # action token k is seq[3 + k], predicted from input position 2 + k
      assert a["act_pos"][k] == 2 + k and a["inputs"][a["act_pos"][k]] == seq[2 + k]
      assert a["targets"][k] == seq[3 + k]
      assert a["loss_mask"][k] == 1.0 and a["adv"][k] == 1.5
      assert a["old_logp"][k] == pytest.approx(row["old_logps"][k])
    else:
      assert a["loss_mask"][k] == 0 and a["adv"][k] == 0 and a["old_logp"][k] == 0


@pytest.mark.parametrize("prompt, action", [(8, 3), (2, 5)])
def test_row_too_long_fails(prompt, action):
  with pytest.raises(ValueError, match="does not fit"):
    D.row_arrays({"prompt_ids": [1] * prompt, "action_ids": [2] * action,
                  "old_logps": [0] * action, "advantage": 0.0}, seq_len=8, action_len=4)


def test_batches_cover_each_row_once_per_epoch_and_pad():
  rows = [D.sft_row([2, 3 + i], [100 + i, 1]) for i in range(10)]
  ds = D.batches(rows, batch_size=4, seq_len=6, action_len=3, pad_id=0, seed=3, epochs=2)
  got = list(D.iterate(ds))
  assert len(got) == 6  # 10 rows padded to 12, two epochs, batches of 4
  for b in got:
    assert all(v.shape[0] == 4 for v in b.values())
  for epoch in (got[:3], got[3:]):
    seen = [int(b["targets"][r][0]) for b in epoch for r in range(4) if b["loss_mask"][r][0]]
    assert sorted(seen) == list(range(100, 110))
  orders = [[int(b["inputs"][r][1]) for b in e for r in range(4)] for e in (got[:3], got[3:])]
  assert orders[0] != orders[1]  # reshuffled each epoch


def _traj(n_steps, tag):
  from csa_jax.rollout import Step, Trajectory
  steps = [Step(prompt_ids=[tag, t], action_ids=[7, 1], action_logps=[-0.5, -0.1],
                action=f"a{t}", observation="", reward=0.0, anchor_id=0, valid=True,
                oracle_label=None) for t in range(n_steps)]
  return Trajectory(task=("train", tag), steps=steps)


@pytest.mark.parametrize("weight", ["step", "episode"])
def test_rl_rows_weighting(weight):
  """"step": every row carries its step's advantage. "episode": rows of an episode of
  length L carry adv * mean_len / L, so an episode's rows weigh the same in total
  whatever its length (a 15-step failure no longer outweighs a 3-step success 5:1)."""
  import numpy as np
  trajs = [_traj(3, 0), _traj(15, 1)]  # one group of G=2
  adv = np.zeros((1, 2, 15), np.float32)
  adv[0, 0, :3] = 1.0
  adv[0, 1, :15] = -1.0
  rows = D.rl_rows(trajs, adv, group_size=2, row_weight=weight)
  assert len(rows) == 18
  per_ep = [sum(r["advantage"] for r in rows if r["prompt_ids"][0] == k) for k in (0, 1)]
  if weight == "step":
    assert per_ep == [3.0, -15.0]
  else:  # mean length 9: each episode's rows sum to +-9
    assert per_ep == pytest.approx([9.0, -9.0], abs=1e-5)
    assert rows[0]["advantage"] == pytest.approx(3.0)
