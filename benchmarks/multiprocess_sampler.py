"""Where the sampler runs with several processes: each process's own devices, or the whole
mesh in lockstep.

Run under the local multi-process helper (or on every host of a slice):

  python -m csa_jax.distributed.multiprocess_local --processes 2 --devices 4 \
      --script benchmarks/multiprocess_sampler.py -- [--envs 16 --reps 5]

The quickstart's decoder, its parameters laid out for training on the global 4x2 mesh.
Each process has `--envs` prompts (one wave of its environment pool). Timed, after one
warm-up (compilation excluded), medians over --reps:
- lockstep: one sampler call over the global mesh with every process's prompts (the
  global batch), each process then reading back its own rows, with the parameters in
  the training layout (what one process does) and in the sampling layout;
- local: one sampler call on this process's rows of the mesh (csa_jax/distributed/processes.py,
  SamplerMesh) with its own prompts, plus, once per parameter update, the regather of
  the parameters into that layout (`update`).
Prints per-call seconds and the ratio lockstep / local.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from csa_jax.distributed import mesh as mesh_lib  # noqa: E402

mesh_lib.maybe_initialize_distributed()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.timing import median_seconds  # noqa: E402
from csa_jax.distributed import processes as dist  # noqa: E402
from csa_jax.model.sampling import SamplingConfig, left_pad, sample  # noqa: E402
from experiments.quickstart import base  # noqa: E402
from csa_jax.model import Decoder  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--envs", type=int, default=16, help="prompts per process")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--mesh", default="4x2")
  a = p.parse_args()
  cfg = base()
  mesh = mesh_lib.make_mesh(a.mesh)
  model = Decoder(cfg.model, rngs=nnx.Rngs(0))
  mesh_lib.shard_model(model, mesh, mesh_lib.TRAIN_RULES)
  graphdef, params = nnx.split(model, nnx.Param)
  scfg = SamplingConfig(max_new_tokens=cfg.rollout.max_action_tokens, temperature=1.0,
                        top_p=1.0, top_k=0, greedy=False, stop_token_ids=())
  rng = np.random.default_rng(0)
  n_all = a.envs * dist.process_count()
  prompts = [rng.integers(3, cfg.model.vocab_size, size=rng.integers(60, 120)).tolist()
             for _ in range(n_all)]
  bucket = cfg.rollout.max_prompt_tokens
  key = jax.random.key(0)

  # The parameters in the sampling layout (replicated over 'data') on the global mesh.
  sample_params = jax.device_put(
      params, mesh_lib.state_shardings(params, mesh, mesh_lib.SAMPLE_RULES))

  def lockstep(p=params):
    tokens, mask = left_pad(prompts, 0, bucket=bucket)
    out = sample(nnx.merge(graphdef, p), tokens, mask, rng=key, cfg=scfg, pad_id=0,
                 mesh=mesh)
    # Each process reads back its own rows only.
    return [np.asarray(s.data) for s in out.tokens_BxN.addressable_shards]

  sm = dist.SamplerMesh(mesh)
  mine = dist.share(prompts)

  def local():
    tokens, mask = left_pad(mine, 0, bucket=bucket)
    out = sample(nnx.merge(graphdef, sm.params()), tokens, mask, rng=key, cfg=scfg,
                 pad_id=0, mesh=sm.mesh)
    return np.asarray(out.tokens_BxN)

  def regather():
    sm.update(params)
    jax.block_until_ready(jax.tree.leaves(sm.params()))

  t_update = median_seconds(regather, a.reps, warmup=1)
  t_local = median_seconds(local, a.reps, warmup=1)
  t_lock = median_seconds(lockstep, a.reps, warmup=1)
  t_lock_s = median_seconds(lambda: lockstep(sample_params), a.reps, warmup=1)
  print(f"process {dist.process_index()}/{dist.process_count()}, mesh {a.mesh}, "
        f"{a.envs} prompts per process, {scfg.max_new_tokens} new tokens: "
        f"local {t_local * 1e3:.1f} ms/call; lockstep, training layout "
        f"{t_lock * 1e3:.1f} ms/call ({t_lock / t_local:.2f} x local); lockstep, sampling "
        f"layout {t_lock_s * 1e3:.1f} ms/call ({t_lock_s / t_local:.2f} x local); "
        f"parameter regather {t_update * 1e3:.1f} ms per update", flush=True)


if __name__ == "__main__":
  main()
