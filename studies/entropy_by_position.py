"""Entropy of a run's RL policy and of its SFT start at each action-token position.

    python -m studies.entropy_by_position runs/sweeps/quickstart/csa_seed0 [--tasks 16]

Plays 2 episodes on each of `--tasks` train tasks (from index 500) with the run's RL policy
(sampled at the rollout temperature), then for every step computes, under both policies,
the entropy of the next-token distribution at each of the step's action tokens (teacher
forced on the RL policy's own action). Prints the mean per position: 0 (the token that picks
the action), 1, 2, 3 and later, and the last (the end token). A policy whose RL made the
later positions lose their sharpness shows it here (reports/quickstart/notes.md).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout import prompts
from csa_jax.rollout.policy import SamplerPolicy
from environments.pool import EnvPool
from studies.credit import load_run


def position_entropies(graphdef, params, prompt: list[int], action: list[int]) -> np.ndarray:
  """Entropy (nats) of the next-token distribution at each action token, teacher forced."""
  ids = jnp.asarray([prompt + action[:-1]])
  logp = jax.nn.log_softmax(nnx.merge(graphdef, params)(ids)[0, len(prompt) - 1:], -1)
  return np.asarray(-(jnp.exp(logp) * logp).sum(-1))


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("run_dir")
  ap.add_argument("--tasks", type=int, default=16)
  ap.add_argument("--seed", type=int, default=5)
  args = ap.parse_args(argv)
  cfg, tok, graphdef, p_rl, desc, _ = load_run(args.run_dir, "rl")
  p_sft = load_run(args.run_dir, "sft")[3]
  policy = SamplerPolicy(graphdef, lambda: p_rl, tok, cfg, greedy=False,
                         key=jax.random.key(args.seed))
  tasks = [("train", 500 + i) for i in range(args.tasks) for _ in range(2)]
  fmt = prompts.PromptFormat(action_format=cfg.rollout.action_format)
  with EnvPool(cfg.env.name, dict(cfg.env.kwargs), min(len(tasks), cfg.rollout.num_envs)) as pool:
    trajs = rollout_lib.run_episodes(pool, policy, tok, tasks, cfg.rollout,
                                     np.random.default_rng(0), fmt=fmt)
  steps = [s for t in trajs for s in t.steps]
  print(f"{args.run_dir} ({desc}): {len(trajs)} episodes, {len(steps)} steps, success "
        f"{np.mean([t.won for t in trajs]):.2f}")
  for name, params in (("sft", p_sft), ("rl", p_rl)):
    by_pos = defaultdict(list)
    for s in steps:
      ent = position_entropies(graphdef, params, s.prompt_ids, s.action_ids)
      for k, v in enumerate(ent):
        by_pos["last" if k == len(ent) - 1 else str(min(k, 3))].append(float(v))
    print(f"  {name:4s}" + "".join(f"  pos {k}: {np.mean(by_pos[k]):.2f} (n={len(by_pos[k])})"
                                   for k in ("0", "1", "2", "3", "last") if by_pos[k]))


if __name__ == "__main__":
  main()
