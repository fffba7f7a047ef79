"""Several processes, one program: what the trainer needs on a pod slice or a GPU cluster.

JAX's multi-controller SPMD (jax.distributed; the scheme of MaxText and T5X): every host
runs the same program over one global device mesh, each process owning its addressable
devices. What is host-side in this project (environments, rollouts, metrics, files) is
split or reduced here, so that the trainer only calls these functions:

- work: every process draws the same task groups (the same seeded numpy RNG) and plays a
  contiguous share of whole groups (`share`); group statistics (the advantages) need no
  traffic between hosts. Evaluation splits its episodes the same way.
- the sampler runs on each process's own devices (`SamplerMesh`: the rows of the global
  mesh this process owns, with the parameters resharded onto it once per update), so
  each process decodes its own waves at its own pace, with no collective per token.
- training batches: each process turns its own rows into batches of its share of the
  minibatch, padded with zero-loss rows to the batch count every process agrees on
  (`local_rows`), and `to_device` assembles the global batch
  (`jax.make_array_from_process_local_data`).
- metrics are reduced as sums and counts (never means of means) or, where the statistic
  needs every value (advantage spread, Spearman credit accuracy), gathered; only process
  0 writes files (`is_writer`).

With one process every function here is the identity (or the single-process code path),
so a single-process run is bit for bit what it was before this module.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from csa_jax.distributed import mesh as mesh_lib


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def multi() -> bool:
  return jax.process_count() > 1


def is_writer() -> bool:
  """Process 0 alone writes metrics, TensorBoard, plots, the config and the tokenizer."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  if multi():
    multihost_utils.sync_global_devices(name)


def first_then_rest(fn: Callable[[], Any], name: str) -> Any:
  """`fn()` on process 0, then (after a barrier) on the others: for a file process 0
  creates that the others then read (the tokenizer)."""
  if not multi():
    return fn()
  out = fn() if is_writer() else None
  barrier(name + ":written")
  if not is_writer():
    out = fn()
  return out


# ----------------------------------------------------------------------------------------
# Shares of the work.


def _bounds(n: int) -> tuple[int, int]:
  """[start, stop) of this process's contiguous share of n units (np.array_split's)."""
  p, k = jax.process_count(), jax.process_index()
  edges = [len(a) for a in np.array_split(np.arange(n), p)]
  start = sum(edges[:k])
  return start, start + edges[k]


def share(items: Sequence, unit: int = 1) -> list:
  """This process's contiguous share of `items`, in whole units of `unit` items (a task
  group's G copies stay together); with one process, all of them."""
  if not multi():
    return list(items)
  if len(items) % unit:
    raise ValueError(f"{len(items)} items do not make whole units of {unit}")
  start, stop = _bounds(len(items) // unit)
  return list(items[start * unit:stop * unit])


def share_count(n: int) -> int:
  """How many of n units this process owns."""
  start, stop = _bounds(n) if multi() else (0, n)
  return stop - start


# ----------------------------------------------------------------------------------------
# Reductions of host values. Values travel as raw bytes, so every dtype (int64 counts,
# float64 sums) arrives exactly, whatever jax_enable_x64 says.


def _allgather_bytes(arr: np.ndarray) -> list[np.ndarray]:
  arr = np.ascontiguousarray(arr)
  raw = arr.reshape(-1).view(np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([raw.size], np.int32)))
  sizes = sizes.reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:raw.size] = raw
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [every[i, :sizes[i]].view(arr.dtype) for i in range(len(sizes))]


def gather_concat(values: np.ndarray) -> np.ndarray:
  """Every process's 1-D array, concatenated in process order."""
  values = np.asarray(values).reshape(-1)
  if not multi():
    return values
  return np.concatenate(_allgather_bytes(values))


def reduce_sum(values) -> np.ndarray:
  """Elementwise sum over processes (exact for integers)."""
  values = np.asarray(values)
  if not multi():
    return values
  return np.sum([v.reshape(values.shape) for v in _allgather_bytes(values)], axis=0)


def reduce_max(values) -> np.ndarray:
  values = np.asarray(values)
  if not multi():
    return values
  return np.max([v.reshape(values.shape) for v in _allgather_bytes(values)], axis=0)


def all_true(flag: bool) -> bool:
  return bool(reduce_max(np.asarray(not flag, np.int64)) == 0)


def agree_stop(requested: int | None) -> int | None:
  """A stop signal any process received stops all of them at the same point (a pod
  slice's hosts get their preemption notices at slightly different times)."""
  if not multi():
    return requested
  got = int(reduce_max(np.asarray(requested or 0, np.int64)))
  return got or None


def count_env_steps(local: int) -> int:
  """Environment steps played by all processes together."""
  return int(reduce_sum(np.asarray(local, np.int64)))


def env_steps_by_process(local: int) -> dict[str, float]:
  """With several processes, each one's environment steps this iteration (how evenly the
  hosts were loaded); nothing with one."""
  if not multi():
    return {}
  every = gather_concat(np.asarray([local], np.int64))
  return {f"rollout/env_steps_process{i}": float(n) for i, n in enumerate(every)}


def gather_steps(adv_BxGxT: np.ndarray, mask_BxGxT: np.ndarray, oracle_BxGxT: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(advantages, mask, oracle labels) of every process's active steps, for statistics
  that need all of them; with one process, the arrays themselves."""
  if not multi():
    return adv_BxGxT, mask_BxGxT, oracle_BxGxT
  act = np.asarray(mask_BxGxT).astype(bool)
  adv = gather_concat(np.asarray(adv_BxGxT)[act])
  oracle = gather_concat(np.asarray(oracle_BxGxT)[act])
  return adv, np.ones(adv.shape, bool), oracle


# ----------------------------------------------------------------------------------------
# Training batches.


def _data_share(mesh: Mesh, rows: int) -> int:
  """Rows of a global batch of `rows` that live on this process's devices."""
  sharding = mesh_lib.batch_sharding(mesh)
  spans = {(s[0].start, s[0].stop)
           for s in sharding.addressable_devices_indices_map((rows,)).values()}
  return sum((stop or rows) - (start or 0) for start, stop in spans)


def local_rows(rows: list, batch_size: int, mesh: Mesh, empty_row: dict
               ) -> tuple[list, int]:
  """(rows padded with zero-loss rows, this process's batch size) such that every
  process makes the same number of batches (the jitted step is a collective)."""
  if not multi():
    return rows, batch_size
  local_bs = _data_share(mesh, batch_size)
  n = int(reduce_max(np.asarray(-(-len(rows) // local_bs), np.int64)))
  n = max(n, 1)
  return list(rows) + [empty_row] * (n * local_bs - len(rows)), local_bs


def to_device(batch: dict[str, np.ndarray], mesh: Mesh, *, whole: bool = False
              ) -> dict[str, jax.Array]:
  """The global batch, leading axis over 'data'. `whole`: every process holds the same
  whole batch (SFT's demonstrations) and places its own slice; otherwise each holds its
  own rows (RL), which become its share of the global batch."""
  sharding = mesh_lib.batch_sharding(mesh)
  if not multi():
    return {k: jax.device_put(v, sharding) for k, v in batch.items()}
  return {k: jax.make_array_from_process_local_data(sharding, v, v.shape if whole else None)
          for k, v in batch.items()}


def on_mesh(tree, mesh: Mesh):
  """Leaves held on one local device (a fresh optimizer's step counts) replicated over
  the global mesh: a multi-process checkpoint saves and restores global arrays only."""
  if not multi():
    return tree
  replicated = mesh_lib.replicated(mesh)
  return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and not x.is_fully_addressable
                      else jax.device_put(x, replicated), tree)


# ----------------------------------------------------------------------------------------
# The sampler on this process's devices.


def local_submesh(mesh: Mesh) -> Mesh:
  """The rows of `mesh` (whole 'model' groups) whose devices this process owns."""
  owned = np.vectorize(lambda d: d.process_index == jax.process_index())(mesh.devices)
  rows = owned.all(axis=1)
  if not rows.any() or (owned.any(axis=1) != rows).any():
    raise ValueError(f"mesh {dict(mesh.shape)}: the 'model' axis spans several hosts; "
                     "the sampler runs on each host's own devices, so M must fit in one "
                     f"host ({jax.local_device_count()} devices here)")
  return Mesh(mesh.devices[rows], mesh.axis_names, axis_types=mesh.axis_types)


class SamplerMesh:
  """Where the sampler runs, and its parameters there.

  One process: the global mesh and the training parameters themselves (as before).
  Several: this process's rows of the mesh; `update(params)` (a collective, so called at
  the same point by every process: after each update) gathers the parameters into the
  sampling layout (replicated over 'data', split over 'model') on the global mesh, and
  each process keeps the copies already on its own devices.
  """

  def __init__(self, mesh: Mesh):
    self.global_mesh = mesh
    self.mesh = local_submesh(mesh) if multi() else mesh
    self._params = None

  def update(self, params) -> None:
    if not multi():
      self._params = params
      return
    leaves, treedef = jax.tree.flatten(params)
    specs = [NamedSharding(self.global_mesh, s.spec) for s in jax.tree.leaves(
        mesh_lib.state_shardings(params, self.global_mesh, mesh_lib.SAMPLE_RULES))]
    gathered = _reshard(tuple(specs))(leaves)
    local = [jax.make_array_from_single_device_arrays(
        x.shape, NamedSharding(self.mesh, s.spec), [sh.data for sh in x.addressable_shards])
        for x, s in zip(gathered, specs)]
    self._params = jax.tree.unflatten(treedef, local)

  def params(self):
    return self._params


@functools.lru_cache(maxsize=4)
def _reshard(shardings: tuple):
  return jax.jit(lambda xs: xs, out_shardings=list(shardings))


def process_key(key: jax.Array) -> jax.Array:
  """This process's sampler key: its own stream, so processes do not repeat each other's
  draws; process 0 (and a single process) keeps the run's key."""
  return jax.random.fold_in(key, jax.process_index()) if jax.process_index() else key
