"""Prints, as JSON, what XLA made of some programs: the SHA-256 of each compiled program's
optimised HLO and its memory analysis. tests/test_conftest.py runs it at two backend
optimisation levels to show that the suite's level (tests/xla_env.py) changes the machine
code only, not the program a test runs or its memory plan.

    python -m tests.xla_programs            # a small MLP's loss and gradient (seconds)
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.xla_programs --dry-run
        # the sampler, SFT step and RL step of coin_doors_csa's dry run on a 4x2 mesh
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import jax
import jax.numpy as jnp


def describe(compiled) -> list:
  m = compiled.memory_analysis()
  return [hashlib.sha256(compiled.as_text().encode()).hexdigest(), int(m.temp_size_in_bytes),
          int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.alias_size_in_bytes)]


def mlp() -> dict[str, list]:
  def loss(p, x_BxD, y_B):
    h_BxH = jax.nn.gelu(x_BxD @ p["w1"] + p["b1"])
    h_BxH = (h_BxH - h_BxH.mean(-1, keepdims=True)) / jnp.sqrt(h_BxH.var(-1, keepdims=True) + 1e-5)
    logp_BxV = jax.nn.log_softmax(h_BxH @ p["w2"])
    return -jnp.mean(jnp.take_along_axis(logp_BxV, y_B[:, None], 1))

  p = {"w1": jnp.full((64, 256), 0.01), "b1": jnp.zeros(256), "w2": jnp.full((256, 128), 0.01)}
  x, y = jnp.ones((32, 64)), jnp.zeros(32, jnp.int32)
  compiled = jax.jit(jax.value_and_grad(loss)).lower(p, x, y).compile()
  return {"mlp value_and_grad": describe(compiled)}


def dry_run_programs() -> dict[str, list]:
  import experiments  # pylint: disable=g-import-not-at-top
  from csa_jax.config import apply_overrides  # pylint: disable=g-import-not-at-top
  from csa_jax.run import dry_run  # pylint: disable=g-import-not-at-top
  out = {}
  compile_and_measure = dry_run._compile  # pylint: disable=protected-access

  def recording(name, fn, *args, resident=0, **kwargs):
    out[name] = describe(fn.lower(*args, **kwargs).compile())
    return compile_and_measure(name, fn, *args, resident=resident, **kwargs)

  dry_run._compile = recording  # pylint: disable=protected-access
  cfg = apply_overrides(experiments.get_experiment("coin_doors_csa"),
                        ["rollout.num_envs=8", "algo.minibatch_size=16", "sft.batch_size=16",
                         "rollout.max_prompt_tokens=64"])
  dry_run.plan(dataclasses.replace(cfg, mesh="4x2"), log=lambda *a, **k: None)
  return out


if __name__ == "__main__":
  print(json.dumps(dry_run_programs() if "--dry-run" in sys.argv[1:] else mlp()))
