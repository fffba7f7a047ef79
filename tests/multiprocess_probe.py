"""Run by tests/test_multiprocess.py under csa_jax.distributed.multiprocess_local:
csa_jax/distributed/processes.py's primitives in a real multi-process runtime. Prints one JSON line of what this process
computed, and exits with 3 + its rank when asked (--fail), so that the test can check the
helper's worst exit code."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from csa_jax.distributed import mesh as mesh_lib  # noqa: E402

mesh_lib.maybe_initialize_distributed()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from csa_jax.distributed import processes as dist  # noqa: E402
from csa_jax.rollout import metrics as metrics_lib  # noqa: E402
from tests.factories import episode, step  # noqa: E402


def main() -> int:
  k = dist.process_index()
  mesh = mesh_lib.make_mesh("4x2")
  rng = np.random.default_rng(k)
  mine = rng.normal(size=3 + k)  # float64, of a different length in each process
  trajs = [episode([step(valid=t >= k, actions_dropped=t % 2) for t in range(2 + i + k)],
                   won=(i + k) % 2 == 0) for i in range(2 + k)]
  batch = {"x": np.arange(8 * 3, dtype=np.int32).reshape(8, 3)}
  whole = dist.to_device(batch, mesh, whole=True)
  summed = jax.jit(lambda x: x.sum(0), out_shardings=mesh_lib.replicated(mesh))(whole["x"])
  local = dist.to_device({"x": np.full((4, 3), k + 1, np.int32)}, mesh)
  local_sum = jax.jit(lambda x: x.sum(), out_shardings=mesh_lib.replicated(mesh))(local["x"])
  rows, bs = dist.local_rows([{"r": i} for i in range(5 + 7 * k)], 8, mesh, {"r": -1})
  sampler = dist.SamplerMesh(mesh)
  print(json.dumps({
      "rank": k, "count": dist.process_count(), "writer": dist.is_writer(),
      "share": dist.share(list(range(10)), unit=2), "share_count": dist.share_count(5),
      "mine": mine.tolist(), "gathered": dist.gather_concat(mine).tolist(),
      "sum": dist.reduce_sum(np.asarray([1.5 + k, 2**40 + k], np.float64)).tolist(),
      "episodes": metrics_lib.gathered_episode_metrics(trajs, "x"),
      "whole_sum": np.asarray(summed).tolist(), "local_sum": int(local_sum),
      "rows": len(rows), "local_bs": bs,
      "sampler_devices": sorted(d.id for d in sampler.mesh.devices.flat),
      "stop": dist.agree_stop(15 if k == 1 else None)}), flush=True)
  return 3 + k if "--fail" in sys.argv else 0


if __name__ == "__main__":
  sys.exit(main())
