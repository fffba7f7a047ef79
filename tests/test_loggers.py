"""The run's loggers: metrics.jsonl, TensorBoard and the learning curve; and Weights &
Biases, offline, holding the very scalars of metrics.jsonl, read back with wandb's own
reader of its run files (`wandb leet inspect --json`)."""

import json
import math
import os
import subprocess
import sys

import pytest

from csa_jax.config import LogConfig
from csa_jax.rollout import metrics as M
from csa_jax.rollout.setup_checks import SetupError
from csa_jax.run import loggers
from csa_jax.run.trainer import Trainer
from tests import tiny_runs


def test_writer_and_plot(tmp_path):
  w = loggers.MetricsWriter(str(tmp_path))
  w.write(0, {"eval/success": 0.2, "perf/env_steps_total": 0})
  for i in range(1, 4):
    w.write(i, {"rollout/success": 0.1 * i, "perf/env_steps_total": 100 * i})
  w.write(4, {"eval/success": 0.5, "perf/env_steps_total": 300, "credit/spearman": float("nan")})
  w.close()
  recs = M.read_jsonl(w.path)
  assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
  assert os.listdir(tmp_path / "tb")
  assert not os.path.exists(tmp_path / "wandb")  # only when the config asks
  png = loggers.plot_learning_curve(w.path, str(tmp_path / "c.png"))
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _no_wandb_home(monkeypatch, tmp_path):
  for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                   ("WANDB_DATA_DIR", "data")):
    monkeypatch.setenv(var, str(tmp_path / sub))  # nothing written outside the test


def test_wandb_online_without_a_login_is_one_line(tmp_path, monkeypatch):
  _no_wandb_home(monkeypatch, tmp_path)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  monkeypatch.setenv("WANDB_MODE", "online")
  with pytest.raises(SetupError, match=r"^log.wandb: No API key configured.*WANDB_MODE=offline"):
    loggers.MetricsWriter(str(tmp_path / "run"), tensorboard=False,
                          wandb=LogConfig(wandb=True))


def _wandb_history(run_dir) -> list[dict]:
  """The rows of the W&B run files under `run_dir`, by wandb's own reader, without the
  keys W&B adds itself (_step, _runtime, _timestamp)."""
  out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                        str(run_dir)], capture_output=True, text=True, timeout=120, check=True)
  rows = [json.loads(line)["history"]["item"] for line in out.stdout.splitlines()
          if '"type":"history"' in line]
  return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def _same(a, b) -> bool:
  a, b = float(a), float(b)  # W&B writes a NaN as "NaN" and 2.0 as 2
  return (math.isnan(a) and math.isnan(b)) or a == b


def test_a_run_with_wandb_offline_logs_the_metrics_lines_to_its_run(tmp_path, monkeypatch,
                                                                       twx_sft_start):
  _no_wandb_home(monkeypatch, tmp_path)
  monkeypatch.setenv("WANDB_MODE", "offline")
  src, _ = twx_sft_start
  cfg = tiny_runs.twx_cfg("twx_coin_grpo", 1, str(tmp_path / "no_demos"), f"sft.init_from={src}",
                          "log.wandb=true", "log.wandb_project=csa-test")
  work = tmp_path / "run"
  Trainer(cfg, str(work)).run()
  (run_dir,) = [d for d in (work / "wandb").iterdir() if d.name.startswith("offline-run-")]
  assert (run_dir / f"run-{(work / 'wandb' / 'run_id').read_text()}.wandb").exists()
  lines = M.read_jsonl(str(work / "metrics.jsonl"))
  rows = _wandb_history(run_dir)
  assert len(rows) == len(lines) >= 3  # SFT's evaluation, one RL iteration, the final one
  for line, row in zip(lines, rows):
    assert sorted(row) == sorted(line)
    bad = [k for k in line if not _same(line[k], row[k])]
    assert not bad, (bad, line, row)
