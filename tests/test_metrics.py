"""Credit accuracy (Spearman) against an independent computation; writers and plot."""

import os

import numpy as np
import pytest

from csa_jax import loggers
from csa_jax import metrics as M
from csa_jax.rollout import Step, Trajectory


def _spearman_reference(a, o):
  """Spearman's rho by its definition with average ranks, with plain Python loops."""
  def ranks(x):
    out = []
    for v in x:
      less = sum(1 for w in x if w < v)
      equal = sum(1 for w in x if w == v)
      out.append(less + (equal - 1) / 2.0)
    return np.array(out)
  ra, ro = ranks(list(a)), ranks(list(o))
  ra, ro = ra - ra.mean(), ro - ro.mean()
  return float((ra * ro).sum() / np.sqrt((ra ** 2).sum() * (ro ** 2).sum()))


def test_credit_accuracy_matches_reference_with_ties_and_masks():
  rng = np.random.default_rng(0)
  adv = rng.normal(size=(3, 4, 5)).round(1)  # rounding makes ties
  oracle = rng.integers(-1, 2, size=(3, 4, 5)).astype(np.float32)
  oracle[0, 0, :] = np.nan
  mask = rng.random((3, 4, 5)) < 0.8
  got = M.credit_accuracy(adv, oracle, mask)
  sel = mask & np.isfinite(oracle)
  assert got["credit/labelled_steps"] == sel.sum()
  assert got["credit/spearman"] == pytest.approx(_spearman_reference(adv[sel], oracle[sel]),
                                                 abs=1e-12)


def test_credit_accuracy_nan_without_labels_or_spread():
  adv = np.ones((1, 2, 3))
  assert np.isnan(M.credit_accuracy(adv, np.full((1, 2, 3), np.nan), np.ones((1, 2, 3)))
                  ["credit/spearman"])
  assert np.isnan(M.credit_accuracy(adv, np.arange(6.).reshape(1, 2, 3), np.ones((1, 2, 3)))
                  ["credit/spearman"])


def _traj(n, won, invalid=0, error=None, dropped=0):
  steps = [Step([1], [2], [0.0], "a", "o", 0.0, 0, valid=i >= invalid, oracle_label=None,
                actions_dropped=dropped * (i == 0)) for i in range(n)]
  return Trajectory(("test", 0), steps, won=won, error=error)


def test_episode_metrics():
  m = M.episode_metrics([_traj(2, True), _traj(4, False, invalid=1, error="boom", dropped=9)],
                        "eval")
  assert m["eval/success"] == 0.5 and m["eval/episode_len"] == 3.0
  assert m["eval/env_steps"] == 6 and m["eval/invalid_action_frac"] == pytest.approx(1 / 6)
  assert m["eval/errors"] == 1
  assert m["eval/actions_dropped"] == pytest.approx(9 / 6)  # per step


def test_a_damaged_line_is_dropped_with_one_warning(tmp_path, capsys):
  """A line cut short by a crash, with the next write appended to it, is not JSON: it and
  the other damaged lines are dropped with one warning; a cut last line is dropped
  silently where a resume expects one."""
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a"{"step": 2, "a": 2.0}\n[1]\n'
                  '{"step": 3, "a": NaN}\n\n{"step": 4, "a"')
  recs = M.read_jsonl(str(path), tolerate_partial_last=True)
  assert [r["step"] for r in recs] == [0, 3] and np.isnan(recs[1]["a"])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"warning: {path}: dropped 2 damaged line(s) "
                                              "(line 2, 3)"), err
  assert [r["step"] for r in M.read_jsonl(str(path))] == [0, 3]  # the cut last line too
  assert "dropped 3 damaged line(s) (line 2, 3, 6)" in capsys.readouterr().err


def test_decisive_auc_matches_pair_counting():
  """AUC of the credit of +1-labelled steps against -1-labelled ones, by counting pairs
  (ties half); 0-labelled steps (routine) and masked steps take no part."""
  rng = np.random.default_rng(1)
  adv = rng.normal(size=(3, 4, 6)).round(1)
  oracle = rng.choice([-1.0, 0.0, 1.0, np.nan], size=(3, 4, 6))
  mask = rng.random((3, 4, 6)) < 0.8
  sel = mask & np.isfinite(oracle)
  pos, neg = adv[sel & (oracle > 0)], adv[sel & (oracle < 0)]
  want = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
  got = M.credit_accuracy(adv, oracle, mask)["credit/decisive_auc"]
  assert got == pytest.approx(want, abs=1e-12)
  assert M.auc([2.0, 3.0], [1.0]) == 1.0 and M.auc([1.0], [1.0, 2.0]) == 0.25
  assert np.isnan(M.auc([], [1.0])) and np.isnan(
      M.credit_accuracy(adv, np.zeros(adv.shape), mask)["credit/decisive_auc"])


def _episode(index, won, n, rewards):
  steps = [Step([1], [2], [0.0], "a", "o", r, 0, valid=True, oracle_label=None)
           for r in rewards[:n]]
  return Trajectory(("test", index), steps, won=won)


def test_episode_records_and_replayed_evaluations_written_once(tmp_path):
  trajs = [_episode(7, True, 3, [0.0, 0.0, 1.0]), _episode(2, False, 2, [0.0, -0.5])]
  recs = M.episode_records(trajs, 5, "eval_sampled")
  assert recs == [
      {"step": 5, "policy": "eval_sampled", "split": "test", "index": 7, "success": 1,
       "length": 3, "return": 1.0},
      {"step": 5, "policy": "eval_sampled", "split": "test", "index": 2, "success": 0,
       "length": 2, "return": -0.5}]
  w = loggers.MetricsWriter(str(tmp_path), tensorboard=False)
  w.episodes(M.episode_records(trajs, 0, "eval"))
  w.episodes(recs)
  w.episodes(recs)  # a resumed run replays the evaluation: replaced, not doubled
  got = M.read_jsonl(str(tmp_path / M.EPISODES_FILE))
  assert [(r["step"], r["policy"], r["index"]) for r in got] == [
      (0, "eval", 7), (0, "eval", 2), (5, "eval_sampled", 7), (5, "eval_sampled", 2)]
  w.drop_after(3)  # resuming from iteration 3 drops the later evaluation
  assert [r["step"] for r in M.read_jsonl(str(tmp_path / M.EPISODES_FILE))] == [0, 0]
  w.close()
