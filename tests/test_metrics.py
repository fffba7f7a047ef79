"""Episode metrics, writers and plot."""

import os

import pytest

from csa_jax import metrics as M
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


def test_writer_and_plot(tmp_path):
  w = M.MetricsWriter(str(tmp_path))
  w.write(0, {"eval/success": 0.2, "perf/env_steps_total": 0})
  for i in range(1, 4):
    w.write(i, {"rollout/success": 0.1 * i, "perf/env_steps_total": 100 * i})
  w.write(4, {"eval/success": 0.5, "perf/env_steps_total": 300, "credit/spearman": float("nan")})
  w.close()
  recs = M.read_jsonl(w.path)
  assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
  assert os.listdir(tmp_path / "tb")
  png = M.plot_learning_curve(w.path, str(tmp_path / "c.png"))
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_episode_records_and_replayed_evaluations_written_once(tmp_path):
  trajs = [episode([step(reward=r) for r in (0.0, 0.0, 1.0)], won=True, task=("test", 7)),
           episode([step(reward=r) for r in (0.0, -0.5)], task=("test", 2))]
  recs = M.episode_records(trajs, 5, "eval_sampled")
  assert recs == [
      {"step": 5, "policy": "eval_sampled", "split": "test", "index": 7, "success": 1,
       "length": 3, "return": 1.0},
      {"step": 5, "policy": "eval_sampled", "split": "test", "index": 2, "success": 0,
       "length": 2, "return": -0.5}]
  w = M.MetricsWriter(str(tmp_path), tensorboard=False)
  w.episodes(M.episode_records(trajs, 0, "eval"))
  w.episodes(recs)
  w.episodes(recs)  # a resumed run replays the evaluation: replaced, not doubled
  got = M.read_jsonl(str(tmp_path / M.EPISODES_FILE))
  assert [(r["step"], r["policy"], r["index"]) for r in got] == [
      (0, "eval", 7), (0, "eval", 2), (5, "eval_sampled", 7), (5, "eval_sampled", 2)]
  w.drop_after(3)  # resuming from iteration 3 drops the later evaluation
  assert [r["step"] for r in M.read_jsonl(str(tmp_path / M.EPISODES_FILE))] == [0, 0]
  w.close()
