"""End to end on the real stack (TextWorldExpress, tiny decoder): SFT -> CSA RL -> eval,
the files a run writes, and resuming after a stop."""

import dataclasses
import json
import os

import numpy as np

import experiments
from csa_jax import metrics as M
from csa_jax.config import apply_overrides
from csa_jax.trainer import Trainer, summary_table


def tiny_cfg(iterations):
  cfg = experiments.get_experiment("quickstart")
  return apply_overrides(cfg, [
      "sft.num_demos=6", "sft.epochs=1", "sft.batch_size=16",
      "rollout.tasks_per_iter=2", "rollout.group_size=3", "rollout.num_envs=6",
      "rollout.max_turns=4", "rollout.max_prompt_tokens=96", "rollout.max_action_tokens=6",
      "algo.minibatch_size=16", "eval.num_episodes=6", f"rl_iterations={iterations}",
      "checkpoint_every=1", "tokenizer.vocab_size=512", "model.vocab_size=512",
      "model.max_seq_len=128", "env.kwargs.step_limit=4",
  ])


def test_quickstart_shape_end_to_end_and_resume(tmp_path):
  work = str(tmp_path / "run")
  summary = Trainer(tiny_cfg(2), work).run()
  for key in ("sft", "rl"):
    for prefix in ("eval", "eval_sampled"):
      m = summary[key]
      assert m[f"{prefix}/episodes"] == 6
      assert 0.0 <= m[f"{prefix}/success"] <= 1.0 and 1.0 <= m[f"{prefix}/episode_len"] <= 4.0
  for f in ("metrics.jsonl", "learning_curve.png", "config.json", "tokenizer.json"):
    assert os.path.exists(os.path.join(work, f)), f
  assert os.listdir(os.path.join(work, "tb"))
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert [r["step"] for r in rl] == [1, 2]
  for r in rl:
    assert np.isfinite(r["loss/pg_loss"]) and r["rollout/episodes"] == 6
  assert rl[1]["perf/env_steps_total"] > rl[0]["perf/env_steps_total"] > 0
  with open(os.path.join(work, "config.json")) as f:
    assert json.load(f)["algo"]["estimator"] == "csa"
  table = summary_table(summary, "test")
  assert "SFT + RL" in table and "episode length" in table

  # Resume: one more iteration continues from the last checkpoint, nothing repeated.
  summary2 = Trainer(tiny_cfg(3), work, resume=True).run()
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert [r["step"] for r in rl] == [1, 2, 3]
  assert rl[2]["perf/env_steps_total"] > rl[1]["perf/env_steps_total"]
  assert summary2["sft"] == summary["sft"]  # SFT was not redone
