"""A LoRA policy's decode step: adapters in the graph vs merged weights.

The sampler can run an adapted policy two ways: the model with its adapters, computing
x W + (alpha / r) (x A) B at every projection (what the trainer does: no extra memory), or
the adapters folded into the kernels once per sampler call (csa_jax/model/lora.py,
`merged_state`: one more copy of every adapted kernel while sampling, and the fold itself).
This times one jitted decode step (`Decoder.forward_cached`, one token per row against a
KV cache) both ways on the same weights, and the fold, after a warm-up call each.

  PYTHONPATH=. python benchmarks/lora_decode.py [--size small --B 32 --S 512 --rank 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.train_step import SIZES
from csa_jax.model import Decoder, LoRAConfig, ModelConfig, lora


def _median(fn, reps):
  fn()  # warm-up (compile)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def run(size="small", B=32, S=512, rank=32, dtype="bfloat16", reps=20) -> dict:
  cfg = ModelConfig(**SIZES[size], rope_theta=1e6, qkv_bias=True, tie_embeddings=True,
                    max_seq_len=S, param_dtype=dtype, dtype=dtype,
                    lora=LoRAConfig(rank=rank, alpha=float(rank)))
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  # Trained-looking adapters (B non-zero), so neither path is a no-op.
  params = nnx.from_flat_state([
      (p, v.replace(0.01 * jax.random.normal(jax.random.key(i), v.get_value().shape))
       if p[-1] == "lora_b" else v) for i, (p, v) in enumerate(nnx.to_flat_state(params))])
  base_graphdef = lora.base_graphdef(cfg)
  cache = model.init_cache(B, S)
  tok = jnp.ones((B, 1), jnp.int32)
  pos = jnp.full((B, 1), S // 2, jnp.int32)
  kv_mask = jnp.arange(S)[None, :] <= S // 2
  kv_mask = jnp.broadcast_to(kv_mask, (B, S))

  in_graph = jax.jit(lambda p, c: nnx.merge(graphdef, p).forward_cached(
      tok, pos, c, jnp.int32(S // 2), kv_mask))
  merged_fn = jax.jit(lambda p, c: nnx.merge(base_graphdef, p).forward_cached(
      tok, pos, c, jnp.int32(S // 2), kv_mask))
  fold = jax.jit(lambda p: lora.merged_state(p, cfg))
  merged = fold(params)
  a = np.asarray(in_graph(params, cache)[0], np.float32)
  b = np.asarray(merged_fn(merged, cache)[0], np.float32)
  t_graph = _median(lambda: in_graph(params, cache)[0], reps)
  t_merged = _median(lambda: merged_fn(merged, cache)[0], reps)
  t_fold = _median(lambda: fold(params), max(3, reps // 4))
  res = dict(size=size, B=B, S=S, rank=rank, dtype=dtype, in_graph_s=t_graph,
             merged_s=t_merged, fold_s=t_fold,
             max_logit_diff=float(np.abs(a - b).max()), backend=jax.default_backend())
  print(f"decode step, {size} ({cfg.num_layers} layers, d={cfg.hidden_size}) {dtype}, "
        f"B={B}, cache {S}, LoRA rank {rank} on all 7 projections, "
        f"{jax.devices()[0].device_kind}:\n"
        f"  adapters in the graph {t_graph * 1e3:8.2f} ms\n"
        f"  merged weights        {t_merged * 1e3:8.2f} ms  ({t_graph / t_merged:.2f}x faster)\n"
        f"  the fold (once per sampler call) {t_fold * 1e3:.1f} ms = "
        f"{t_fold / max(t_graph - t_merged, 1e-12):.0f} decode steps' saving; "
        f"logits agree to {res['max_logit_diff']:.2g}", flush=True)
  return res


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--size", choices=sorted(SIZES), default="small")
  ap.add_argument("--B", type=int, default=32)
  ap.add_argument("--S", type=int, default=512)
  ap.add_argument("--rank", type=int, default=32)
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  ap.add_argument("--reps", type=int, default=20)
  a = ap.parse_args(argv)
  return run(a.size, a.B, a.S, a.rank, a.dtype, a.reps)


if __name__ == "__main__":
  main()
