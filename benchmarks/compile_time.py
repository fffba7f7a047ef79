"""Compile time against depth: unrolled layers vs `model.scan_layers`.

For each depth it builds a decoder (hidden 256, 4 heads / 2 KV heads, MLP 512, vocab
2048: compile time follows the program's size, not its widths), then lowers and
compiles, from scratch, the two programs a run compiles: the RL step (forward and
backward, remat on as in the full-size presets) over 8 rows x 256 tokens, and the
sampler (prefill + while-loop decode) for 8 prompts of 64 + 32 new tokens. Prints the
compiler's CPU seconds per program (this process's CPU time: on a shared machine wall
time swings with the load, CPU time hardly) and the ratio unrolled / scanned; a scanned
program's compile time should stay about flat in depth.

  .venv/bin/python -m benchmarks.compile_time [--layers 2 8 28]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from csa_jax.config import AlgoConfig, OptimConfig
from csa_jax.model import Decoder, ModelConfig
from csa_jax.model import sampling
from csa_jax.update import train_step as ts
from csa_jax.update.data import BATCH_KEYS

ROWS, SEQ, ACT = 8, 256, 32
PROMPTS, P, N = 8, 64, 32


def _model(layers: int, scan: bool) -> Decoder:
  cfg = ModelConfig(vocab_size=2048, hidden_size=256, intermediate_size=512,
                    num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=64,
                    max_seq_len=512, remat=True, scan_layers=scan)
  return Decoder(cfg, rngs=nnx.Rngs(0))


def _seconds(fn, *args, **kwargs) -> float:
  t0 = time.process_time()
  fn.lower(*args, **kwargs).compile()
  return time.process_time() - t0


def rl_step_compile_s(model: Decoder) -> float:
  graphdef, params = nnx.split(model, nnx.Param)
  tx = ts.make_optimizer(OptimConfig())
  scfg = sampling.SamplingConfig(max_new_tokens=ACT)
  step = ts.make_rl_step(graphdef, tx, AlgoConfig(), scfg)
  shapes = {"inputs": SEQ, "attn_mask": SEQ}
  batch = {k: jnp.zeros((ROWS, shapes.get(k, ACT)),
                        jnp.int32 if k in ("inputs", "attn_mask", "act_pos", "targets")
                        else jnp.float32) for k in BATCH_KEYS}
  return _seconds(step, ts.init_state(params, tx), batch, params)  # params: the KL reference


def sampler_compile_s(model: Decoder) -> float:
  graphdef, state = nnx.split(model)
  tokens = jnp.ones((PROMPTS, P), jnp.int32)
  return _seconds(sampling._sample_jit, graphdef, state, tokens, tokens,  # pylint: disable=protected-access
                  jax.random.key(0), cfg=sampling.SamplingConfig(max_new_tokens=N),
                  pad_id=0, cache_sharding=None)


def run(layers=(2, 8, 28)) -> list[dict]:
  print(f"compile CPU seconds (jax {jax.__version__}, {jax.default_backend()}); "
        f"RL step {ROWS} x {SEQ} with remat, sampler {PROMPTS} x {P} + {N}")
  print(f"{'layers':>6} | {'RL step unrolled':>16} {'scanned':>8} {'ratio':>6} | "
        f"{'sampler unrolled':>16} {'scanned':>8} {'ratio':>6}")
  out = []
  for n in layers:
    row = {"layers": n}
    for scan in (False, True):
      model = _model(n, scan)
      row[f"rl_{'scan' if scan else 'unrolled'}_s"] = rl_step_compile_s(model)
      row[f"sampler_{'scan' if scan else 'unrolled'}_s"] = sampler_compile_s(model)
    print(f"{n:>6} | {row['rl_unrolled_s']:>16.2f} {row['rl_scan_s']:>8.2f} "
          f"{row['rl_unrolled_s'] / row['rl_scan_s']:>5.2f}x | "
          f"{row['sampler_unrolled_s']:>16.2f} {row['sampler_scan_s']:>8.2f} "
          f"{row['sampler_unrolled_s'] / row['sampler_scan_s']:>5.2f}x", flush=True)
    out.append(row)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layers", type=int, nargs="+", default=[2, 8, 28])
  a = ap.parse_args(argv)
  return run(tuple(a.layers))


if __name__ == "__main__":
  main()
