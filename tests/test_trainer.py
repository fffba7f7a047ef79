"""End to end on the real stack (TextWorldExpress, tiny decoder): SFT -> CSA RL -> eval,
the files a run writes, and resuming after a stop."""

import json
import os

import jax
import numpy as np
import pytest

import experiments
from csa_jax import perf
from csa_jax.config import apply_overrides
from csa_jax.rollout import metrics as M
from csa_jax.rollout.evaluation import summary_table
from csa_jax.run import loggers
from csa_jax.run.checkpoint import Checkpointer
from csa_jax.run.trainer import Trainer
from tests import tiny_runs


def tiny_cfg(iterations, demos_dir=None):
  """The shared tiny TWX run (tests/tiny_runs.py) on quickstart_coin, greedy and sampled
  held-out evaluations of 6 episodes; demos_dir: the session's demonstrations unless
  given."""
  return tiny_runs.twx_cfg("quickstart_coin", iterations, demos_dir or tiny_runs.demos_dir(),
                           "algo.minibatch_size=16", "eval.num_episodes=6", "eval.greedy=true")


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
  assert "SFT + RL" in table and "mean length (greedy)" in table

  # Resume: one more iteration continues from the last checkpoint, nothing repeated,
  # and lines logged after that checkpoint (as by a crash) are dropped, not duplicated.
  loggers.MetricsWriter(work, tensorboard=False).write(3, {"rollout/success": -1.0})
  summary2 = Trainer(tiny_cfg(3), work, resume=True).run()
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert [r["step"] for r in rl] == [1, 2, 3]
  assert rl[2]["rollout/success"] >= 0.0  # the stale line is gone
  assert rl[2]["perf/env_steps_total"] > rl[1]["perf/env_steps_total"]
  assert summary2["sft"] == summary["sft"]  # SFT was not redone


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tiny_hf_checkpoint(ckpt, extra_text="", max_seq_len=256):
  """A tiny Qwen2-shaped HF directory: weights, tokenizer.json, chat template."""
  import json as _json

  from flax import nnx

  from csa_jax.model import Decoder, ModelConfig, hf
  from csa_jax.model.tokenizer import Tokenizer, train_bpe

  tok = train_bpe(["Task: Your task is to find the coin. move north take coin <|user|>"
                   "<|assistant|> You are in the kitchen." + extra_text] * 20, 300)
  cfg = ModelConfig.tiny(vocab_size=320, hidden_size=32, intermediate_size=64, head_dim=8,
                         num_heads=2, num_kv_heads=1, max_seq_len=max_seq_len, qkv_bias=True,
                         tie_embeddings=True)
  hf.save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), str(ckpt))
  tok.save(str(ckpt))
  (ckpt / "tokenizer_config.json").write_text(_json.dumps(
      {"eos_token": "<eos>", "pad_token": "<pad>", "chat_template": CHAT_TEMPLATE}))
  assert Tokenizer.from_hf_dir(str(ckpt)).chat_template
  return tok


def test_pretrained_checkpoint_with_chat_template(tmp_path):
  """model_path: an HF directory (weights, tokenizer.json, chat template) is the policy."""
  ckpt = tmp_path / "ckpt"
  tok = _tiny_hf_checkpoint(ckpt)

  base = tiny_cfg(1)
  # The tiny tokenizer spells text out in many tokens: 234 (prompt) and 10 (action) needed.
  cfg_run = apply_overrides(base, [f"model_path={ckpt}", "eval.num_episodes=3",
                                   "rollout.max_prompt_tokens=240", "rollout.max_action_tokens=12",
                                   "eval.sampled=false", "optim.pack_rows=false"])
  work = str(tmp_path / "run")
  trainer = Trainer(cfg_run, work)
  summary = trainer.run()
  assert summary["rl"]["eval/episodes"] == 3
  # The prompts were framed by the checkpoint's chat template.
  assert trainer.fmt.prefix_ids == tuple(tok.encode("<|user|>", specials=True))
  assert trainer.fmt.suffix_ids == tuple(tok.encode("<eos><|assistant|>", specials=True))
  assert trainer.fmt.action_prefix == ""
  assert not os.path.exists(os.path.join(work, "tokenizer.json"))


def test_think_format_run_of_a_pretrained_checkpoint_stops_at_its_env_step_budget(tmp_path):
  """The full-size format on a tiny HF checkpoint: reasoning then <action>...</action>,
  SFT on wrapped expert actions, one RL iteration, and `rl_env_steps` ending RL after the
  iteration that spent it although rl_iterations allows three."""
  from csa_jax.rollout.prompts import THINK_CUE
  from csa_jax.run.checkpoint import Checkpointer

  ckpt = tmp_path / "ckpt"
  _tiny_hf_checkpoint(ckpt, extra_text=THINK_CUE + " <action>take coin</action> hmm",
                      max_seq_len=512)
  cfg = apply_overrides(tiny_cfg(3), [
      f"model_path={ckpt}", "eval.num_episodes=3", "eval.sampled=false",
      "rollout.action_format=think", "rollout.max_prompt_tokens=400",
      "rollout.max_action_tokens=40", "rl_env_steps=1", "optim.micro_batch_size=8"])
  work = str(tmp_path / "run")
  trainer = Trainer(cfg, work)
  summary = trainer.run()
  assert trainer.fmt.action_format == "think" and trainer.fmt.action_prefix == ""
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  assert np.isfinite(next(r for r in recs if "sft/nll" in r)["sft/nll"])
  rl = [r for r in recs if "rollout/success" in r]
  assert [r["step"] for r in rl] == [1]  # the budget (1 step) is spent by the first iteration
  assert np.isfinite(rl[0]["loss/pg_loss"])
  # An untrained policy rarely writes one well-formed wrapper: malformed answers are invalid.
  assert rl[0]["rollout/invalid_action_frac"] > 0
  final = [r for r in recs if "eval/success" in r][-1]
  assert final["step"] == 1 and summary["rl"]["eval/episodes"] == 3
  tree, meta = Checkpointer(os.path.join(work, "checkpoints")).read()
  assert (meta["phase"], meta["iteration"]) == ("done", 1)
  del tree


def test_process_pool_trainer_reaches_credit_metrics(tmp_path):
  """The slow ALFWorld test's path, fast: TextWorldExpress environments in worker
  processes, their oracle step labels through the pickled results into credit/."""
  cfg = apply_overrides(tiny_cfg(1), [
      "env.pool_backend=process", "rollout.num_envs=3", "sft.num_demos=4",
      "eval.num_episodes=3", "eval.sampled=false", "optim.pack_rows=false"])
  summary = Trainer(cfg, str(tmp_path / "run")).run()
  assert summary["rl"]["eval/episodes"] == 3
  recs = M.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert len(rl) == 1 and rl[0]["rollout/episodes"] == 6
  # Every TextWorldExpress step carries a label (the engine's score change).
  assert rl[0]["credit/labelled_steps"] == rl[0]["rollout/env_steps"] > 0
  assert "credit/spearman" in rl[0]


@pytest.mark.slow
def test_alfworld_end_to_end_through_process_pool(tmp_path):
  cfg = experiments.get_experiment("alfworld_tiny_csa")
  cfg = apply_overrides(cfg, [
      "sft.num_demos=2", "sft.epochs=1", "sft.batch_size=8", "rollout.tasks_per_iter=1",
      "rollout.group_size=2", "rollout.num_envs=2", "rollout.max_turns=3",
      "rollout.max_prompt_tokens=256", "algo.minibatch_size=8", "eval.num_episodes=2",
      "eval.every=0", "rl_iterations=1", "env.num_train_tasks=2", "env.kwargs.num_train=2",
      "env.kwargs.num_eval=2", f"env.kwargs.cache_dir={tmp_path / 'games'}",
      "model.max_seq_len=288", f"sft.demos_dir={tmp_path / 'demos'}",
  ])
  summary = Trainer(cfg, str(tmp_path / "run")).run()
  assert summary["rl"]["eval/episodes"] == 2
  recs = M.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert rl and rl[0]["rollout/episodes"] == 2
  assert rl[0]["credit/labelled_steps"] > 0  # planner oracle labels reached the metrics


def test_the_keydoor_quickstart_end_to_end_writes_per_episode_outcomes(tmp_path):
  """The default experiment (KeyDoor h4, CSA) through the trainer, cut to seconds: SFT on
  the noisy expert's episodes (lost ones too), RL, held-out evaluations whose per-episode
  records match the logged rates task by task; a second run from its SFT start copies
  the SFT episodes, so each run's file pairs SFT and RL on the same tasks."""
  cfg = apply_overrides(experiments.get_experiment("quickstart"), [
      f"sft.demos_dir={tmp_path / 'demos'}", "sft.num_demos=8", "sft.epochs=1",
      "sft.batch_size=16", "rollout.tasks_per_iter=2", "rollout.group_size=3",
      "rollout.num_envs=6", "algo.minibatch_size=16", "eval.num_episodes=6",
      "rl_iterations=2", "rl_env_steps=0", "checkpoint_every=1", "env.kwargs.horizon=2",
      "rollout.max_turns=3"])
  work = str(tmp_path / "run")
  summary = Trainer(cfg, work).run()
  recs = M.read_jsonl(os.path.join(work, M.EPISODES_FILE))
  assert {(r["step"], r["policy"]) for r in recs} == {
      (0, "eval"), (0, "eval_sampled"), (2, "eval"), (2, "eval_sampled")}
  for step, key in ((0, "sft"), (2, "rl")):
    for policy in ("eval", "eval_sampled"):
      ep = [r for r in recs if r["step"] == step and r["policy"] == policy]
      assert sorted(r["index"] for r in ep) == list(range(6))
      assert all(r["split"] == "test" and r["length"] == 3 for r in ep)
      assert np.mean([r["success"] for r in ep]) == summary[key][f"{policy}/success"]
      assert [r["return"] for r in ep] == [float(r["success"]) for r in ep]
  # A run that starts from this one's SFT stage carries the same SFT episodes.
  other = str(tmp_path / "other")
  Trainer(apply_overrides(cfg, [f"sft.init_from={work}", "rl_iterations=1"]), other).run()
  sft = lambda path: [r for r in M.read_jsonl(os.path.join(path, M.EPISODES_FILE))
                      if r["step"] == 0]
  assert sft(other) == sft(work)


def test_intermediate_evaluations_and_the_oracle_probability_reach_the_run_files(tmp_path):
  """eval.every with eval.every_episodes and every_greedy=false: the intermediate
  evaluation runs sampled only, on the first tasks; eval.oracle_prob: the right key's
  probability per task at every evaluation (the SFT start's too, also in a run started
  from it), its mean in the metrics."""
  cfg = apply_overrides(experiments.get_experiment("quickstart"), [
      f"sft.demos_dir={tmp_path / 'demos'}", "sft.num_demos=8", "sft.epochs=1",
      "sft.batch_size=16", "rollout.tasks_per_iter=2", "rollout.group_size=3",
      "rollout.num_envs=6", "algo.minibatch_size=16", "eval.num_episodes=6",
      "eval.every=1", "eval.every_episodes=4", "eval.every_greedy=false",
      "eval.oracle_prob=true", "rl_iterations=2", "rl_env_steps=0", "checkpoint_every=1",
      "env.kwargs.horizon=2", "rollout.max_turns=3"])
  work = str(tmp_path / "run")
  Trainer(cfg, work).run()
  recs = M.read_jsonl(os.path.join(work, M.EPISODES_FILE))
  count = lambda step, policy: sum(r["step"] == step and r["policy"] == policy for r in recs)
  assert [count(s, "eval") for s in (0, 1, 2)] == [6, 0, 6]
  assert [count(s, "eval_sampled") for s in (0, 1, 2)] == [6, 4, 6]
  oracle = M.read_jsonl(os.path.join(work, M.ORACLE_FILE))
  assert [sum(r["step"] == s for r in oracle) for s in (0, 1, 2)] == [6, 4, 6]
  assert all(0.0 <= r["prob"] <= 1.0 and r["policy"] == "eval_oracle" for r in oracle)
  lines = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  for step in (0, 1, 2):
    got = [r["eval_oracle/prob"] for r in lines if r["step"] == step and "eval_oracle/prob" in r]
    want = np.mean([r["prob"] for r in oracle if r["step"] == step])
    assert got == [pytest.approx(want)]
  other = str(tmp_path / "other")
  Trainer(apply_overrides(cfg, [f"sft.init_from={work}", "rl_iterations=1"]), other).run()
  start = lambda path: [r for r in M.read_jsonl(os.path.join(path, M.ORACLE_FILE))
                        if r["step"] == 0]
  assert start(other) == start(work)


def _shared_prefix_cfg(tmp_path, share, iterations):
  """The keydoor quickstart cut to seconds, with micro-batches of 2 rows: too long for two
  to share a sequence, so they are laid out unpacked and (share on) both phases split off
  the prompt tokens every row starts with."""
  sets = [f"sft.demos_dir={tmp_path / 'demos'}", "sft.num_demos=8", "sft.epochs=1",
          "sft.batch_size=16", "rollout.tasks_per_iter=2", "rollout.group_size=3",
          "rollout.num_envs=6", "algo.minibatch_size=16", "optim.micro_batch_size=2",
          "eval.num_episodes=3", "eval.sampled=false", "rl_env_steps=0",
          "checkpoint_every=1", "env.kwargs.horizon=2", "rollout.max_turns=3",
          f"optim.share_prefix={share}", f"rl_iterations={iterations}"]
  return apply_overrides(experiments.get_experiment("quickstart"), sets)


def test_a_shared_prefix_run_lays_out_prefixed_minibatches_and_trains_as_without(tmp_path):
  """optim.share_prefix on: SFT and RL run end to end on prefixed minibatches, and SFT's
  losses are those of the same run without sharing up to float rounding."""
  runs = {}
  for share, iterations in ((True, 2), (False, 0)):
    work = str(tmp_path / f"share_{share}")
    trainer = Trainer(_shared_prefix_cfg(tmp_path, share, iterations), work)
    trainer.run()
    runs[share] = trainer, M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  trainer, recs = runs[True]
  assert trainer.pack_counts == {"sft": [], "rl": []}  # every minibatch unpacked
  assert set(trainer.prefix_lens) == {"sft", "rl"}
  assert all(len(v) == 1 and v[0] > 0 for v in trainer.prefix_lens.values())
  rl = [r for r in recs if "rollout/success" in r]
  assert [r["step"] for r in rl] == [1, 2]
  assert all(np.isfinite(r["loss/pg_loss"]) and 0 < r["perf/train_pad_frac"] < 1 for r in rl)
  nll = lambda recs: [r["sft/nll"] for r in recs if "sft/nll" in r]
  assert runs[False][0].prefix_lens == {}
  np.testing.assert_allclose(nll(recs), nll(runs[False][1]), rtol=1e-5)


def test_a_shared_prefix_run_resumed_ends_bitwise_where_the_whole_run_ends(tmp_path):
  """A shared-prefix run stopped after RL iteration 1 and resumed to 2 equals the run of 2
  iterations bit for bit (parameters, optimizer state, every metric but wall-clock
  times): the resumed run restores the prefix lengths its update compiled for."""
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  Trainer(_shared_prefix_cfg(tmp_path, True, 2), whole).run()
  Trainer(_shared_prefix_cfg(tmp_path, True, 1), parts).run()
  resumed = Trainer(_shared_prefix_cfg(tmp_path, True, 2), parts, resume=True)
  resumed.run()
  assert resumed.prefix_lens["rl"]  # restored, then used: the update ran on prefixed rows
  states = []
  for work in (whole, parts):
    ckpt = Checkpointer(os.path.join(work, "checkpoints"))
    tree, meta = ckpt.read()
    ckpt.close()
    assert meta["phase"] == "done" and meta["iteration"] == 2
    states.append((tree, meta["prefix_lens"]))
  assert states[0][1] == states[1][1]
  leaves = [jax.tree.leaves(tree) for tree, _ in states]
  assert len(leaves[0]) == len(leaves[1]) > 0
  for a, b in zip(*leaves):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  logged = lambda work: [{k: v for k, v in r.items() if not perf.is_wall_clock(k)}
                         for r in M.read_jsonl(os.path.join(work, "metrics.jsonl"))]
  got = logged(parts)
  # The shorter run's final evaluation (its own line at iteration 1) stays in its log.
  shorter_eval = [r for r in got if r["step"] == 1 and "rollout/success" not in r]
  assert len(shorter_eval) == 1
  got.remove(shorter_eval[0])
  assert got == logged(whole)
