"""Step-level credit accuracy study (CSA proposal, "Metrics"): every estimator on the same
rollouts of one policy checkpoint, against the environment's oracle step labels.

    # collect once (G = 16) and analyse at G = 4, 8, 16 (first G rollouts of each group)
    python -m studies.credit --env coin_doors --checkpoint runs/credit/coin_sft \
        --groups 64 --group-size 16 --out runs/credit/study/coin_sft
    # re-analyse saved rollouts without collecting
    python -m studies.credit --analyze runs/credit/study/coin_sft
    # the committed report from several analysed directories
    python -m studies.credit --report runs/credit/study/* --name credit

`--checkpoint` is a run directory of `launch.py` (tokenizer.json, config.json, sft/,
checkpoints/): `--which sft` reads its SFT parameters, `--which rl` the latest RL checkpoint,
`auto` (default) the RL checkpoint if the run has RL iterations, else SFT. The environment,
model shape, prompts and reward shaping (invalid-action penalty) are the run's own
(config.json), so advantages are the ones its training would have computed. Tasks are drawn
from the training split, as the trainer draws them. Labels are only read here, never trained on.

Estimators (`studies.credit_table.ESTIMATORS`: registered estimators of `csa_jax.estimators`,
through `algorithms.estimator.compute_advantages`): grpo, rloo, dr_grpo, csa at lambda 0.25 /
0.5 / 1, csa_step (CSA's step term A_S alone), gigpo, gigpo_step (GiGPO's step term alone)
and csa_gigpo. Metrics and bootstrap: `csa_jax.credit`.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
import time

import numpy as np

from studies.credit_table import (COLUMNS, ENV_FAMILIES, ESTIMATORS, LABEL_MEANING,  # noqa: F401
                                    STEP_TERM, read_csv, write_csv)


# -- loading a policy ---------------------------------------------------------------------


def load_run(run_dir: str, which: str = "auto"):
  """(config, tokenizer, graphdef, params, description, mesh) of a launch.py run directory,
  read as the post-training commands read it (`csa_jax.run.posttrain.load`): its newest RL
  checkpoint after iteration 0 ("rl"), its SFT weights ("sft"), or the first of the two
  it has ("auto")."""
  from csa_jax import workdir as workdir_lib
  from csa_jax.run import posttrain

  if posttrain.load_config(run_dir).model_path:
    raise ValueError("credit study: runs from a pretrained model_path are not supported yet")
  steps = [s for s in workdir_lib.rl_steps(run_dir) if s]
  if which == "auto":
    which = "rl" if steps else "sft"
  if which == "rl" and not steps:
    raise ValueError(f"{run_dir}: no RL checkpoint after iteration 0")
  saved = posttrain.load(run_dir, str(steps[-1]) if which == "rl" else "sft")
  desc = f"rl iteration {saved.step}" if which == "rl" else "sft"
  return saved.cfg, saved.tok, saved.graphdef, saved.params, desc, saved.mesh


# -- collection ---------------------------------------------------------------------------


def collect(run_dir: str, which: str, groups: int, group_size: int, seed: int,
            num_envs: int, out_dir: str, env: str, num_tasks: int = 0) -> str:
  import jax

  from csa_jax.rollout import groups as groups_lib
  from csa_jax.rollout import policy as policy_lib
  from csa_jax.rollout import prompts
  from environments.pool import EnvPool

  cfg, tok, graphdef, params, desc, mesh = load_run(run_dir, which)
  family = cfg.name.split("_")[0] if not cfg.name.startswith("coin_doors") else "coin_doors"
  if ENV_FAMILIES.get(env) != cfg.env.name:
    raise ValueError(f"--env {env}: the checkpoint's environment is {cfg.env.name!r} "
                     f"(experiment {cfg.name})")
  rcfg = dataclasses.replace(cfg.rollout, group_size=group_size, tasks_per_iter=groups,
                             num_envs=min(num_envs, groups * group_size))
  # ALFWorld games are generated on first use (seconds each): --tasks N keeps to cached ones.
  env_cfg = dataclasses.replace(cfg.env, num_train_tasks=num_tasks or cfg.env.num_train_tasks)
  # The trainer's own collection (one round: dynamic sampling would drop uniform groups).
  cfg = dataclasses.replace(cfg, rollout=rcfg, env=env_cfg,
                            algo=dataclasses.replace(cfg.algo, dynamic_sampling=False))
  rng = np.random.default_rng(seed)
  policy = policy_lib.SamplerPolicy(graphdef, lambda: params, tok, cfg, greedy=False,
                                   key=jax.random.key(seed), mesh=mesh)
  t0 = time.perf_counter()
  with EnvPool(cfg.env.name, dict(cfg.env.kwargs), rcfg.num_envs, backend=cfg.env.pool_backend,
               step_timeout_s=rcfg.step_timeout_s) as pool:
    batch, _ = groups_lib.collect(pool, policy, tok, cfg, rng, fmt=prompts.PLAIN)
  seconds = time.perf_counter() - t0
  arrays = batch.arrays
  idx = np.asarray([grp[0].task[1] for grp in batch.groups])
  os.makedirs(out_dir, exist_ok=True)
  np.savez_compressed(os.path.join(out_dir, "rollouts.npz"),
                      task_index_B=idx.astype(np.int32),
                      **{f.name: getattr(arrays, f.name) for f in dataclasses.fields(arrays)})
  steps = int(arrays.mask_BxGxT.sum())
  meta = {"env": env, "env_name": cfg.env.name, "env_kwargs": dict(cfg.env.kwargs),
          "family": family, "checkpoint": os.path.relpath(run_dir), "which": desc,
          "experiment": cfg.name, "task_pool": int(num_tasks or cfg.env.num_train_tasks),
          "groups": groups, "group_size": group_size, "seed": seed,
          "success": float(arrays.rewards_BxG.mean()), "env_steps": steps,
          "labelled_steps": int((arrays.mask_BxGxT & np.isfinite(arrays.oracle_BxGxT)).sum()),
          "collect_seconds": round(seconds, 1),
          "command": "python -m studies.credit " + " ".join(sys.argv[1:]),
          "algo": dataclasses.asdict(cfg.algo), "rollout": dataclasses.asdict(rcfg)}
  with open(os.path.join(out_dir, "meta.json"), "w") as f:
    json.dump(meta, f, indent=1)
  print(f"collected {groups} x {group_size} episodes ({steps} steps, success "
        f"{meta['success']:.3f}) in {seconds:.0f} s -> {out_dir}", flush=True)
  return out_dir


# -- analysis -----------------------------------------------------------------------------


def load_arrays(out_dir: str):
  from csa_jax.rollout.groups import GroupArrays

  with np.load(os.path.join(out_dir, "rollouts.npz")) as z:
    arrays = GroupArrays(**{f.name: z[f.name] for f in dataclasses.fields(GroupArrays)})
  with open(os.path.join(out_dir, "meta.json")) as f:
    meta = json.load(f)
  return arrays, meta


def subsample(arrays, g: int):
  """The first g rollouts of every group (rollouts within a group are exchangeable)."""
  return dataclasses.replace(arrays, **{
      f.name: getattr(arrays, f.name)[:, :g] for f in dataclasses.fields(arrays)})


def estimator_advantages(arrays, algo_dict: dict, rollout_dict: dict,
                         columns: dict = ESTIMATORS) -> dict[str, np.ndarray]:
  """Every study column's adv_BxGxT on the same arrays, with the run's reward shaping
  (`columns` as `credit_table.ESTIMATORS`)."""
  from csa_jax.algorithms import estimator as estimator_lib
  from csa_jax.config import AlgoConfig, RolloutConfig, from_dict
  from csa_jax.estimators import get_estimator

  algo = from_dict(AlgoConfig, algo_dict, source="meta.json")
  rollout = from_dict(RolloutConfig, rollout_dict, source="meta.json")
  out = {}
  for name, (est_name, part, knobs) in columns.items():
    est = get_estimator(est_name)
    est = est.step_term if part == STEP_TERM else est
    a = dataclasses.replace(algo, estimator=est_name, **knobs)
    out[name] = estimator_lib.compute_advantages(arrays, a, rollout, est)
  return out


def analyze(out_dir: str, group_sizes: tuple[int, ...] = (4, 8, 16), num_resamples: int = 400
            ) -> list[dict]:
  from csa_jax import credit

  arrays, meta = load_arrays(out_dir)
  label = os.path.basename(os.path.normpath(out_dir))
  rows = []
  for g in [g for g in group_sizes if g <= arrays.mask_BxGxT.shape[1]]:
    sub = subsample(arrays, g)
    advs = estimator_advantages(sub, meta["algo"], meta["rollout"])
    won = sub.rewards_BxG > 0
    for row in credit.credit_table(advs, sub.oracle_BxGxT, sub.mask_BxGxT, won,
                                   num_resamples=num_resamples, seed=0):
      rows.append({"run": label, "env": meta["env"], "policy": meta["which"], "G": g,
                   "groups": sub.mask_BxGxT.shape[0], "success": float(sub.rewards_BxG.mean()),
                   **row})
  write_csv(rows, os.path.join(out_dir, "results.csv"))
  print(f"{out_dir}: {len(rows)} rows -> results.csv", flush=True)
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--env", choices=sorted(ENV_FAMILIES), help="the checkpoint's environment")
  p.add_argument("--checkpoint", help="a launch.py run directory")
  p.add_argument("--which", default="auto", choices=("auto", "sft", "rl"))
  p.add_argument("--groups", type=int, default=64)
  p.add_argument("--group-size", type=int, default=16, help="G collected (analysed at 4, 8, 16 <= G)")
  p.add_argument("--num-envs", type=int, default=32)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tasks", type=int, default=0,
                 help="draw the groups' tasks from the first N training tasks (default all)")
  p.add_argument("--resamples", type=int, default=400, help="bootstrap resamples over groups")
  p.add_argument("--out", help="output directory (default runs/credit/study/NAME)")
  p.add_argument("--analyze", nargs="+", metavar="DIR", help="re-analyse collected directories")
  p.add_argument("--report", nargs="+", metavar="DIR", help="analysed directories -> report")
  p.add_argument("--name", default="credit", help="report name: reports/NAME.md, reports/NAME/")
  a = p.parse_args(argv)
  if a.report:
    from studies import credit_report
    dirs = sorted({d for pat in a.report for d in glob.glob(pat)})
    credit_report.write_report(dirs, a.name)
    return 0
  dirs = a.analyze or []
  if not dirs:
    if not (a.env and a.checkpoint):
      p.error("give --env and --checkpoint (collect), --analyze DIR or --report DIR")
    name = os.path.basename(os.path.normpath(a.checkpoint)) + (f"_{a.which}" if a.which != "auto" else "")
    dirs = [collect(a.checkpoint, a.which, a.groups, a.group_size, a.seed, a.num_envs,
                    a.out or os.path.join("runs", "credit", "study", name), a.env, a.tasks)]
  for d in dirs:
    analyze(d, num_resamples=a.resamples)
  return 0


if __name__ == "__main__":
  sys.exit(main())
