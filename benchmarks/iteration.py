"""Where an RL iteration's time goes, on real runs: shares, tokens/s, padding, packing, overlap.

    PYTHONPATH=. python benchmarks/iteration.py [--family quickstart|alfworld|both]
        [--iterations 4] [--workdir DIR]

For each family (the quickstart's TWX coin and ALFWorld tiny, both cut down to a few tasks
per iteration), one short SFT run, then three RL runs from it (`sft.init_from`), all in
this process, in this order (a rerun with the same --workdir reuses the SFT run):

  unpacked   optim.pack_rows=false, rollout.overlap=false (the reference)
  packed     optim.pack_rows=true
  overlap    optim.pack_rows=true, rollout.overlap=true

and prints, from each run's `perf/` metrics averaged over its iterations after the first
(which compiles): the share of the iteration per phase, generated tokens/s, the padding
fractions of the sampler's prompt and generated-token slots and of the training rows, the
update time, and the rollout time (environment + prompts + sampling). The packing gain is
`unpacked / packed` update time. The machine's load moves between runs, so the overlap gain
is measured apart: rollouts alone from the SFT policy, serial and overlapped in turn, per
environment step (with overlap the sampler's key stream differs, rollout.overlap, so the
episodes differ in detail).

The sampler runs prefill and decode in one jitted call; the prefill's share of it is
measured here apart: the same sampler on a batch of full-budget prompts with a one-token
budget (prefill and one decode step) against the full action budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import experiments
from benchmarks.timing import median_seconds
from csa_jax import perf as perf_lib
from csa_jax.config import apply_overrides
from csa_jax.model import Decoder
from csa_jax.model import sampling
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout import groups
from csa_jax.rollout import metrics as M
from csa_jax.rollout import prompts
from csa_jax.rollout.policy import SamplerPolicy
from csa_jax.run.checkpoint import Checkpointer
from csa_jax.run.trainer import Trainer
from environments.pool import EnvPool
from flax import nnx

FAMILIES = {
    "quickstart": ("twx_coin_csa", ["sft.num_demos=40", "sft.epochs=4",
                                    "rollout.tasks_per_iter=4", "rollout.group_size=8",
                                    "rollout.num_envs=32"]),
    "alfworld": ("alfworld_tiny_csa", ["sft.num_demos=12", "sft.epochs=4", "sft.batch_size=32",
                                       "rollout.tasks_per_iter=2", "rollout.group_size=4",
                                       "rollout.num_envs=8", "rollout.max_turns=12",
                                       "env.kwargs.step_limit=12", "rollout.step_timeout_s=600"]),
}
RUNS = (("unpacked", ["optim.pack_rows=false", "rollout.overlap=false"]),
        ("packed", ["optim.pack_rows=true", "rollout.overlap=false"]),
        ("overlap", ["optim.pack_rows=true", "rollout.overlap=true"]))
COMMON = ["eval.num_episodes=2", "eval.greedy=false", "eval.every=0", "checkpoint_every=1000"]


def config(exp, sets):
  return apply_overrides(experiments.get_experiment(exp), [*COMMON, *sets])


def run_family(name: str, iterations: int, root: str) -> dict[str, dict[str, float]]:
  exp, sets = FAMILIES[name]
  demos = os.path.join(root, "demos")
  sft = os.path.join(root, f"{name}_sft")
  t0 = time.perf_counter()
  Trainer(config(exp, [*sets, f"sft.demos_dir={demos}", "rl_iterations=0"]), sft).run()
  print(f"[{name}] SFT in {time.perf_counter() - t0:.0f} s")
  out = {}
  for label, extra in RUNS:
    work = os.path.join(root, f"{name}_{label}")
    shutil.rmtree(work, ignore_errors=True)  # a rerun in the same --workdir starts afresh
    t0 = time.perf_counter()
    Trainer(config(exp, [*sets, *extra, f"sft.init_from={sft}", f"sft.demos_dir={demos}",
                         f"rl_iterations={iterations}"]), work).run()
    recs = [r for r in M.read_jsonl(os.path.join(work, "metrics.jsonl"))
            if "perf/iteration_s" in r][1:]
    out[label] = {k: float(np.nanmean([r.get(k, np.nan) for r in recs]))
                  for k in recs[0] if k.startswith(("perf/", "rollout/"))}
    print(f"[{name}] {label}: {len(recs) + 1} iterations in {time.perf_counter() - t0:.0f} s")
  return out


def overlap_gain(exp: str, sets: list[str], sft_dir: str, reps: int) -> dict[str, float]:
  """The rollout alone, serial and overlapped in turn (reps x ABAB, after one untimed
  round each that compiles), from the SFT policy on the same tasks with the same sampler
  key per round: medians of wall seconds per environment step (the machine's load moves
  between whole runs, so a comparison of two runs says little)."""
  c = config(exp, sets)
  r = c.rollout
  tok = Tokenizer.load(os.path.join(sft_dir, "tokenizer.json"))
  graphdef, params = nnx.split(Decoder(c.model, rngs=nnx.Rngs(0)), nnx.Param)
  ckpt = Checkpointer(os.path.join(sft_dir, "sft"), max_to_keep=1)
  params, _ = ckpt.restore(params)
  ckpt.close()
  fmt = prompts.PromptFormat(action_format=r.action_format)
  tasks = groups.tasks(np.random.default_rng(0), c)  # the same B x G tasks every round
  per_step = {False: [], True: []}
  with EnvPool(c.env.name, dict(c.env.kwargs), r.num_envs, backend=c.env.pool_backend,
               step_timeout_s=r.step_timeout_s) as pool:
    for k in range(reps + 1):
      for overlap in (False, True):
        policy = SamplerPolicy(graphdef, lambda: params, tok, c, greedy=False,
                               key=jax.random.key(k))
        t0 = time.perf_counter()
        trajs = rollout_lib.run_episodes(pool, policy, tok, tasks,
                                         dataclasses.replace(r, overlap=overlap),
                                         np.random.default_rng(0), fmt=fmt)
        if k:  # round 0 compiles
          per_step[overlap].append((time.perf_counter() - t0) / sum(t.length for t in trajs))
  serial, over = float(np.median(per_step[False])), float(np.median(per_step[True]))
  return {"serial_ms": 1e3 * serial, "overlap_ms": 1e3 * over, "gain": serial / over}


def prefill_share(exp: str, sets: list[str], reps: int = 3) -> float:
  """Sampling time with a one-token budget / with the full action budget, on num_envs
  full-budget prompts of a fresh model of the family's shape (no stop token drawn)."""
  c = config(exp, sets)
  model = Decoder(c.model, rngs=nnx.Rngs(0))
  b, p = c.rollout.num_envs, c.rollout.max_prompt_tokens
  tokens = jax.random.randint(jax.random.key(0), (b, p), 1, c.model.vocab_size)
  mask = jnp.ones((b, p), jnp.int32)

  def timed(n):
    cfg = sampling.SamplingConfig(max_new_tokens=n)
    run = lambda: jax.block_until_ready(sampling.sample(model, tokens, mask, rng=jax.random.key(1),
                                                        cfg=cfg, pad_id=0))
    return median_seconds(run, reps, warmup=1)

  return timed(1) / timed(c.rollout.max_action_tokens)


def report(name: str, res: dict[str, dict[str, float]], prefill: float,
           gain: dict[str, float]) -> None:
  print(f"\n== {name}: per iteration, mean over iterations 2.. ==")
  phases = [*perf_lib.PHASES, "other"]
  head = f"{'run':<9} {'iter s':>7} " + " ".join(f"{p[:6]:>6}" for p in phases)
  print("shares of the iteration (%):")
  print(head)
  for label, m in res.items():
    print(f"{label:<9} {m['perf/iteration_s']:7.2f} " +
          " ".join(f"{100 * m[f'perf/frac_{p}']:6.1f}" for p in phases))
  print(f"prefill share of sampling (measured apart): {100 * prefill:.0f}%")
  print(f"{'run':<9} {'gen tok/s':>9} {'env st/s':>8} {'prompt pad':>10} {'gen pad':>7} "
        f"{'train pad':>9} {'update s':>8} {'rollout s':>9}")
  for label, m in res.items():
    print(f"{label:<9} {m['perf/gen_tokens_per_s']:9.0f} {m['perf/env_steps_per_s']:8.1f} "
          f"{m.get('perf/sampler_prompt_pad_frac', np.nan):10.3f} "
          f"{m.get('perf/sampler_gen_pad_frac', np.nan):7.3f} "
          f"{m.get('perf/train_pad_frac', np.nan):9.3f} {m['perf/update_s']:8.2f} "
          f"{m['perf/rollout_s']:9.2f}")
  u, p, o = res["unpacked"], res["packed"], res["overlap"]
  print(f"packing: train pad {u['perf/train_pad_frac']:.3f} -> {p['perf/train_pad_frac']:.3f}, "
        f"update {u['perf/update_s']:.2f} s -> {p['perf/update_s']:.2f} s "
        f"({u['perf/update_s'] / p['perf/update_s']:.2f}x)")
  print(f"overlap (whole runs): rollout per env step "
        f"{1e3 * p['perf/rollout_s'] / p['rollout/env_steps']:.1f} ms -> "
        f"{1e3 * o['perf/rollout_s'] / o['rollout/env_steps']:.1f} ms")
  print(f"overlap (rollouts alone, alternated): {gain['serial_ms']:.1f} ms -> "
        f"{gain['overlap_ms']:.1f} ms per env step ({gain['gain']:.2f}x)")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--family", choices=[*FAMILIES, "both"], default="both")
  ap.add_argument("--iterations", type=int, default=4)
  ap.add_argument("--workdir", default="")
  ap.add_argument("--overlap-reps", type=int, default=3)
  args = ap.parse_args()
  root = args.workdir or tempfile.mkdtemp(prefix="iteration_bench_")
  names = list(FAMILIES) if args.family == "both" else [args.family]
  results = {}
  for name in names:
    exp, sets = FAMILIES[name]
    results[name] = (run_family(name, args.iterations, root), prefill_share(exp, sets),
                     overlap_gain(exp, sets, os.path.join(root, f"{name}_sft"),
                                  args.overlap_reps))
  for name, (res, prefill, gain) in results.items():
    report(name, res, prefill, gain)


if __name__ == "__main__":
  main()
