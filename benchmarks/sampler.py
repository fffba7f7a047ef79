"""Generated tokens/s: our jitted KV-cache sampler vs transformers' `generate`.

One random Hugging Face Qwen2 (or Llama) model is built in PyTorch, saved with
`save_pretrained` and loaded with `csa_jax.model.from_pretrained`, so both sides
run the same weights. Both decode greedily exactly N new tokens for the same
left-padded batch of B prompts of up to P tokens (transformers with
min_new_tokens=N, ours without stop tokens). Timed after one warm-up call
(compilation excluded); prints medians over --reps, tokens/s, the ratio, and
the fraction of greedy tokens the two agree on. On CPU transformers is timed
with torch's default thread count and with 1 thread, and the faster is the
reference (on a small shared machine OpenMP barriers can stall torch badly).

Beside each side's tokens/s it prints the achieved FLOP/s as a fraction of the
machine's matmul peak, measured in the same run (`train_step.matmul_peak`: a
jitted n x n x n jnp.dot in the compute dtype). The FLOPs are the useful
matmul work of the call, the same for both sides (`generate_flops`): every
real prompt token and every generated token fed back (N - 1 per row) through
the layers' projections, their attention over the filled cache only (real
prompt tokens and tokens generated so far), and the LM head for the N logits
each row samples from. Padding, the left-padded empty slots and any wasted
last step are not counted.

  .venv/bin/python benchmarks/sampler.py [--B 32 --P 64 --N 128]
  ... --size 0.5b --dtype bfloat16 --device cuda   (GPU check)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import median_seconds
from benchmarks.train_step import matmul_peak
from csa_jax.model import from_pretrained
from csa_jax.model.sampling import SamplingConfig, left_pad, sample

# HF config fields per size; "0.5b" and "1.5b" follow Qwen2.5-0.5B / -1.5B.
SIZES = {
    "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1408,
                  num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                 num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}


def build_hf_dir(path: str, size: str, arch: str = "qwen2",
                 dtype: str = "float32", seed: int = 0):
  """A random HF model of `size`, saved to `path`; returns the torch model."""
  import torch
  import transformers
  fields = dict(SIZES[size], max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=1_000_000.0, tie_word_embeddings=(arch == "qwen2"),
                initializer_range=0.02 if size != "tiny" else 0.1)
  if arch == "llama":  # Llama 3.1 rope scaling, active within short contexts
    fields["rope_scaling"] = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
  torch.manual_seed(seed)
  with torch.device("cpu"):
    if arch == "qwen2":
      model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
    else:
      model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
  model = model.to(getattr(torch, dtype)).eval()
  model.save_pretrained(path)
  return model


def generate_flops(cfg, prompt_lengths, n: int) -> float:
  """Useful matmul FLOPs of generating n tokens after prompts of these real lengths."""
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                    cfg.num_kv_heads, cfg.head_dim)
  layers = cfg.num_layers
  linear = 2 * layers * (d * (h + 2 * k) * dh + h * dh * d + 3 * d * f)  # per token
  per_key = 4 * layers * h * dh  # scores and weighted values, per (query, key) pair
  total = 0.0
  for m in np.asarray(prompt_lengths, np.int64):
    fed = m + n - 1  # the prompt, then every generated token but the last
    keys = m * (m + 1) // 2 + sum(m + j + 1 for j in range(n - 1))
    total += linear * fed + per_key * keys + 2 * d * cfg.vocab_size * n
  return float(total)


def run(B: int = 32, P: int = 64, N: int = 128, reps: int = 3,
        size: str = "tiny", arch: str = "qwen2", dtype: str = "float32",
        device: str = "cpu", hf_path: str | None = None,
        decode_segment: int = 32, peak_n: int | None = None) -> dict:
  import torch
  with tempfile.TemporaryDirectory() as tmp:
    path = hf_path or tmp
    if hf_path is None or not os.path.exists(os.path.join(path, "config.json")):
      ref = build_hf_dir(path, size, arch, dtype)
    else:
      import transformers
      ref = transformers.AutoModelForCausalLM.from_pretrained(
          path, dtype=getattr(torch, dtype)).eval()
    ref = ref.to(device)
    t0 = time.perf_counter()
    model, _ = from_pretrained(path, dtype=dtype, load_tokenizer=False)
    load_s = time.perf_counter() - t0

  vocab = model.cfg.vocab_size
  rng = np.random.default_rng(0)
  lengths = rng.integers(max(1, P // 2), P + 1, B)
  prompts = [list(rng.integers(0, vocab, n)) for n in lengths]
  tokens, mask = left_pad(prompts, pad_id=0, bucket=P)
  cfg = SamplingConfig(max_new_tokens=N, greedy=True)
  key = jax.random.key(0)

  out = {}

  def ours():
    out["ours"] = sample(model, tokens, mask, rng=key, cfg=cfg, pad_id=0,
                         decode_segment=decode_segment)
    jax.block_until_ready(out["ours"].tokens_BxN)

  t_tok = torch.tensor(tokens, dtype=torch.long, device=device)
  t_mask = torch.tensor(mask, dtype=torch.long, device=device)

  def theirs():
    with torch.no_grad():
      out["hf"] = ref.generate(t_tok, attention_mask=t_mask, do_sample=False,
                               max_new_tokens=N, min_new_tokens=N,
                               pad_token_id=0, eos_token_id=None)
    if device.startswith("cuda"):
      torch.cuda.synchronize()

  t_ours = median_seconds(ours, reps, warmup=1)
  # On a small, shared CPU torch's OpenMP barriers can stall badly with more
  # than one thread, so the reference is the faster of default threads and 1.
  n_threads = torch.get_num_threads()
  t_hf_by_threads = {n_threads: median_seconds(theirs, reps, warmup=1)}
  if device == "cpu" and n_threads > 1:
    torch.set_num_threads(1)
    t_hf_by_threads[1] = median_seconds(theirs, reps, warmup=1)
    torch.set_num_threads(n_threads)
  best_threads = min(t_hf_by_threads, key=t_hf_by_threads.get)
  t_hf = t_hf_by_threads[best_threads]
  hf_new = out["hf"][:, tokens.shape[1]:].cpu().numpy()
  ours_new = np.asarray(out["ours"].tokens_BxN)
  agree = float((hf_new == ours_new).mean()) if hf_new.shape == ours_new.shape \
      else 0.0
  flops = generate_flops(model.cfg, mask.sum(1), N)
  pn = peak_n or (1024 if jax.default_backend() == "cpu" else 8192)
  peak = matmul_peak(dtype, pn)
  frac = lambda t: f"{flops / t / 1e9:8.1f} GFLOP/s = {flops / t / peak:5.1%} of peak"
  res = dict(B=B, P=P, N=N, size=size, arch=arch, dtype=dtype, device=device,
             hf_threads=best_threads,
             jax_backend=jax.default_backend(), load_s=load_s,
             ours_s=t_ours, hf_s=t_hf, ours_tok_s=B * N / t_ours,
             hf_tok_s=B * N / t_hf, speedup=t_hf / t_ours, agree=agree,
             flops=flops, peak=peak, ours_peak_frac=flops / t_ours / peak,
             hf_peak_frac=flops / t_hf / peak)
  print(f"sampler  {size}/{arch} {dtype}  B={B} P={P} N={N}  "
        f"(jax {res['jax_backend']}, torch {device}; from_pretrained "
        f"{load_s:.2f} s; decode_segment {decode_segment})\n"
        f"  matmul peak ({pn}^3 {dtype} jnp.dot): {peak / 1e9:.1f} GFLOP/s; "
        f"useful FLOPs of the call {flops / 1e9:.2f} GFLOP\n"
        f"  ours (jit KV-cache sampler): {t_ours * 1e3:9.1f} ms median  "
        f"{res['ours_tok_s']:10.0f} tok/s  {frac(t_ours)}\n"
        + "".join(
            f"  transformers generate, {n} thr: {t * 1e3:7.1f} ms median  "
            f"{B * N / t:10.0f} tok/s  {frac(t)}\n"
            for n, t in t_hf_by_threads.items())
        + f"  ratio ours / best transformers: {res['speedup']:.2f}x   "
        f"greedy tokens equal: {agree:.1%}", flush=True)
  return res


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--B", type=int, default=32)
  ap.add_argument("--P", type=int, default=64)
  ap.add_argument("--N", type=int, default=128)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
  ap.add_argument("--arch", choices=("qwen2", "llama"), default="qwen2")
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
  ap.add_argument("--decode-segment", type=int, default=32,
                  help="sample()'s decode_segment (0: one segment over the whole cache)")
  ap.add_argument("--peak-n", type=int, default=None,
                  help="matmul size for the peak (default 1024 CPU, 8192 GPU)")
  a = ap.parse_args(argv)
  return run(a.B, a.P, a.N, a.reps, a.size, a.arch, a.dtype, a.device,
             decode_segment=a.decode_segment, peak_n=a.peak_n)


if __name__ == "__main__":
  main()
