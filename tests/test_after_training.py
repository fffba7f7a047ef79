"""After training, on one tiny run (TextWorldExpress, tiny decoder, one RL iteration):
`--eval` repeats the run's own held-out numbers, `--export-hf` writes a checkpoint that
transformers loads with the same logits, `--play` prints episodes; and SFT stopped by a
signal saves its progress and, resumed, ends where the uninterrupted SFT ends. Before any
training, `--prompted` evaluates a pretrained model (a small GGUF import) and writes its
results where a study reads a run's evaluation."""

import json
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import launch
from csa_jax import metrics as M
from csa_jax import sft_progress
from csa_jax.checkpoint import Checkpointer
from csa_jax.signals import Interrupted
from csa_jax.trainer import Trainer
from tests import tiny_runs
from tests.gguf_files import train_vocab, write_gguf

REL_TOL = 1e-4  # tests/test_hf_parity.py: fp32 logits within 1e-4 of the logits' scale


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A copy of the session's tiny quickstart_coin run (tests/tiny_runs.py: SFT + 1 RL
  iteration; the credit study reads the same run): `--eval` writes into the run."""
  root = tmp_path_factory.mktemp("after")
  src, summary = tiny_runs.quickstart_run()
  work = str(root / "run")
  shutil.copytree(src, work)
  return root, work, summary


def _main_ok(capsys, *argv):
  assert launch.main(list(argv)) == 0
  return capsys.readouterr().out


def test_eval_repeats_the_runs_held_out_evaluation(run, capsys):
  _, work, summary = run
  out = _main_ok(capsys, "--workdir", work, "--eval")
  assert "checkpoint 1" in out and "greedy" in out and "sampled" in out
  with open(os.path.join(work, "eval", "step_1.json")) as f:
    result = json.load(f)
  for key, value in summary["rl"].items():
    assert result["metrics"][key] == pytest.approx(value, abs=1e-9), key
  for prefix in ("eval", "eval_sampled"):
    eps = [e for e in result["episodes"] if e["policy"] == prefix]
    assert [e["index"] for e in eps] == [0, 1, 2, 3]
    assert sum(e["success"] for e in eps) / 4 == summary["rl"][f"{prefix}/success"]
  # The very records of the run's own final evaluation (eval/episodes.jsonl, one format).
  logged = M.read_jsonl(os.path.join(work, M.EPISODES_FILE))
  assert result["episodes"] == [r for r in logged if r["step"] == 1]
  _main_ok(capsys, "--workdir", work, "--eval", "--step", "sft")
  with open(os.path.join(work, "eval", "step_sft.json")) as f:
    sft = json.load(f)
  for key, value in summary["sft"].items():
    assert sft["metrics"][key] == pytest.approx(value, abs=1e-9), key
  assert sft["episodes"] == [r for r in logged if r["step"] == 0]  # SFT is step 0 there
  # Other tasks by --set, greedy only.
  out = _main_ok(capsys, "--workdir", work, "--eval", "--set", "eval.first_task=10",
                 "--set", "eval.num_episodes=2", "--set", "eval.sampled=false")
  assert "tasks 10..11" in out and "sampled " not in out


def test_export_hf_loads_in_transformers_with_the_same_logits(run, capsys, tmp_path):
  import torch
  import transformers
  from csa_jax import posttrain
  _, work, _ = run
  out_dir = tmp_path / "hf"
  out = _main_ok(capsys, "--workdir", work, "--export-hf", str(out_dir))
  assert "config.json" in out and "model.safetensors" in out
  saved = posttrain.load(work)
  tok = transformers.AutoTokenizer.from_pretrained(str(out_dir))
  text = "Task: find the coin. Now: You are in the kitchen. Actions: move north | take coin"
  ids = saved.tok.encode(text)
  assert tok(text, add_special_tokens=False)["input_ids"] == ids
  assert tok.eos_token_id == saved.tok.eos_id and tok.pad_token_id == saved.tok.pad_id
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out_dir),
                                                            torch_dtype=torch.float32)
  with torch.no_grad():
    ref = model(torch.tensor([ids])).logits.numpy()
  ours = np.asarray(saved.model()(jnp.asarray([ids])))
  assert ours.shape == ref.shape
  err = float(np.abs(ours - ref).max() / np.abs(ref).max())
  assert err < REL_TOL, err


def test_play_prints_episodes_as_the_policy_saw_them(run, capsys):
  _, work, _ = run
  out = _main_ok(capsys, "--workdir", work, "--play", "2", "--step", "1")
  assert out.count("=== greedy episode, test task") == 2
  assert out.count("PROMPT (as the policy saw it):") == 2
  assert "  > " in out and "after" in out
  out = _main_ok(capsys, "--workdir", work, "--play", "1", "--sample")
  assert "=== sampled episode, test task 0" in out


@pytest.mark.parametrize("argv, needle", [
    (["--eval"], "need --workdir RUN"),
    (["--workdir", "{tmp}/nothing", "--eval"], "no config.json"),
    (["--workdir", "{run}", "--eval", "--step", "99"], "--step 99: {run} has RL checkpoints 0, 1 and sft"),
    (["--workdir", "{run}", "--eval", "--exp", "twx_coin_grpo"], "drop --exp"),
    (["--workdir", "{run}", "--play", "0"], "--play 0"),
    (["--workdir", "{run}", "--export-hf", "{run}"], "is not empty"),
    (["--workdir", "{run}", "--eval", "--set", "eval.num_episodes=0"],
     "eval.num_episodes must be >= 1"),
], ids=["no-workdir", "not-a-run", "step", "exp", "play0", "export-nonempty", "set"])
def test_after_training_refusals_are_one_line(run, capsys, tmp_path, argv, needle):
  _, work, _ = run
  argv = [a.format(tmp=tmp_path, run=work) for a in argv]
  (tmp_path / "nothing").mkdir()
  with pytest.raises(SystemExit) as e:
    launch.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert err[0].startswith("launch.py: error: ") and needle.format(run=work) in err[0], err


def test_sft_curve_and_config_provenance(run):
  _, work, _ = run
  recs = M.read_jsonl(os.path.join(work, "metrics.jsonl"))
  curve = [r for r in recs if "sft/batch" in r]
  assert [r["sft/batch"] for r in curve] == list(range(1, len(curve) + 1))
  assert len(curve) >= 3 and all(np.isfinite(r["sft/nll"]) for r in curve)
  with open(os.path.join(work, "config.json")) as f:
    prov = json.load(f)["provenance"]
  assert prov["packages"]["jax"] == jax.__version__
  assert prov["git_commit"] is None or len(prov["git_commit"]) == 40


def test_sft_stopped_by_a_signal_saves_its_progress_and_resumes_bit_for_bit(run, tmp_path):
  root, work, _ = run
  cfg = tiny_runs.quickstart_cfg(iterations=0)
  stopped = str(tmp_path / "stopped")
  trainer = Trainer(cfg, stopped)
  trainer.stop.requested = signal.SIGINT  # as if Ctrl-C came during the first batch
  with pytest.raises(Interrupted) as e:
    trainer.run()
  assert "during SFT, after batch 1 of " in str(e.value)
  assert "its progress is saved in" in str(e.value) and e.value.saved
  assert sft_progress.exists(stopped)
  assert not os.path.exists(os.path.join(stopped, "sft")) or not os.listdir(
      os.path.join(stopped, "sft"))

  Trainer(cfg, stopped, resume=True).run()
  assert not sft_progress.exists(stopped)
  ours, _ = Checkpointer(os.path.join(stopped, "sft"), max_to_keep=1).read()
  ref, _ = Checkpointer(os.path.join(work, "sft"), max_to_keep=1).read()
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  curve = [r["sft/batch"] for r in M.read_jsonl(os.path.join(stopped, "metrics.jsonl"))
           if "sft/batch" in r]
  assert curve == list(range(1, len(curve) + 1))  # each batch once, across the stop


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
  """A Hugging Face directory imported from a small GGUF file (ChatML, untrained weights)."""
  from csa_jax.model import gguf  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("small_model")
  write_gguf(root / "m.gguf", train_vocab(), qtype="Q8_0")
  gguf.import_gguf(str(root / "m.gguf"), str(root / "hf"))
  return str(root / "hf")


PROMPTED = ["--exp", "keydoor_h4_csa", "--prompted", "--set", "eval.num_episodes=3",
            "--set", "rollout.max_prompt_tokens=224", "--set", "rollout.max_action_tokens=8"]


def test_prompted_baseline_is_written_as_a_runs_evaluation(small_model, capsys, tmp_path):
  from studies import report  # pylint: disable=import-outside-toplevel
  work = str(tmp_path / "prompted_seed0")
  argv = PROMPTED + ["--set", f"model_path={small_model}", "--workdir", work]
  out = _main_ok(capsys, *argv)
  assert "prompted baseline" in out and "greedy" in out and "sampled" in out
  with open(os.path.join(work, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["model"]["hidden_size"] == 256 and cfg["model_origin"]["gguf"]["sha256"]
  assert cfg["provenance"]["policy"].startswith("prompted")
  # A study reads it as it reads a run: its evaluation at step 0, episode by episode.
  loaded = report.load_run("", "prompted_seed0", work)
  assert loaded.method == "prompted" and list(loaded.steps) == [0]
  for prefix in ("eval", "eval_sampled"):
    episodes = loaded.episodes[(prefix, 0)]
    assert sorted(i for _, i in episodes) == [0, 1, 2]
    assert loaded.steps[0][f"{prefix}/success"] == pytest.approx(
        np.mean([e.success for e in episodes.values()]))
  with open(os.path.join(work, "eval", "step_prompted.json")) as f:
    assert json.load(f)["metrics"] == {k: v for k, v in loaded.steps[0].items()
                                       if k.startswith("eval")}
  # Evaluated again: the same numbers (fixed sampler keys), written once, not twice.
  _main_ok(capsys, *argv)
  assert len(M.read_jsonl(os.path.join(work, "metrics.jsonl"))) == 1
  assert report.load_run("", "prompted_seed0", work).steps == loaded.steps
  assert len(M.read_jsonl(os.path.join(work, M.EPISODES_FILE))) == 6


@pytest.mark.parametrize("argv,needle", [
    (["--exp", "keydoor_h4_csa", "--prompted"], "--prompted evaluates a pretrained model, and "
                                                "keydoor_h4_csa trains one from scratch"),
    (PROMPTED + ["--set", "model_path={model}", "--workdir", "{run}"], "holds a training run"),
    (PROMPTED + ["--set", "model_path={model}", "--resume"], "--prompted trains nothing"),
    (["--workdir", "{run}", "--eval", "--prompted"], "drop --exp"),
], ids=["from-scratch", "a-run", "resume", "after-training"])
def test_prompted_refusals_are_one_line(run, small_model, capsys, argv, needle):
  _, work, _ = run
  with pytest.raises(SystemExit) as e:
    launch.main([a.format(run=work, model=small_model) for a in argv])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert err[0].startswith("launch.py: error: ") and needle in err[0], err
