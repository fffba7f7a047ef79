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
from csa_jax.rollout import metrics as M
from csa_jax.run import sft_progress
from csa_jax.run.checkpoint import Checkpointer
from csa_jax.run.signals import Interrupted
from csa_jax.run.trainer import Trainer
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
  from csa_jax.run import posttrain
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


def test_a_damaged_metrics_line_stops_neither_the_commands_nor_a_resume(run, capsys, tmp_path):
  """A metrics.jsonl line cut by a crash, with the next line appended to it: `--eval`
  works, and a resume drops the line with one warning (as a damaged checkpoint is dropped)
  and rewrites the file without it."""
  _, src, _ = run
  work = str(tmp_path / "damaged")
  shutil.copytree(src, work)
  path = os.path.join(work, "metrics.jsonl")
  with open(path) as f:
    lines = f.readlines()
  with open(path, "w") as f:
    f.writelines([lines[0], lines[1][:len(lines[1]) // 2], *lines[2:]])
  _main_ok(capsys, "--workdir", work, "--eval", "--set", "eval.num_episodes=1",
           "--set", "eval.sampled=false")
  Trainer(tiny_runs.quickstart_cfg(), work, resume=True).run()  # finished: nothing to redo
  err = capsys.readouterr().err
  assert err.count("damaged line") == 1 and "Traceback" not in err, err
  assert f"warning: {path}: dropped 1 damaged line(s) (line 2)" in err
  kept = [json.dumps(json.loads(line)) for line in [lines[0], *lines[3:]]]
  assert [json.dumps(r) for r in M.read_jsonl(path)] == kept  # (NaN != NaN in a dict)
  assert "damaged" not in capsys.readouterr().err


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


# ----------------------------------------------------------------------------------------
# A LoRA run over a pretrained checkpoint: the commands build the policy the trainer built
# (its adapters over the checkpoint's frozen base), so each opens the run.

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tiny_llama_dir(path):
  """A random Llama written by transformers, with this project's BPE and a chat template."""
  import torch
  import transformers
  from csa_jax.model.tokenizer import train_bpe
  from tests.test_hf_parity import _hf_model
  torch.set_num_threads(1)
  _hf_model((torch, transformers), "llama", seed=5, hidden_size=32, intermediate_size=64,
            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
            ).save_pretrained(str(path))
  tok = train_bpe(["Task: Your task is to find the coin. move north take coin <|user|>"
                   "<|assistant|> You are in the kitchen."] * 20, 300)
  tok.save(str(path))
  (path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": "<eos>", "pad_token": "<pad>", "chat_template": CHAT}))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("lora_pretrained")
  base = root / "base"
  _tiny_llama_dir(base)
  cfg = tiny_runs.twx_cfg("quickstart_coin", 1, tiny_runs.demos_dir(), *[
      f"model_path={base}", "model.lora.rank=4", "model.lora.alpha=8",
      "eval.num_episodes=2", "eval.sampled=false", "eval.greedy=true",
      "rollout.max_prompt_tokens=240", "rollout.max_action_tokens=12"])
  work = str(root / "run")
  summary = Trainer(cfg, work).run()
  return str(base), work, summary


@pytest.mark.slow
def test_a_lora_run_over_a_pretrained_checkpoint_opens_with_every_command(lora_run, capsys,
                                                                           tmp_path):
  import peft
  import torch
  import transformers
  from csa_jax.run import posttrain
  base, work, summary = lora_run
  out = _main_ok(capsys, "--workdir", work, "--eval")
  with open(os.path.join(work, "eval", "step_1.json")) as f:
    result = json.load(f)
  for key, value in summary["rl"].items():  # the run's own final evaluation, repeated
    assert result["metrics"][key] == pytest.approx(value, abs=1e-9), key
  out = _main_ok(capsys, "--workdir", work, "--play", "1")
  assert out.count("=== greedy episode, test task") == 1 and "<|assistant|>" in out

  export = tmp_path / "hf"
  out = _main_ok(capsys, "--workdir", work, "--export-hf", str(export))
  assert "model.safetensors" in out and posttrain.ADAPTER_DIR in out
  saved = posttrain.load(work)
  ids = saved.tok.encode("Task: find the coin. You are in the kitchen. move north")
  ours = np.asarray(saved.model()(jnp.asarray([ids])))
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(export),
                                                             torch_dtype=torch.float32).eval()
  plain = transformers.AutoModelForCausalLM.from_pretrained(base,
                                                            torch_dtype=torch.float32).eval()
  with torch.no_grad():
    got_merged = merged(torch.tensor([ids])).logits.numpy()
    got_base = plain(torch.tensor([ids])).logits.numpy()
    adapted = peft.PeftModel.from_pretrained(plain, str(export / posttrain.ADAPTER_DIR)).eval()
    got_peft = adapted(torch.tensor([ids])).logits.numpy()

  def rel(a):
    return float(np.abs(ours - a).max() / np.abs(a).max())

  assert rel(got_base) > 10 * REL_TOL  # training moved the adapters off the base
  assert rel(got_merged) < REL_TOL and rel(got_peft) < REL_TOL
  with open(export / "csa_jax.json") as f:
    assert json.load(f)["adapter"] == {"dir": posttrain.ADAPTER_DIR, "base": base}


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
  from studies import runs  # pylint: disable=import-outside-toplevel
  work = str(tmp_path / "prompted_seed0")
  argv = PROMPTED + ["--set", f"model_path={small_model}", "--workdir", work]
  out = _main_ok(capsys, *argv)
  assert "prompted baseline" in out and "greedy" in out and "sampled" in out
  with open(os.path.join(work, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["model"]["hidden_size"] == 256 and cfg["model_origin"]["gguf"]["sha256"]
  assert cfg["provenance"]["policy"].startswith("prompted")
  # A study reads it as it reads a run: its evaluation at step 0, episode by episode.
  loaded = runs.load_run("", "prompted_seed0", work)
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
  assert runs.load_run("", "prompted_seed0", work).steps == loaded.steps
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
