"""Episode metrics, the run's JSONL files and their damaged lines."""

import os

import numpy as np
import pytest

from csa_jax.rollout import metrics as M
from csa_jax.run import loggers
from tests.factories import episode, step


def test_episode_metrics():
  short = episode([step(), step()], won=True)
  long = episode([step(valid=i > 0, actions_dropped=9 * (i == 0)) for i in range(4)],
                 error="boom")
  m = M.episode_metrics([short, long], "eval")
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


def test_episode_records_and_replayed_evaluations_written_once(tmp_path):
  trajs = [episode([step(reward=r) for r in (0.0, 0.0, 1.0)], won=True, task=("test", 7)),
           episode([step(reward=r) for r in (0.0, -0.5)], task=("test", 2))]
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
