"""One-shot check on a lent GPU: HF parity at scale, then both benchmarks.

Imports only what the GPU image has (jax + CUDA plugin, flax, optax, torch,
transformers, tokenizers, safetensors; no grain / tfds; pytest optional):

  1. the small parity tests (tests/test_hf_parity.py, tests/test_tokenizer_hf.py)
     through pytest when the image has it, else a note;
  2. parity at scale: a random Qwen2.5-0.5B-shaped Qwen2ForCausalLM (tied, q/k/v
     biases) and a small Llama with llama3 rope scaling, saved with
     `save_pretrained`, loaded with `from_pretrained`: fp32 logits (matmul
     precision "highest" on both sides, torch TF32 off) relative error, greedy
     tokens of our sampler vs `generate`, and bf16 logits error;
  3. benchmarks/sampler.py at that size in bf16 (torch on cuda);
  4. benchmarks/train_step.py at that size in bf16 (RL step, remat).

`--tiny` runs the same sequence on CPU at the tiny size in well under a minute
(tested by tests/test_hf_parity.py). Budget on the H200: under 8 minutes.

  python benchmarks/gpu_check.py            # on the GPU machine
  python benchmarks/gpu_check.py --tiny     # CPU smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

T0 = time.perf_counter()


def log(msg: str) -> None:
  print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def run_pytests() -> str:
  if importlib.util.find_spec("pytest") is None:
    log("pytest is not installed here: small parity tests skipped "
        "(the at-scale parity below still runs)")
    return "skipped (no pytest)"
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow", "tests/test_hf_parity.py", "tests/test_tokenizer_hf.py"]
  log("$ " + " ".join(cmd[2:]))
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest"))
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
  from csa_jax.sampling import SamplingConfig, left_pad, sample

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


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tiny", action="store_true",
                  help="CPU smoke run at the tiny size")
  ap.add_argument("--size", default=None, help="0.5b (default) or 1.5b")
  ap.add_argument("--skip-pytest", action="store_true")
  a = ap.parse_args(argv)

  import jax
  import torch
  import transformers
  on_gpu = jax.default_backend() == "gpu"
  device = "cuda" if (torch.cuda.is_available() and not a.tiny) else "cpu"
  size = "tiny" if a.tiny else (a.size or "0.5b")
  log(f"jax {jax.__version__} {jax.default_backend()} {jax.devices()[0].device_kind}"
      f" x{jax.device_count()}; torch {torch.__version__} on {device}; "
      f"transformers {transformers.__version__}")
  if not a.tiny and not on_gpu:
    log("warning: no GPU visible to JAX; use --tiny for a CPU run")
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False

  import sampler as sampler_bench
  import train_step as train_bench

  results = {}
  if not a.skip_pytest and not a.tiny:
    results["pytest"] = run_pytests()
  results["parity_qwen2"] = parity_at_scale(size, "qwen2", device,
                                            16 if a.tiny else 32)
  results["parity_llama"] = parity_at_scale("tiny" if a.tiny else "small",
                                            "llama", device, 32)
  if a.tiny:
    s = sampler_bench.run(B=4, P=16, N=16, reps=1, size="tiny", device="cpu")
    t = train_bench.run(B=2, L=64, size="tiny", reps=2, peak_n=256)
  else:
    s = sampler_bench.run(B=32, P=128, N=128, reps=3, size=size,
                          dtype="bfloat16", device=device)
    t = train_bench.run(B=8, L=1024, size=size, dtype="bfloat16", remat=True,
                        reps=5)
  results["sampler_speedup"], results["train_mfu"] = s["speedup"], t["mfu"]
  log(f"summary: pytest {results.get('pytest', 'not run')}; parity qwen2 "
      f"{'OK' if results['parity_qwen2']['ok'] else 'CHECK'}, llama "
      f"{'OK' if results['parity_llama']['ok'] else 'CHECK'}; sampler "
      f"{s['ours_tok_s']:.0f} vs {s['hf_tok_s']:.0f} tok/s ({s['speedup']:.2f}x); "
      f"train {t['tok_s']:.0f} tok/s, {t['achieved'] / 1e12:.2f} TFLOP/s = "
      f"{t['mfu']:.1%} of matmul peak")
  return 0 if results["parity_qwen2"]["ok"] and results["parity_llama"]["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
