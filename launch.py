"""One entry point: `python launch.py [--exp NAME] [--mesh DxM] [--set key=value ...]`.

With no arguments it runs the embedded default experiment, `quickstart`. Bad input (an
unknown experiment, an unknown or ill-typed --set key, a mesh that does not fit the
devices, --resume without a checkpoint, an environment argument, split or task range the
environment refuses, a model directory that does not load, budgets too small for the
environment's prompts or actions, a demonstrations cache from another environment
version) ends with one line that says what is wrong, exit code 2, and nothing written.
SIGTERM or Ctrl-C stop the run after the current RL iteration with a checkpoint saved
(exit code 128 + the signal) and say how to continue; a second signal exits at once.
`--dry-run` compiles the run's programs on the mesh without weights and prints the
per-device memory plan (csa_jax/dry_run.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
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
  p.add_argument("--dry-run", action="store_true",
                 help="compile the sampler, SFT and RL steps ahead of time on the mesh with "
                      "abstract arrays, print per-device memory and exit (no weights, no "
                      "environment, nothing written; exit 1 if it does not fit)")
  return p.parse_args(argv)


def fail(msg: str) -> None:
  print(f"launch.py: error: {msg}", file=sys.stderr)
  sys.exit(2)


def method_name(cfg) -> str:
  """"method estimator csa", "method istar", ...: what drives the run's RL iterations."""
  from csa_jax.algorithms import label
  return f"method {label(cfg.algo)}"


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

  if args.dry_run:
    return dry_run(cfg)
  if cfg.pretrained and not cfg.model_path:
    fail(f"{cfg.name} is sized for {cfg.pretrained}: --set model_path=DIR (a local copy of "
         "it); --dry-run plans its memory without weights; `--list` shows the CPU-sized "
         "experiments")

  workdir = args.workdir or os.path.join("runs", cfg.name)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  has_ckpt = os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir))
  if has_ckpt and not args.resume:
    fail(f"{workdir} already holds checkpoints; pass --resume to continue it, or choose "
         "another --workdir")
  if args.resume and not has_ckpt:
    fail(f"--resume: no checkpoint in {ckpt_dir}")

  from csa_jax.checkpoint import CheckpointError
  from csa_jax.signals import Interrupted
  from csa_jax.evaluation import summary_table
  from csa_jax.guard import NonFiniteError
  from csa_jax.setup_checks import SetupError, check_environment
  from csa_jax.trainer import Trainer
  from environments.demos import DemosError
  try:
    check_environment(cfg)  # before anything is written
  except SetupError as e:
    fail(str(e))
  print(f"experiment {cfg.name}: env {cfg.env.name} {dict(cfg.env.kwargs)}, "
        f"{method_name(cfg)}, mesh {cfg.mesh}, workdir {workdir}")
  created = not os.path.exists(workdir)
  try:
    summary = Trainer(cfg, workdir, resume=args.resume).run()
  except (SetupError, CheckpointError, DemosError) as e:
    if created:  # refused at start: leave nothing half-written behind
      shutil.rmtree(workdir, ignore_errors=True)
    fail(str(e))
  except Interrupted as e:
    again = " ".join(["python", "launch.py"] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)])
    more = (f"; continue with: {again}{'' if args.resume else ' --resume'}" if e.saved else "")
    print(f"launch.py: {e}{more}", file=sys.stderr)
    return e.exit_code
  except NonFiniteError as e:
    print(f"launch.py: error: {e} (checkpoints in {ckpt_dir})", file=sys.stderr)
    return 1
  print()
  print(f"Held-out evaluation ({cfg.eval.num_episodes} tasks of the {cfg.env.eval_split} "
        "split, never trained on):")
  print(summary_table(summary, cfg.env.eval_split))
  print(f"\nwritten to {workdir}: metrics.jsonl, tb/, learning_curve.png, config.json, "
        "tokenizer.json, checkpoints/")
  return 0


def dry_run(cfg) -> int:
  from csa_jax import dry_run as dry
  try:
    plan = dry.plan(cfg)
  except (FileNotFoundError, ValueError) as e:  # a model_path without config.json, ...
    fail(str(e).splitlines()[0])
  print(dry.verdict(plan))
  return 1 if plan.fits is False else 0


if __name__ == "__main__":
  sys.exit(main())
