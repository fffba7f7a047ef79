"""One entry point: `python launch.py [--exp NAME] [--mesh DxM] [--set key=value ...]`.

With no arguments it runs the embedded default experiment, `quickstart`. Bad input (an
unknown experiment, an unknown or ill-typed --set key, a mesh that does not fit the
devices, --resume without a checkpoint, an environment argument, split or task range the
environment refuses, a model directory that does not load, budgets too small for the
environment's prompts or actions, a demonstrations cache from another environment
version) ends with one line that says what is wrong, exit code 2, and nothing written.
SIGTERM or Ctrl-C stop the run after the current SFT batch or RL iteration with its
progress saved (exit code 128 + the signal) and say how to continue (`--resume`); a second
signal exits at once.
`--dry-run` compiles the run's programs on the mesh without weights and prints the
per-device memory plan (csa_jax/run/dry_run.py). `--show-config` prints every config key of the
experiment with its type, value, valid range and help (csa_jax/config_fields.py); `--list`
the experiments by family.

The prompted baseline: the experiment's pretrained model with no training, on its held-out
tasks, written as a run's evaluation (RUN/metrics.jsonl at step 0, RUN/eval/episodes.jsonl):
  python launch.py --exp EXP --prompted [--workdir RUN]  (default RUN: runs/EXP_prompted)

After training (csa_jax/run/posttrain.py), on a run directory:
  python launch.py --workdir RUN --eval [--step N|sft]   held-out evaluation, per episode
  python launch.py --workdir RUN --export-hf DIR         a Hugging Face checkpoint
  python launch.py --workdir RUN --play 3 [--sample]     watch the policy play

A model in llama.cpp's GGUF format (csa_jax/model/gguf.py):
  python launch.py --import-gguf FILE DIR                a Hugging Face directory of it
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
  p.add_argument("--exp", default=None, help="experiment name (see --list; default quickstart)")
  p.add_argument("--list", nargs="?", const="", default=None, metavar="FAMILY",
                 help="list the experiment families (CPU or accelerator, whether they need "
                      "model_path), or with FAMILY its experiments, and exit")
  p.add_argument("--show-config", action="store_true",
                 help="print every config key of the experiment (after --set) with its type, "
                      "value, valid values and help, and exit")
  p.add_argument("--mesh", default=None, help="device mesh DATAxMODEL, e.g. 4x2 (default 1x1)")
  p.add_argument("--workdir", default=None, help="output directory (default runs/EXP)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config leaf, e.g. --set rollout.group_size=4 (repeatable)")
  p.add_argument("--resume", action="store_true", help="continue from the workdir's checkpoint")
  p.add_argument("--prompted", action="store_true",
                 help="evaluate the experiment's pretrained model with no training on its "
                      "held-out tasks (greedy and sampled, per episode) and write the results "
                      "to --workdir (default runs/EXP_prompted) as a run's evaluation")
  p.add_argument("--dry-run", action="store_true",
                 help="compile the sampler, SFT and RL steps ahead of time on the mesh with "
                      "abstract arrays, print per-device memory and exit (no weights, no "
                      "environment, nothing written; exit 1 if it does not fit)")
  after = p.add_argument_group("after training (on --workdir RUN, a finished or stopped run)")
  after.add_argument("--eval", action="store_true",
                     help="evaluate the saved policy on the held-out tasks, greedy and "
                          "sampled, per episode (RUN/eval/step_N.json); --set eval.* changes "
                          "the tasks")
  after.add_argument("--export-hf", default=None, metavar="DIR",
                     help="write the saved policy as a Hugging Face checkpoint to DIR")
  after.add_argument("--play", type=int, default=None, metavar="N",
                     help="play N held-out episodes with the saved policy and print them")
  after.add_argument("--sample", action="store_true",
                     help="--play with sampled actions (eval.temperature) instead of greedy")
  after.add_argument("--step", default=None, metavar="N|sft",
                     help="the checkpoint to use: an RL step, or sft (default: the newest)")
  p.add_argument("--import-gguf", nargs=2, default=None, metavar=("FILE", "DIR"),
                 help="write a Hugging Face directory (config, float32 safetensors, tokenizer, "
                      "chat template) of a llama / qwen2 GGUF file to DIR (new or empty), "
                      "for model_path, and exit")
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
  if args.import_gguf is not None:
    return import_gguf(*args.import_gguf)
  # Imports after argument parsing so --help is instant.
  import experiments
  from csa_jax.config import ConfigError, apply_overrides, cache_dir, validate

  if args.list is not None:
    from experiments import catalog
    try:
      print(catalog.listing(args.list))
    except KeyError as e:
      fail(e.args[0])
    return 0
  if args.eval or args.export_hf is not None or args.play is not None:
    return after_training(args)
  if args.step is not None or args.sample:
    fail("--step and --sample go with --eval, --export-hf or --play")
  try:
    cfg = experiments.get_experiment(args.exp or "quickstart")
    if args.mesh is not None:
      cfg = dataclasses.replace(cfg, mesh=args.mesh)
    cfg = apply_overrides(validate(cfg), args.overrides)
  except (KeyError, ConfigError) as e:
    fail(e.args[0] if isinstance(e, KeyError) and e.args else str(e))

  if args.show_config:
    from csa_jax import config_fields
    print(f"# {cfg.name}: every key (--set KEY=VALUE), its type, value and help "
          "[valid values]")
    print(config_fields.format_table(config_fields.describe(cfg)))
    return 0

  from csa_jax.distributed import mesh as mesh_lib
  mesh_lib.maybe_initialize_distributed()
  mesh_lib.enable_compilation_cache(cache_dir("xla"))
  try:
    mesh_lib.make_mesh(cfg.mesh)
  except ValueError as e:
    fail(str(e))

  if args.dry_run:
    if args.prompted:
      fail("--prompted and --dry-run are two different commands: choose one")
    return dry_run(cfg)
  from csa_jax import pretrained
  try:
    cfg = pretrained.resolve(cfg)  # a packaged model imported, the checkpoint's shape
  except ConfigError as e:
    fail(str(e))
  if args.prompted:
    return prompted(cfg, args)
  if cfg.pretrained and not cfg.model_path:
    fail(f"{cfg.name} is sized for {cfg.pretrained}: --set model_path=DIR (a local copy of "
         "it); --dry-run plans its memory without weights; `--list` shows the CPU-sized "
         "experiments")

  workdir = args.workdir or os.path.join("runs", cfg.name)
  from csa_jax.workdir import unwritable
  problem = unwritable(workdir)
  if problem:
    fail(problem)
  from csa_jax.workdir import CHECKPOINTS, resumable
  if resumable(workdir) and not args.resume:  # (--resume without one: the Trainer refuses)
    fail(f"{workdir} already holds checkpoints; pass --resume to continue it, or choose "
         "another --workdir")

  from csa_jax.rollout.evaluation import summary_table
  from csa_jax.rollout.setup_checks import SetupError, check_environment
  from csa_jax.run.checkpoint import CheckpointError
  from csa_jax.run.signals import Interrupted
  from csa_jax.run.trainer import Trainer
  from csa_jax.update.guard import NonFiniteError
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
    print(f"launch.py: error: {e} (checkpoints in {os.path.join(workdir, CHECKPOINTS)})", file=sys.stderr)
    return 1
  print()
  print(f"Held-out evaluation ({cfg.eval.num_episodes} tasks of the {cfg.env.eval_split} "
        "split, never trained on):")
  print(summary_table(summary, cfg.env.eval_split))
  print(f"\nwritten to {workdir}: metrics.jsonl, tb/, learning_curve.png, config.json, "
        "tokenizer.json, checkpoints/")
  return 0


def after_training(args) -> int:
  """--eval, --export-hf DIR, --play N on the run in --workdir (csa_jax/run/posttrain.py)."""
  from csa_jax.config import ConfigError
  from csa_jax.run import posttrain
  from csa_jax.workdir import unwritable
  if not args.workdir:
    fail("--eval, --export-hf and --play need --workdir RUN (a run directory of launch.py)")
  if args.exp is not None or args.resume or args.dry_run or args.show_config or args.prompted:
    fail("--eval, --export-hf and --play read the run's own config.json: drop --exp, "
         "--resume, --dry-run, --show-config and --prompted (--set still applies)")
  if args.play is not None and args.play < 1:
    fail(f"--play {args.play}: the number of episodes must be >= 1")
  try:
    if args.export_hf is not None:
      posttrain.check_export_dir(args.export_hf)
    if args.eval:
      problem = unwritable(args.workdir)
      if problem:
        fail(problem)
    saved = posttrain.load(args.workdir, args.step, args.overrides, args.mesh)
  except ConfigError as e:
    fail(str(e))
  print(f"{args.workdir}: {saved.cfg.name}, {method_name(saved.cfg)}, checkpoint {saved.step}")
  if args.export_hf is not None:
    files = posttrain.export_hf(saved, args.export_hf)
    print(f"exported to {args.export_hf}: {', '.join(files)}")
  if args.play is not None:
    for traj in posttrain.play(saved, args.play, greedy=not args.sample):
      print(posttrain.format_episode(traj, saved.tok, greedy=not args.sample))
  if args.eval:
    result = posttrain.evaluate(saved)
    print(posttrain.eval_report(result))
    print(f"\nwritten to {posttrain.write_eval(saved, result)}")
  return 0


def prompted(cfg, args) -> int:
  """--prompted: the pretrained model's held-out evaluation with no training."""
  from csa_jax.rollout.setup_checks import SetupError, check_environment
  from csa_jax.run import posttrain
  from csa_jax.workdir import CHECKPOINTS, has_sft_checkpoint, unwritable
  if args.resume:
    fail("--prompted trains nothing: drop --resume")
  workdir = args.workdir or os.path.join("runs", f"{cfg.name}_prompted")
  problem = unwritable(workdir)
  if problem:
    fail(problem)
  if has_sft_checkpoint(workdir) or os.path.isdir(os.path.join(workdir, CHECKPOINTS)):
    fail(f"{workdir} holds a training run; --prompted writes its own directory: choose "
         "another --workdir")
  try:
    check_environment(cfg)
    saved = posttrain.load_prompted(cfg, workdir)
  except (SetupError, posttrain.RunError) as e:
    fail(str(e))
  print(f"experiment {cfg.name}: prompted baseline of {cfg.pretrained or cfg.model_path} "
        f"(no training), env {cfg.env.name} {dict(cfg.env.kwargs)}, workdir {workdir}")
  result = posttrain.evaluate(saved)
  print(posttrain.eval_report(result))
  print(f"\nwritten to {workdir}: {', '.join(posttrain.write_prompted(saved, result))}")
  return 0


def import_gguf(path: str, out_dir: str) -> int:
  """--import-gguf FILE DIR (csa_jax/model/gguf.py)."""
  from csa_jax.model import gguf
  from csa_jax.workdir import unwritable
  problem = unwritable(out_dir, "--import-gguf")
  if problem:
    fail(problem)
  try:
    record = gguf.import_gguf(path, out_dir)
  except gguf.GGUFError as e:
    fail(f"--import-gguf: {e}")
  print(gguf.summary(record, out_dir))
  return 0


def dry_run(cfg) -> int:
  from csa_jax.run import dry_run as dry
  try:
    plan = dry.plan(cfg)
  except (FileNotFoundError, ValueError) as e:  # a model_path without config.json, ...
    fail(str(e).splitlines()[0])
  print(dry.verdict(plan))
  return 1 if plan.fits is False else 0


if __name__ == "__main__":
  sys.exit(main())
