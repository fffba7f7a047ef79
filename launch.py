"""One entry point: `python launch.py [--exp NAME] [--mesh DxM] [--set key=value ...]`.

With no arguments it runs the embedded default experiment, `quickstart`. Bad input (an
unknown experiment, an unknown or ill-typed --set key, a mesh that does not fit the
devices, --resume without a checkpoint) ends with one line that says what is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--exp", default="quickstart", help="experiment name (see --list)")
  p.add_argument("--list", action="store_true", help="list the experiments and exit")
  p.add_argument("--mesh", default=None, help="device mesh DATAxMODEL, e.g. 4x2 (default 1x1)")
  p.add_argument("--workdir", default=None, help="output directory (default runs/EXP)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config leaf, e.g. --set rollout.group_size=4 (repeatable)")
  p.add_argument("--resume", action="store_true", help="continue from the workdir's checkpoint")
  return p.parse_args(argv)


def fail(msg: str) -> None:
  print(f"launch.py: error: {msg}", file=sys.stderr)
  sys.exit(2)


def main(argv=None) -> int:
  args = parse_args(argv)
  # Imports after argument parsing so --help is instant.
  import experiments
  from csa_jax.config import ConfigError, apply_overrides, validate

  if args.list:
    for name, doc in experiments.list_experiments().items():
      print(f"{name:28s} {doc}")
    return 0
  try:
    cfg = experiments.get_experiment(args.exp)
    if args.mesh is not None:
      cfg = dataclasses.replace(cfg, mesh=args.mesh)
    cfg = apply_overrides(validate(cfg), args.overrides)
  except (KeyError, ConfigError) as e:
    fail(str(e).strip("'\""))

  from csa_jax import mesh as mesh_lib
  mesh_lib.maybe_initialize_distributed()
  try:
    mesh_lib.make_mesh(cfg.mesh)
  except ValueError as e:
    fail(str(e))

  workdir = args.workdir or os.path.join("runs", cfg.name)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  has_ckpt = os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir))
  if has_ckpt and not args.resume:
    fail(f"{workdir} already holds checkpoints; pass --resume to continue it, or choose "
         "another --workdir")
  if args.resume and not has_ckpt:
    fail(f"--resume: no checkpoint in {ckpt_dir}")

  from csa_jax.algorithms import label
  from csa_jax.trainer import Trainer, summary_table
  print(f"experiment {cfg.name}: env {cfg.env.name} {dict(cfg.env.kwargs)}, "
        f"method {label(cfg.algo)}, mesh {cfg.mesh}, workdir {workdir}")
  summary = Trainer(cfg, workdir, resume=args.resume).run()
  print()
  print(f"Held-out evaluation ({cfg.eval.num_episodes} tasks of the {cfg.env.eval_split} "
        "split, never trained on):")
  print(summary_table(summary, cfg.env.eval_split))
  print(f"\nwritten to {workdir}: metrics.jsonl, tb/, learning_curve.png, config.json, "
        "tokenizer.json, checkpoints/")
  return 0


if __name__ == "__main__":
  sys.exit(main())
