"""Device mesh, logical-axis sharding rules and multi-host start-up.

The scheme is the one of MaxText / Tunix (GSPMD, Xu et al. 2021, arXiv
2105.04663): a 2-D mesh ('data', 'model'); model code names logical axes on its
parameters ("embed", "mlp", "q_heads", ...); one rules table maps logical axes
to mesh axes, and XLA inserts the collectives.

- TRAIN_RULES: batch over 'data'; heads / MLP / vocab over 'model' (tensor
  parallel); "embed" over 'data' (FSDP-style: params and optimizer state are
  split across the data axis too, gathered on use).
- SAMPLE_RULES: the same but "embed" replicated, so decoding (tiny matmuls,
  latency bound) needs no all-gather of weights along 'data' at every step.

A mesh axis that does not divide a dimension is dropped for that dimension
(replicated), so small-KV-head models (e.g. Qwen2.5-1.5B, 2 KV heads) still
shard on a wide 'model' axis.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "model")

Rules = tuple[tuple[str, str | None], ...]

TRAIN_RULES: Rules = (
    ("batch", "data"),
    ("cache_batch", "data"),
    ("vocab", "model"),
    ("embed", "data"),
    ("mlp", "model"),
    ("q_heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("norm", None),
    ("cache_seq", None),
)

SAMPLE_RULES: Rules = tuple(
    (name, None if name == "embed" else axis) for name, axis in TRAIN_RULES)


def make_mesh(spec: str = "1x1") -> Mesh:
  """Mesh of shape (D, M) over ('data', 'model') from a "DxM" string."""
  parts = spec.lower().split("x") if isinstance(spec, str) else []
  if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"--mesh must look like 'DxM' with positive ints "
                     f"(e.g. '4x2'), got {spec!r}")
  d, m = int(parts[0]), int(parts[1])
  n = jax.device_count()
  if d * m != n:
    raise ValueError(
        f"--mesh {spec} needs {d * m} devices but {n} are visible; use a mesh "
        f"with D*M == {n}, or on CPU simulate devices with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={d * m}")
  return jax.make_mesh((d, m), MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def logical_to_spec(axes: Sequence[str | None], rules: Rules,
                    shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> PartitionSpec:
  """PartitionSpec for logical axes; unknown names replicate.

  With shape and mesh given, a mesh axis that does not divide its dimension,
  or that an earlier dimension already uses, is dropped (replicated).
  """
  table = dict(rules)
  used, out = set(), []
  for i, name in enumerate(axes):
    mesh_axis = table.get(name) if name is not None else None
    if mesh_axis is not None and (
        mesh_axis in used or (shape is not None and mesh is not None
                              and shape[i] % mesh.shape[mesh_axis])):
      mesh_axis = None
    if mesh_axis is not None:
      used.add(mesh_axis)
    out.append(mesh_axis)
  return PartitionSpec(*out)


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedSharding tree (same structure as state) from each Variable's
  logical axes (`out_sharding` metadata); arrays without them replicate."""

  def one(x):
    if _is_var(x):
      axes = x.get_metadata().get("out_sharding") or ()
      value = x.get_value()
      spec = (logical_to_spec(axes, rules, value.shape, mesh)
              if axes else PartitionSpec())
      return x.replace(NamedSharding(mesh, spec))
    return NamedSharding(mesh, PartitionSpec())

  return jax.tree.map(one, state, is_leaf=_is_var)


def shard_state(state: Any, mesh: Mesh, rules: Rules) -> Any:
  """device_put of an nnx State (e.g. from nnx.split) by its logical axes."""
  return jax.device_put(state, state_shardings(state, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules) -> nnx.Module:
  """Places every variable of `model` by its logical axes, in place."""
  state = nnx.state(model)
  nnx.update(model, shard_state(state, mesh, rules))
  return model


def opt_state_shardings(tx, opt_state: Any, param_shardings: Any,
                        mesh: Mesh) -> Any:
  """Shardings for an optax state: parameter-shaped leaves (Adam moments,
  ...) follow their parameter, everything else (counts) replicates."""
  import optax  # local: mesh.py is also used where optax is not needed
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(
      tx, lambda _, s: s, opt_state, param_shardings,
      transform_non_params=lambda _: replicated,
      is_leaf=_is_var)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis over 'data', the rest replicated."""
  return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


_MULTIHOST_ENV = ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
                  "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")


def enable_compilation_cache(default_dir: str) -> str:
  """Turns on JAX's persistent compilation cache in `default_dir` (the callers pass
  $CSA_JAX_CACHE/xla; JAX_COMPILATION_CACHE_DIR names another folder), so a run compiles each program once per
  machine: a real model's sampler and update take minutes to compile on a CPU, and a
  resumed run or the next run of a study reuses them. Returns the folder."""
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_dir
  jax.config.update("jax_compilation_cache_dir", path)
  return path


def maybe_initialize_distributed() -> bool:
  """Calls jax.distributed.initialize() when a multi-host launch is detected.

  Detected: JAX_COORDINATOR_ADDRESS (with JAX_NUM_PROCESSES / JAX_PROCESS_ID
  if set), Cloud TPU pod variables (TPU_WORKER_HOSTNAMES with more than one
  host, TPU_PROCESS_ADDRESSES, MEGASCALE_COORDINATOR_ADDRESS), SLURM or Open
  MPI with more than one task. Returns True if it initialised. Must run before
  any other JAX call touches the devices.
  """
  env = os.environ
  kwargs = {}
  present = any(env.get(k) for k in _MULTIHOST_ENV)
  if env.get("TPU_WORKER_HOSTNAMES") and "," not in env["TPU_WORKER_HOSTNAMES"]:
    present = any(env.get(k) for k in _MULTIHOST_ENV
                  if k != "TPU_WORKER_HOSTNAMES")
  for key in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    if env.get(key, "1").isdigit() and int(env.get(key, "1")) > 1:
      present = True
  if not present:
    return False
  if env.get("JAX_COORDINATOR_ADDRESS"):
    kwargs["coordinator_address"] = env["JAX_COORDINATOR_ADDRESS"]
    for env_key, arg in (("JAX_NUM_PROCESSES", "num_processes"),
                         ("JAX_PROCESS_ID", "process_id")):
      if env.get(env_key):
        kwargs[arg] = int(env[env_key])
  if (env.get("JAX_PLATFORMS", "").strip().lower() == "cpu"
      and not env.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION")):
    # CPU devices of several processes reduce over gloo (this jax's default; set for
    # versions where it is not); it must be chosen before the CPU backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  return True


def describe(mesh: Mesh) -> str:
  """One line for logs: mesh shape and device kind."""
  kinds = sorted({d.device_kind for d in np.ravel(mesh.devices)})
  return (f"mesh {dict(mesh.shape)} on {mesh.devices.size} x "
          f"{'/'.join(kinds)} ({jax.process_count()} process(es))")
