"""Each RL method's iteration time relative to GRPO's, measured in one run.

One iteration's learning side, exactly as the trainer runs it (`Algorithm.prepare`, then
`Algorithm.update`: advantages, the auxiliary model's passes and step, the policy
update with its grain batching), on the same fixed batch of B x G synthetic episodes of
the quickstart's shape (4 tasks x 8 rollouts, up to 15 steps, 128-token prompts) and the
quickstart's decoder. Playing the episodes is left out: it is the same for every method
(same sampler, same environments), so it adds the same seconds to each numerator and
denominator. SPA-RL's one-off exploration and estimator training are not per iteration
and are left out too (the run reports them as perf/explore_s, perf/estimator_train_s).
Compilation is excluded (one warm-up iteration); each number is the median of --reps.

  python -m benchmarks.algorithms [--reps 5] [--methods grpo,csa,istar,spa,mtdpo]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import median_seconds
from csa_jax import algorithms
from csa_jax.model import Decoder
from csa_jax.rollout import groups
from csa_jax.rollout.episodes import Step, Trajectory
from csa_jax.rollout.policy import sampling_config
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts
from experiments import quickstart
from experiments.variants import variant


class _Tok:
  eos_id, pad_id = 1, 0


def episodes(cfg, seed: int = 0) -> list[Trajectory]:
  """B x G episodes: lengths 1..T, 40% won, 30% of actions invalid, random tokens."""
  r, vocab = cfg.rollout, cfg.model.vocab_size
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(r.tasks_per_iter * r.group_size):
    steps = []
    for _ in range(rng.integers(1, r.max_turns + 1)):
      n = int(rng.integers(2, r.max_action_tokens + 1))
      steps.append(Step(prompt_ids=rng.integers(2, vocab, r.max_prompt_tokens).tolist(),
                        action_ids=rng.integers(2, vocab, n).tolist(),
                        action_logps=(-rng.random(n) * 2).tolist(), action="a",
                        observation="o", reward=0.0, anchor_id=int(rng.integers(0, 5)),
                        valid=bool(rng.random() < 0.7), oracle_label=None))
    out.append(Trajectory(task=("train", 0), steps=steps, won=bool(rng.random() < 0.4)))
  return out


def bench_method(name: str, reps: int) -> dict[str, float]:
  cfg = variant(quickstart.coin_base(), f"bench_{name}", name)
  r = cfg.rollout
  params = nnx.split(Decoder(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
  graphdef, params = params
  tx = ts.make_optimizer(cfg.optim)
  batches = lambda rows, bs, *, seed, epochs: data_lib.batches(
      rows, batch_size=bs, seq_len=r.seq_len,
      action_len=r.max_action_tokens, pad_id=0, seed=seed, epochs=epochs)
  ctx = algorithms.Context(
      cfg=cfg, graphdef=graphdef, tx=tx, sampling_cfg=sampling_config(cfg, _Tok(), greedy=False),
      batches=batches, to_device=lambda b: {k: jnp.asarray(v) for k, v in b.items()},
      pad_id=0, play=None, workdir="", ref_params=jax.tree.map(jnp.copy, params))
  algo = algorithms.get(cfg.algo.method)
  trajs = episodes(cfg)
  batch = groups.from_episodes(trajs, r.group_size, r.max_turns, r.logp_reduce)
  box = {"state": ts.init_state(jax.tree.map(jnp.copy, params), tx),
         "aux": algo.init_aux(cfg, params)}
  if "ready" in box["aux"]:  # SPA: the estimator is trained before RL, not per iteration
    box["aux"]["ready"] = jnp.ones((), jnp.int32)
  step = algo.make_step(ctx)
  parts = {}

  def iteration():
    prep = algo.prepare(ctx, 0, batch, box["state"].params, box["aux"])
    box["aux"] = prep.aux
    parts["aux_s"] = prep.metrics["perf/aux_s"]
    if not prep.skip:
      box["state"], upd = algo.update(ctx, step, box["state"], prep, 0, ctx.ref_params)
      jax.block_until_ready(upd)
    jax.block_until_ready(box["aux"])

  t = median_seconds(iteration, reps, warmup=1)
  return {"iter_s": t, "aux_s": parts["aux_s"]}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--methods", default="grpo,csa,istar,spa,mtdpo")
  a = ap.parse_args(argv)
  methods = [m for m in a.methods.split(",") if m]
  if methods[0] != "grpo":
    methods = ["grpo"] + [m for m in methods if m != "grpo"]
  res = {m: bench_method(m, a.reps) for m in methods}
  ref = res["grpo"]["iter_s"]
  print(f"learning side of one iteration (prepare + update), quickstart shapes, "
        f"median of {a.reps}, on {jax.devices()[0].device_kind}")
  print(f"{'method':8s} {'iter ms':>9s} {'aux ms':>8s} {'vs GRPO':>8s}")
  for m, v in res.items():
    print(f"{m:8s} {v['iter_s'] * 1e3:9.1f} {v['aux_s'] * 1e3:8.1f} {v['iter_s'] / ref:7.2f}x",
          flush=True)
  return res


if __name__ == "__main__":
  main()
