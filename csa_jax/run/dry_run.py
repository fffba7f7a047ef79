"""A memory plan before renting a pod slice: compile the run's programs ahead of time.

`python launch.py --exp NAME --mesh DxM --dry-run` builds the policy's shape (from
`model_path`'s config.json, or the experiment's `model` for a preset shape; no weights are
read), lays parameters and optimizer state out on the mesh by the training rules
(csa_jax/distributed/mesh.py: FSDP over 'data', tensor parallel over 'model'), and compiles, with
abstract arrays only, the three programs a run is made of: the sampler (prefill and the
decode loop over `rollout.num_envs` prompts), the SFT step and the RL step (with the KL
reference when the method has one). Each compiled program reports XLA's own per-device
memory analysis: arguments, outputs, temporaries, and how much of the output reuses
donated argument buffers.

What a device holds while a program runs is the program's peak (arguments + outputs -
aliased + temporaries) plus what stays resident without being its argument: the optimizer
state and the KL reference while the sampler runs. The largest of the three is compared
with `device_memory_gb` (or, where the device reports one, its own limit). Not counted:
the model-based methods' auxiliary models (iStar's PRM, SPA's estimator: about one more
policy and its optimizer state), XLA's runtime reserve and fragmentation; leave some
headroom (the verdict asks for 10%).

On a CPU the same compilation runs on simulated devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8). Arguments, outputs, aliasing and
what stays resident (parameters, optimizer state, KV cache) are exact for the
partitioned program. Temporaries are the CPU compiler's, and they are an upper bound
for a run with `model.remat`: XLA's CPU scheduler does not keep rematerialisation's
savings (a toy of 8 checkpointed layers compiled to 146 MiB of temporaries with and
without jax.checkpoint), so on CPU every layer's activations count as saved for the
backward pass. A GPU or TPU compile of the same program is the number to trust there.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from csa_jax import pretrained
from csa_jax.config import ExperimentConfig, micro_batches
from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model import Decoder, ModelConfig
from csa_jax.model import hf_config, lora
from csa_jax.model import sampling
from csa_jax.model.kv_cache import CACHE_AXES, cache_shape, cache_shardings
from csa_jax.update import train_step as ts
from csa_jax.update.data import BATCH_KEYS

GiB = 1024 ** 3
HEADROOM = 0.9  # the verdict's share of device memory a plan may use


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """Per-device bytes of one compiled program (XLA's memory analysis)."""

  name: str
  compile_s: float
  argument: int
  output: int
  alias: int
  temp: int
  resident: int  # held on the device meanwhile, outside the program's arguments

  @property
  def peak(self) -> int:
    return self.argument + self.output - self.alias + self.temp + self.resident


@dataclasses.dataclass(frozen=True)
class Plan:
  model: str
  num_params: int
  mesh: str
  devices: str
  programs: tuple[ProgramMemory, ...]
  device_memory: int | None  # bytes; None: unknown (CPU without device_memory_gb)
  remat: bool = True  # the model's setting: a plan that does not fit suggests it if off

  @property
  def peak(self) -> int:
    return max(p.peak for p in self.programs)

  @property
  def fits(self) -> bool | None:
    return None if self.device_memory is None else self.peak <= HEADROOM * self.device_memory


def model_config(cfg: ExperimentConfig) -> tuple[ModelConfig, str]:
  """The policy's shape and where it came from: model_path's config.json (dtypes, remat,
  scan_layers and LoRA from the experiment's `model`), else the experiment's own `model`."""
  if not cfg.model_path:
    return cfg.model, "experiment's model"
  return (pretrained.checkpoint_model(cfg.model_path, cfg.model),
          os.path.join(cfg.model_path, hf_config.CONFIG_FILE))


def _bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += int(np.prod(shard, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
  return total


def _with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _with_dtype(tree: Any, dtype: str) -> Any:
  if not dtype:
    return tree
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype),
                                                     sharding=x.sharding), tree)


def _compile(name: str, fn, *args, resident: int = 0, **kwargs) -> ProgramMemory:
  t0 = time.perf_counter()
  compiled = fn.lower(*args, **kwargs).compile()
  secs = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  return ProgramMemory(name=name, compile_s=secs, argument=int(mem.argument_size_in_bytes),
                       output=int(mem.output_size_in_bytes), alias=int(mem.alias_size_in_bytes),
                       temp=int(mem.temp_size_in_bytes), resident=resident)


def _device_memory(cfg: ExperimentConfig, mesh) -> int | None:
  if cfg.device_memory_gb > 0:
    return int(cfg.device_memory_gb * GiB)
  stats = mesh.devices.flat[0].memory_stats() or {}
  return int(stats["bytes_limit"]) if "bytes_limit" in stats else None


def plan(cfg: ExperimentConfig, *, log=print) -> Plan:
  """Compiles the sampler, the SFT step and the RL step of `cfg` on its mesh with
  abstract arrays, and returns their per-device memory."""
  mesh = mesh_lib.make_mesh(cfg.mesh)
  mcfg, source = model_config(cfg)
  r, a = cfg.rollout, cfg.algo
  seq_len, act_len = r.seq_len, r.max_action_tokens
  if seq_len > mcfg.max_seq_len:
    mcfg = mcfg.replace(max_seq_len=seq_len)  # the checkpoint's own limit is far larger
  abstract = nnx.eval_shape(lambda: Decoder(mcfg, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(abstract, nnx.Param)
  p_sh = mesh_lib.state_shardings(params, mesh, mesh_lib.TRAIN_RULES)
  params = _with_shardings(params, p_sh)
  adapters, frozen = lora.split(params)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  num_adapter = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters)) if frozen else 0
  log(f"dry run {cfg.name}: {(num_params - num_adapter) / 1e9:.2f}B parameters ({source}; "
      f"params {mcfg.param_dtype}, compute {mcfg.dtype}, remat {mcfg.remat}) on "
      f"{mesh_lib.describe(mesh)}")
  if frozen:
    lc = mcfg.lora
    log(f"  LoRA rank {lc.rank}, alpha {lc.alpha:g} on {', '.join(lc.targets)}: "
        f"{num_adapter / 1e6:.1f}M trainable ({lc.param_dtype}); per device: base "
        f"{_bytes_per_device(frozen) / GiB:.2f} GiB (frozen, {mcfg.param_dtype}), adapters "
        f"{_bytes_per_device(adapters) / 2 ** 20:.1f} MiB")
  else:
    log(f"  full-parameter: {_bytes_per_device(params) / GiB:.2f} GiB of parameters per "
        "device, all trainable")

  replicated = NamedSharding(mesh, PartitionSpec())
  batch_sh = mesh_lib.batch_sharding(mesh)

  def state_for(tx):
    opt = jax.eval_shape(tx.init, adapters)  # moments for the trainable part only
    opt = _with_shardings(opt, mesh_lib.opt_state_shardings(tx, opt, lora.trainable(p_sh),
                                                            mesh))
    return ts.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
                         params=params, opt_state=opt)

  def batch(n):
    shapes = {"inputs": (seq_len, jnp.int32), "attn_mask": (seq_len, jnp.int32),
              "act_pos": (act_len, jnp.int32), "targets": (act_len, jnp.int32),
              "loss_mask": (act_len, jnp.float32), "old_logp": (act_len, jnp.float32),
              "adv": (act_len, jnp.float32)}
    return {k: jax.ShapeDtypeStruct((n, shapes[k][0]), shapes[k][1], sharding=batch_sh)
            for k in BATCH_KEYS}

  programs = []
  # The sampler: the rollout's prompts at the prompt budget, the action budget of new
  # tokens; the optimizer state (and the KL reference) stay on the device meanwhile.
  tx = ts.make_optimizer(cfg.optim)
  rl_state = state_for(tx)
  # The KL reference: with LoRA the SFT adapters over the shared base (the step receives
  # the adapters alone); else a copy of the parameters in algo.ref_dtype.
  ref = None
  if a.kl_coef:
    ref = params if frozen else _with_dtype(params, a.ref_dtype)
  ref_bytes = _bytes_per_device(lora.trainable(ref)) if ref is not None else 0
  resident = _bytes_per_device(rl_state.opt_state) + ref_bytes
  log(f"  optimizer state {_bytes_per_device(rl_state.opt_state) / GiB:.2f} GiB per device "
      f"(AdamW, first moment {cfg.optim.mu_dtype or 'as the parameters'}); KL reference "
      + ("none" if ref is None else f"{ref_bytes / GiB:.3f} GiB per device ("
         + ("the SFT adapters over the shared base" if frozen else
            f"a {a.ref_dtype or mcfg.param_dtype} copy") + ")"))
  scfg = sampling.SamplingConfig(max_new_tokens=act_len, temperature=r.temperature)
  b, total = r.num_envs, seq_len
  cache_one = NamedSharding(mesh, mesh_lib.logical_to_spec(
      CACHE_AXES, mesh_lib.SAMPLE_RULES, cache_shape(mcfg, b, total), mesh))
  cache_sh = cache_shardings(mcfg, cache_one)
  prompts = jax.ShapeDtypeStruct((b, r.max_prompt_tokens), jnp.int32, sharding=batch_sh)
  key = jax.eval_shape(lambda: jax.random.key(0))
  programs.append(_compile(
      f"sampler ({b} x {r.max_prompt_tokens} + {act_len} tokens)", sampling._sample_jit,  # pylint: disable=protected-access
      graphdef, params, prompts, prompts, key, cfg=scfg, pad_id=0, cache_sharding=cache_sh,
      prefill_chunk=r.prefill_chunk, resident=resident))
  log(_line(programs[-1]))
  # SFT: its own optimizer (the SFT learning rate), no reference.
  sft_tx = ts.make_optimizer(cfg.optim, learning_rate=cfg.sft.learning_rate)
  sft_step = ts.make_sft_step(graphdef, sft_tx, micro_batches(cfg.optim, cfg.sft.batch_size))
  programs.append(_compile(f"SFT step ({cfg.sft.batch_size} rows x {seq_len})", sft_step,
                           state_for(sft_tx), batch(cfg.sft.batch_size)))
  log(_line(programs[-1]))
  rl_step = ts.make_rl_step(graphdef, tx, a, scfg, micro_batches(cfg.optim, a.minibatch_size))
  programs.append(_compile(f"RL step ({a.minibatch_size} rows x {seq_len})", rl_step,
                           rl_state, batch(a.minibatch_size), ref))
  log(_line(programs[-1]))
  devices = f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}"
  return Plan(model=source, num_params=num_params, mesh=cfg.mesh, devices=devices,
              programs=tuple(programs), device_memory=_device_memory(cfg, mesh),
              remat=mcfg.remat)


def _line(p: ProgramMemory) -> str:
  g = lambda x: f"{x / GiB:7.2f}"
  return (f"  {p.name:44s} compile {p.compile_s:6.1f} s | GiB per device: args {g(p.argument)}"
          f"  out {g(p.output)}  aliased {g(p.alias)}  temp {g(p.temp)}  resident "
          f"{g(p.resident)}  = peak {g(p.peak)}")


# Per-chip memory of common accelerators, GiB: what `verdict` names the plan's fit against.
DEVICE_SIZES = (("TPU v5e", 16), ("TPU v6e", 32), ("A100 40GB", 40), ("A100/H100 80GB", 80),
                ("TPU v5p", 95), ("H200", 141))


def fitting_devices(peak: int) -> str:
  """The DEVICE_SIZES whose memory holds `peak` with the verdict's headroom."""
  fits = [f"{name} ({gib} GiB)" for name, gib in DEVICE_SIZES if peak <= HEADROOM * gib * GiB]
  return ", ".join(fits) if fits else "none of " + ", ".join(
      f"{name} ({gib} GiB)" for name, gib in DEVICE_SIZES)


def verdict(p: Plan) -> str:
  worst = max(p.programs, key=lambda x: x.peak)
  head = (f"peak {p.peak / GiB:.2f} GiB per device ({worst.name}); with 10% headroom it "
          f"fits {fitting_devices(p.peak)}")
  if p.device_memory is None:
    return (f"{head}; device memory unknown here: --set device_memory_gb=N for a verdict")
  room = p.device_memory / GiB
  if p.fits:
    return f"{head}: fits in {room:.0f} GiB devices (with 10% headroom)"
  return (f"{head}: does NOT fit in {room:.0f} GiB devices with 10% headroom; shrink "
          "optim.micro_batch_size, rollout.num_envs or the budgets"
          + (", use a wider mesh, or turn on model.remat" if not p.remat
             else " or use a wider mesh"))
