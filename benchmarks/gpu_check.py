"""One-shot check on a lent GPU: HF parity, sampler and update speed, RL iterations.

Before the device call, here in the checkout that travels (the session's own), once:
`bash benchmarks/gpu_wheels.sh` fills the git-ignored `.whl/` with the 25 wheels the
GPU image lacks (benchmarks/gpu_wheels.txt: grain, tensorflow-datasets, array-record,
tensorboardX, alfworld, textworld, fast-downward-textworld built here, and their missing
needs; 29 MB, so the working tree plus `.whl` stays under the tool's 64 MiB). Then the
device tool's `run` (kind nvidia-h200), with carry [".whl"] and timeout_s 600:

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --full --json $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log

Expected duration: 5 to 8 minutes on one H200 (not yet measured there: no GPU was lent
while it was written). Each part prints its wall time as it ends and the log in $OUT
comes back even if the call is cut, so a rerun can take the rest with `--parts`. Parts:

  parity: a random Qwen2.5-0.5B-shaped Qwen2ForCausalLM (tied, q/k/v biases) and a
     small Llama with llama3 rope scaling, saved with `save_pretrained`, loaded with
     our `from_pretrained`: fp32 logits relative error (matmul precision "highest" on
     both sides, torch TF32 off), greedy tokens of our sampler vs `generate`, bf16
     logits error and top-1 agreement. `--pytest` also runs tests/test_hf_parity.py
     and tests/test_tokenizer_hf.py there (without the suite's conftest, whose
     dependency list names environments this check does not carry);
  sampler: benchmarks/sampler.py at 0.5B in bf16, ours vs transformers' `generate`
     on the same GPU, B=32 P=128 N=128 (its ratio line);
  mfu: benchmarks/train_step.py (the RL step with remat, bf16 compute over fp32
     master weights and AdamW) at 0.5B and at 1.5B, B=8 rows of L=1024, each as a
     fraction of the bf16 matmul peak measured in the same run;
  iterations: `launch.py --exp alfworld_csa` (the verl-agent recipe: think format,
     chat template, KL to the SFT policy, CSA advantages) through the real trainer on a
     random 0.5B-shaped checkpoint with a byte-level BPE fitted to ALFWorld's text,
     scaled down (FULL.overrides below: 2 tasks x 4 rollouts of 6 turns, prompt and
     action budgets 1024 and 64, SFT on 4 demonstrations, 2 RL iterations, one
     held-out episode per evaluation); prints each iteration's `perf/` metrics and the
     environment steps per second of RL time.

`--tiny` runs the same parts on CPU at the tiny size (a 2-layer model, 1 RL iteration);
tests/test_gpu_check.py runs it with only the image's packages and the carried wheels
importable (benchmarks/gpu_image.py).

  python benchmarks/gpu_check.py --full [--parts mfu,iterations]   # on the GPU machine
  python benchmarks/gpu_check.py --tiny                            # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

T0 = time.perf_counter()
PARTS = ("parity", "sampler", "mfu", "iterations")


def log(msg: str) -> None:
  print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sizes of one mode (tiny on CPU, full on the GPU)."""
  size: str  # benchmarks/sampler.py's SIZES key of the parity / sampler / policy model
  llama_size: str
  device: str  # torch's device
  dtype: str  # compute dtype of the speed parts
  parity_new_tokens: int
  sampler: dict  # benchmarks/sampler.py run() arguments
  mfu: tuple  # (size, B, L) per train_step measurement
  mfu_reps: int
  peak_n: int | None
  overrides: tuple  # launch.py --set overrides of the iterations part


ITER_COMMON = (
    "mesh=1x1", "env.kwargs.num_eval=1", "rollout.tasks_per_iter=2", "sft.epochs=1",
    "eval.num_episodes=1", "eval.sampled=false", "eval.every=0", "checkpoint_every=1000",
    "rollout.prefill_chunk=0")

FULL = Plan(size="0.5b", llama_size="small", device="cuda", dtype="bfloat16",
            parity_new_tokens=32,
            sampler=dict(B=32, P=128, N=128, reps=3),
            mfu=(("0.5b", 8, 1024), ("1.5b", 8, 1024)), mfu_reps=5, peak_n=None,
            overrides=ITER_COMMON + (
                "env.num_train_tasks=4", "env.kwargs.num_train=4", "sft.num_demos=4",
                "rollout.max_turns=6", "rollout.group_size=4", "rollout.num_envs=8",
                "rollout.max_prompt_tokens=1024", "rollout.max_action_tokens=64",
                "rl_iterations=2"))

TINY = Plan(size="tiny", llama_size="tiny", device="cpu", dtype="float32",
            parity_new_tokens=16,
            sampler=dict(B=4, P=16, N=16, reps=1),
            mfu=(("tiny", 2, 64),), mfu_reps=2, peak_n=256,
            overrides=ITER_COMMON + (
                "env.num_train_tasks=2", "env.kwargs.num_train=2", "sft.num_demos=2",
                "rollout.max_turns=2", "rollout.group_size=2", "rollout.num_envs=4",
                "rollout.max_prompt_tokens=384", "rollout.max_action_tokens=48",
                "model.dtype=float32", "model.remat=false", "optim.micro_batch_size=0",
                "rl_iterations=1"))


# ----------------------------------------------------------------------------------------
# 1. Parity.


def run_pytests() -> str:
  if importlib.util.find_spec("pytest") is None:
    log("pytest is not installed here: small parity tests skipped "
        "(the at-scale parity below still runs)")
    return "skipped (no pytest)"
  # --noconftest: tests/conftest.py refuses to start without every environment of the
  # suite, and these two files need none of them.
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
         "-m", "not slow", "tests/test_hf_parity.py", "tests/test_tokenizer_hf.py"]
  log("$ " + " ".join(cmd[2:]))
  # This process's JAX already holds most of the GPU: the child allocates as it goes.
  env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest",
             XLA_PYTHON_CLIENT_PREALLOCATE="false")
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
  tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
  for line in tail:
    print("    " + line)
  return "passed" if proc.returncode == 0 else f"FAILED (rc {proc.returncode})"


def parity_at_scale(size: str, arch: str, device: str, n_new: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  import sampler as sampler_bench
  from csa_jax.model import from_pretrained
  from csa_jax.model.sampling import SamplingConfig, left_pad, sample

  out = {}
  with tempfile.TemporaryDirectory() as tmp, \
      jax.default_matmul_precision("highest"):
    ref = sampler_bench.build_hf_dir(tmp, size, arch, "float32", seed=1)
    ref = ref.to(device)
    model, _ = from_pretrained(tmp, dtype="float32", load_tokenizer=False)
    vocab = model.cfg.vocab_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (2, 64))
    with torch.no_grad():
      want = ref(torch.tensor(ids, device=device)).logits.float().cpu().numpy()
    got = np.asarray(model(jnp.asarray(ids)))
    out["fp32_rel_err"] = float(np.abs(got - want).max() / np.abs(want).max())

    prompts = [list(rng.integers(0, vocab, n)) for n in (7, 30, 19, 64)]
    tokens, mask = left_pad(prompts, pad_id=0, bucket=64)
    with torch.no_grad():
      gen = ref.generate(torch.tensor(tokens, dtype=torch.long, device=device),
                         attention_mask=torch.tensor(mask, dtype=torch.long,
                                                     device=device),
                         do_sample=False, max_new_tokens=n_new,
                         min_new_tokens=n_new, pad_token_id=0, eos_token_id=None)
    hf_new = gen[:, tokens.shape[1]:].cpu().numpy()
    ours = np.asarray(sample(model, tokens, mask, rng=jax.random.key(0),
                             cfg=SamplingConfig(max_new_tokens=n_new, greedy=True),
                             pad_id=0).tokens_BxN)
    out["greedy_equal"] = float((hf_new == ours).mean())
    out["greedy_rows_identical"] = int((hf_new == ours).all(1).sum())

    # bf16: the same checkpoint loaded in bf16 on both sides.
    ref16 = ref.to(torch.bfloat16)
    model16, _ = from_pretrained(tmp, dtype="bfloat16", load_tokenizer=False)
    with torch.no_grad():
      want16 = ref16(torch.tensor(ids, device=device)).logits.float().cpu().numpy()
    got16 = np.asarray(model16(jnp.asarray(ids)))
    out["bf16_rel_err"] = float(np.abs(got16 - want16).max()
                                / np.abs(want16).max())
    out["bf16_top1_agree"] = float((got16.argmax(-1) == want16.argmax(-1)).mean())
  ok = out["fp32_rel_err"] < 1e-4 and out["greedy_equal"] == 1.0
  log(f"parity {size}/{arch} fp32 rel err {out['fp32_rel_err']:.2e} (tol 1e-4), "
      f"greedy {n_new} tokens equal {out['greedy_equal']:.1%} "
      f"({out['greedy_rows_identical']}/4 rows identical); bf16 rel err "
      f"{out['bf16_rel_err']:.2e}, bf16 top-1 agree "
      f"{out['bf16_top1_agree']:.1%} -> {'OK' if ok else 'CHECK'}")
  out["ok"] = ok
  return out


# ----------------------------------------------------------------------------------------
# 4. RL iterations through launch.py.

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<eos>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def env_corpus(env_kwargs: dict, num_tasks: int) -> list[str]:
  """The text a tokenizer is fitted to: the first training tasks' task lines, first
  observations and action lists (the games are generated here, into the cache the run
  then reads), in the think format's framing."""
  from csa_jax.rollout.prompts import PromptFormat
  from csa_jax.rollout.sft_rows import demo_corpus
  from environments.registry import make_env
  env = make_env("alfworld", **env_kwargs)
  try:
    records = []
    for i in range(num_tasks):
      r = env.reset("train", i)
      records.append({"task": r.info.task, "observations": [r.observation], "actions": [],
                      "admissible": [r.info.admissible_actions]})
  finally:
    env.close()
  fmt = PromptFormat(action_prefix="", action_format="think")
  return demo_corpus(records, fmt) + [CHAT_TEMPLATE, "<action>", "</action>", "user",
                                      "assistant"]


def build_policy_dir(path: str, size: str, corpus: list[str], vocab: int = 1024) -> int:
  """A random HF Qwen2 checkpoint of `size` with a byte-level BPE of at most `vocab`
  entries (the tiny model's vocabulary) fitted to `corpus` (tokenizer.json,
  tokenizer_config.json with a chat template); returns the tokenizer's size (a few
  hundred: the corpus is small)."""
  import sampler as sampler_bench
  from csa_jax.model.tokenizer import Tokenizer, train_bpe
  sampler_bench.build_hf_dir(path, size, "qwen2", "float32", seed=2)
  tok = train_bpe(corpus * 4, vocab)
  tok.save(path)
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<eos>", "pad_token": "<pad>", "chat_template": CHAT_TEMPLATE,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f)
  return Tokenizer.from_hf_dir(path).vocab_size  # loads as the trainer will


def _launch(plan: Plan, tmp: str) -> tuple[list[dict], float]:
  """Builds the policy directory in `tmp` and runs launch.py there: (metrics, seconds)."""
  import launch
  from csa_jax.rollout.metrics import read_jsonl
  kwargs = {k.split(".")[-1]: int(v) for k, v in
            (o.split("=") for o in plan.overrides if o.startswith("env.kwargs."))}
  t0 = time.perf_counter()
  corpus = env_corpus(dict(source="generated", **kwargs), kwargs["num_train"])
  policy_dir = os.path.join(tmp, "policy")
  n_tok = build_policy_dir(policy_dir, plan.size, corpus)
  log(f"iterations: random {plan.size} checkpoint and a {n_tok}-entry BPE "
      f"in {policy_dir} ({time.perf_counter() - t0:.1f} s)")
  work = os.path.join(tmp, "run")
  args = ["--exp", "alfworld_csa", "--workdir", work, "--set", f"model_path={policy_dir}"]
  for o in plan.overrides:
    args += ["--set", o]
  log("$ python launch.py " + " ".join(args))
  t0 = time.perf_counter()
  try:
    rc = launch.main(args)
  except SystemExit as e:  # launch.py's one-line refusals
    rc = e.code
  wall = time.perf_counter() - t0
  if rc != 0:
    raise RuntimeError(f"launch.py exited with {rc}")
  return read_jsonl(os.path.join(work, "metrics.jsonl")), wall


def iterations(plan: Plan) -> dict:
  """`launch.py --exp alfworld_csa` on a random checkpoint: its per-iteration perf/."""
  cache = os.environ.get("CSA_JAX_CACHE")
  try:
    with tempfile.TemporaryDirectory() as tmp:
      os.environ["CSA_JAX_CACHE"] = os.path.join(tmp, "cache")  # games and demos, fresh
      recs, wall = _launch(plan, tmp)
  finally:
    if cache is None:
      os.environ.pop("CSA_JAX_CACHE", None)
    else:
      os.environ["CSA_JAX_CACHE"] = cache
  rl = [r for r in recs if "rollout/success" in r]
  for r in rl:
    perf = {k[5:]: v for k, v in r.items() if k.startswith("perf/")}
    log(f"iteration {r['step']}: " + ", ".join(
        f"{k} {v:.3g}" for k, v in sorted(perf.items())))
  # Steady state: from the second iteration on when there is one (the first compiles the
  # rollout sampler and the RL step). The loop's three phases; finer perf/ keys split them.
  first = 1 if len(rl) > 1 else 0
  before = rl[first - 1]["perf/env_steps_total"] if first else 0.0
  steps = (rl[-1]["perf/env_steps_total"] - before) if rl else 0.0
  phase_s = {k: sum(r.get(f"perf/{k}_s", 0.0) for r in rl[first:])
             for k in ("rollout", "adv", "update")}
  rl_s = sum(phase_s.values())
  res = dict(iterations=len(rl), env_steps=steps, rl_s=rl_s, launch_s=wall,
             env_steps_per_s=steps / rl_s if rl_s else 0.0,
             shares={k: v / rl_s if rl_s else 0.0 for k, v in phase_s.items()})
  log(f"iterations {first + 1}-{len(rl)}: {steps:.0f} environment steps in {rl_s:.1f} s of "
      f"rollout + advantages + update = {res['env_steps_per_s']:.2f} env steps/s ("
      + ", ".join(f"{k} {v:.0%}" for k, v in res["shares"].items())
      + f"){'' if first else ', compiles included'}; launch.py took {wall:.1f} s in all "
      "(SFT, evaluations, checkpoints and compiles included)")
  return res


# ----------------------------------------------------------------------------------------


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group(required=True)
  mode.add_argument("--full", action="store_true", help="the GPU check (0.5B, 1.5B)")
  mode.add_argument("--tiny", action="store_true", help="CPU smoke run at the tiny size")
  ap.add_argument("--parts", default=",".join(PARTS),
                  help=f"comma-separated subset of {','.join(PARTS)}")
  ap.add_argument("--json", default=None, help="also write every part's numbers here")
  ap.add_argument("--pytest", action="store_true",
                  help="--full: also run the small parity tests through pytest on the GPU "
                       "(about a minute more)")
  a = ap.parse_args(argv)
  parts = [p for p in a.parts.split(",") if p]
  bad = sorted(set(parts) - set(PARTS))
  if bad:
    ap.error(f"unknown parts {bad}; choose from {PARTS}")
  plan = TINY if a.tiny else FULL

  import jax
  import torch
  import transformers
  on_gpu = jax.default_backend() == "gpu"
  device = plan.device if (plan.device == "cpu" or torch.cuda.is_available()) else "cpu"
  log(f"jax {jax.__version__} {jax.default_backend()} {jax.devices()[0].device_kind}"
      f" x{jax.device_count()}; torch {torch.__version__} on {device}; "
      f"transformers {transformers.__version__}; parts {','.join(parts)}")
  if a.full and not on_gpu:
    log("warning: no GPU visible to JAX; use --tiny for a CPU run")
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False

  import sampler as sampler_bench
  import train_step as train_bench

  def parity():
    pyt = run_pytests() if a.full and a.pytest else "not run"
    q = parity_at_scale(plan.size, "qwen2", device, plan.parity_new_tokens)
    l = parity_at_scale(plan.llama_size, "llama", device, 32)
    ok = q["ok"] and l["ok"] and not pyt.startswith("FAILED")
    return ok, dict(pytest=pyt, qwen2=q, llama=l), (
        f"pytest {pyt}; parity qwen2 {'OK' if q['ok'] else 'CHECK'}, llama "
        f"{'OK' if l['ok'] else 'CHECK'} (bf16 {plan.size} rel err "
        f"{q['bf16_rel_err']:.2e}, top-1 agree {q['bf16_top1_agree']:.1%})")

  def sampler():
    s = sampler_bench.run(**plan.sampler, size=plan.size, dtype=plan.dtype, device=device)
    return True, s, (f"sampler {plan.size} {plan.dtype}: {s['ours_tok_s']:.0f} vs "
                     f"{s['hf_tok_s']:.0f} tok/s = {s['speedup']:.2f}x transformers' "
                     f"generate, greedy tokens equal {s['agree']:.1%}")

  def mfu(size, B, L):
    t = train_bench.run(B=B, L=L, size=size, dtype=plan.dtype, remat=a.full,
                        reps=plan.mfu_reps, peak_n=plan.peak_n)
    return True, t, (f"update {size} {plan.dtype} B={B} L={L}: {t['tok_s']:.0f} tok/s, "
                     f"{t['achieved'] / 1e12:.2f} TFLOP/s = {t['mfu']:.1%} of matmul peak "
                     f"({t['peak'] / 1e12:.1f} TFLOP/s)")

  def iters():
    it = iterations(plan)
    return True, it, (f"alfworld_csa iterations: {it['iterations']}, "
                      f"{it['env_steps_per_s']:.2f} env steps/s of RL time ("
                      + ", ".join(f"{k} {v:.0%}" for k, v in it["shares"].items()) + ")")

  jobs = []
  if "parity" in parts:
    jobs.append(("parity", parity))
  if "sampler" in parts:
    jobs.append(("sampler", sampler))
  if "mfu" in parts:
    jobs += [(f"mfu {size}", lambda s=size, b=B, l=L: mfu(s, b, l))
             for size, B, L in plan.mfu]
  if "iterations" in parts:
    jobs.append(("iterations", iters))

  # A part that fails is reported and the next one runs: a lease is too short to lose
  # the rest of the check to one error.
  lines, ok, results = [], True, {}
  for name, fn in jobs:
    t0 = time.perf_counter()
    try:
      part_ok, res, line = fn()
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      part_ok, res, line = False, {"error": repr(e)}, f"{name} FAILED: {e!r}"[:300]
    res = dict(res, wall_s=time.perf_counter() - t0)
    log(f"part {name}: {res['wall_s']:.1f} s")
    ok &= part_ok
    lines.append(line)
    results[name] = res
  log("summary (" + ", ".join(f"{k} {v['wall_s']:.0f} s" for k, v in results.items())
      + "):")
  for line in lines:
    print("  " + line, flush=True)
  if a.json:
    with open(a.json, "w") as f:
      json.dump(results, f, indent=1, default=str)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
