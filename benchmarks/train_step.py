"""Tokens/s and achieved FLOP/s of the jitted update step vs the measured matmul peak.

Runs the project's real step (`csa_jax.update.train_step.make_rl_step`, the clipped
policy-gradient update with AdamW, or `make_sft_step`) on a random batch in the
`csa_jax.update.data` format (B rows of L tokens), after one warm-up call (compile
excluded). In the same run it measures the machine's matmul peak with a large
jitted `jnp.dot` in the compute dtype, and prints the step's achieved FLOP/s as
a fraction of it (model FLOPs utilisation, MFU).

Step FLOPs, analytic (as in the PaLM / MaxText MFU accounting): 3 x forward (4 x with
the KL reference's forward, AlgoConfig's default kl_coef > 0),
forward = 2 x tokens x (matmul parameters, LM head included, embedding gather
excluded) + 4 x B x L^2 x H x Dh x layers (scores and weighted values over the
full L x L, as our attention computes them). XLA's own count of the compiled
step is printed next to it when the backend provides one.

  .venv/bin/python benchmarks/train_step.py [--B 8 --L 256 --size tiny]
  ... --size 0.5b --dtype bfloat16 --B 8 --L 1024 --remat   (GPU check)
  ... --lora-rank 32    the full update, then the LoRA update (adapters of that rank on
                        every projection, the base frozen) on the same model and batch

A LoRA update's analytic FLOPs: 2 x forward (+ the reference's forward): the backward pass
computes the activations' gradients but no base-weight gradients (the adapters' own
matmuls are counted in neither, they are under 1% at rank 32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from csa_jax.config import AlgoConfig, OptimConfig
from csa_jax.model import Decoder, LoRAConfig, ModelConfig, lora
from csa_jax.model.sampling import SamplingConfig
from csa_jax.update import data as data_lib
from csa_jax.update.train_step import (init_state, make_optimizer, make_rl_step,
                                make_sft_step)

# Same shapes as benchmarks/sampler.py's SIZES (Qwen2.5-0.5B / -1.5B for the big ones).
SIZES = {
    "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=256,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32),
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1408,
                  num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                 num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128),
}


def model_config(size: str, dtype: str, remat: bool, lora_rank: int = 0) -> ModelConfig:
  return ModelConfig(**SIZES[size], rope_theta=1e6, qkv_bias=True,
                     tie_embeddings=True, max_seq_len=4096, remat=remat,
                     param_dtype="float32", dtype=dtype,
                     lora=LoRAConfig(rank=lora_rank, alpha=float(max(lora_rank, 1))))


def step_flops(cfg: ModelConfig, B: int, L: int, A: int, ref_forward: bool = False) -> float:
  """Forward + backward FLOPs: the layers over all L positions, the vocabulary
  projection only at the A action positions (as the update computes it); plus one more
  forward with `ref_forward` (the KL reference's log-probs, algo.kl_coef > 0)."""
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                    cfg.num_kv_heads, cfg.head_dim)
  per_layer = d * (h + 2 * k) * dh + h * dh * d + 3 * d * f
  fwd = (2 * B * L * cfg.num_layers * per_layer + 2 * B * A * d * cfg.vocab_size
         + 4 * B * L * L * h * dh * cfg.num_layers)
  passes = 2.0 if cfg.lora.enabled else 3.0  # no base-weight gradients with LoRA
  return (passes + ref_forward) * fwd


def matmul_peak(dtype: str, n: int, reps: int = 5) -> float:
  """FLOP/s of an n x n x n jitted jnp.dot (median of reps)."""
  a = jax.random.normal(jax.random.key(1), (n, n), dtype)
  b = jax.random.normal(jax.random.key(2), (n, n), dtype)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=dtype))
  dot(a, b).block_until_ready()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2.0 * n ** 3 / statistics.median(times)


def random_batch(cfg: ModelConfig, B: int, L: int, seed: int = 0):
  """A `csa_jax.update.data` batch of B rows: a prompt of L/2 + 1 tokens and an action of L/2
  tokens each, so every row fills its L input slots."""
  rng = np.random.default_rng(seed)
  A = L // 2
  rows = []
  for _ in range(B):
    seq = rng.integers(0, cfg.vocab_size, L + 1).tolist()
    rows.append({"prompt_ids": seq[:L + 1 - A], "action_ids": seq[L + 1 - A:],
                 "old_logps": [-float(np.log(cfg.vocab_size))] * A,
                 "advantage": float(rng.standard_normal())})
  arrays = [data_lib.row_arrays(r, L, A) for r in rows]
  return {k: np.stack([a[k] for a in arrays]) for k in data_lib.BATCH_KEYS}


def run(B: int = 8, L: int = 256, size: str = "tiny", dtype: str = "float32",
        remat: bool = False, kind: str = "rl", reps: int = 5,
        peak_n: int | None = None, lora_rank: int = 0) -> dict:
  cfg = model_config(size, dtype, remat, lora_rank)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = make_optimizer(OptimConfig())
  state = init_state(params, tx)
  step = (make_rl_step(graphdef, tx, AlgoConfig(), SamplingConfig(max_new_tokens=L // 2))
          if kind == "rl" else make_sft_step(graphdef, tx))
  batch = {k: jnp.asarray(v) for k, v in random_batch(cfg, B, L).items()}
  # The KL term (AlgoConfig's default kl_coef > 0) reads a reference policy's log-probs:
  # a copy of the initial parameters, as the trainer's is the SFT policy.
  # With LoRA the reference is a copy of the adapters over the same base (as the trainer's).
  trainable, frozen = lora.split(params)
  ref = ((lora.merge(jax.tree.map(jnp.copy, trainable), frozen),)
         if kind == "rl" and AlgoConfig().kl_coef else ())

  xla_flops = None
  try:
    cost = step.lower(state, batch, *ref).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops", 0.0)) or None
  except Exception:  # cost analysis is optional per backend
    pass

  state, metrics = step(state, batch, *ref)  # warm-up (compile)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch, *ref)
    jax.block_until_ready((state.params, metrics))
    times.append(time.perf_counter() - t0)
  t = statistics.median(times)
  if not np.isfinite(float(metrics["pg_loss" if kind == "rl" else "nll"])):
    raise RuntimeError("non-finite loss in the benchmark step")

  on_cpu = jax.default_backend() == "cpu"
  n = peak_n or (1024 if on_cpu else 8192)
  peak = matmul_peak(dtype, n)
  flops = step_flops(cfg, B, L, L // 2, ref_forward=bool(ref))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  n_train = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(lora.trainable(params)))
  res = dict(size=size, dtype=dtype, B=B, L=L, kind=kind, kl_ref=bool(ref), step_s=t,
             lora_rank=lora_rank, trainable=n_train,
             tok_s=B * L / t, flops=flops, xla_flops=xla_flops,
             achieved=flops / t, peak=peak, mfu=flops / t / peak,
             params=n_params, backend=jax.default_backend())
  xla = (f"; XLA counts {xla_flops / 1e9:.2f} GFLOP" if xla_flops else "")
  update = (f"LoRA rank {lora_rank}, {n_train / 1e6:.2f}M trainable" if lora_rank
            else "full update")
  print(f"train_step ({kind}{', KL reference' if ref else ''}; {update})  {size} "
        f"({n_params / 1e6:.1f}M params) {dtype}"
        f"{' remat' if remat else ''}  B={B} L={L} on "
        f"{jax.devices()[0].device_kind}\n"
        f"  step {t * 1e3:9.1f} ms median   {B * L / t:10.0f} tokens/s\n"
        f"  analytic {flops / 1e9:.2f} GFLOP/step{xla}\n"
        f"  achieved {flops / t / 1e12:8.3f} TFLOP/s   matmul peak "
        f"({n}^3 {dtype} jnp.dot) {peak / 1e12:8.3f} TFLOP/s   "
        f"fraction {flops / t / peak:.1%}", flush=True)
  return res


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--B", type=int, default=8)
  ap.add_argument("--L", type=int, default=256)
  ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  ap.add_argument("--remat", action="store_true")
  ap.add_argument("--kind", choices=("rl", "sft"), default="rl")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--peak-n", type=int, default=None,
                  help="matmul size for the peak (default 1024 CPU, 8192 GPU)")
  ap.add_argument("--lora-rank", type=int, default=0,
                  help="also run the LoRA update with adapters of this rank (0: full only)")
  a = ap.parse_args(argv)
  full = run(a.B, a.L, a.size, a.dtype, a.remat, a.kind, a.reps, a.peak_n)
  if not a.lora_rank:
    return full
  low = run(a.B, a.L, a.size, a.dtype, a.remat, a.kind, a.reps, a.peak_n, a.lora_rank)
  print(f"tokens/s: full update {full['tok_s']:.0f}, LoRA rank {a.lora_rank} update "
        f"{low['tok_s']:.0f} ({low['tok_s'] / full['tok_s']:.2f}x)", flush=True)
  return {"full": full, "lora": low}


if __name__ == "__main__":
  main()
