"""Methods x seeds on one experiment family, each seed's methods from one shared SFT start.

    python -m studies.sweep --family coin_doors --seeds 5 \
        --methods grpo,dr_grpo,rloo,dapo,gigpo,csa,csa_dapo,csa_lam0,csa_lam1 --name coin_doors

For every seed s: one SFT run (`{family}_grpo` with `rl_iterations=0`, `seed=s`), then one
RL run per method (`{family}_{method}`, `seed=s`, `sft.init_from=` that SFT run), so the
methods of a seed differ only in the algorithm (the proposal's paired comparison). Runs go
seed by seed, so a sweep stopped early holds whole seeds.

Where things go: each run's work directory (checkpoints, TensorBoard) is
`runs/sweeps/NAME/RUN/` (not committed); when a run finishes, its small result files
(`metrics.jsonl`, `config.json`, the per-episode outcomes `eval/episodes.jsonl`) and an
empty `DONE` are copied to `reports/NAME/runs/RUN/`,
which `python -m studies.report --name NAME` reads. With `--commit` each finished
run's files are committed at once, so a session that ends mid-sweep loses nothing finished,
and `reports/NAME/commands.txt` before the first run, so that no run starts from a tree
the sweep itself left unclean.

Continuing: run the same command again. Finished runs (DONE in reports/) are skipped; a
run killed midway resumes from its last checkpoint (`--resume`); an RL run whose SFT start
is gone (a fresh machine) has it rebuilt first, from demonstrations built on that machine
(TextWorldExpress "coin" draws its expert's walk anew per JVM, so such a seed's SFT start
differs from the one its earlier runs used: `reports/NAME/runs/sft_seedS/metrics.jsonl`
tells which SFT evaluation each seed's deltas are taken against).

Kept starts (`--keep-starts`): a finished SFT start's weights and tokenizer (`sft/`,
`tokenizer.json`: what an RL run reads through `sft.init_from`) are also copied to
`reports/NAME/starts/RUN/` (and committed with its files), and a machine without the start's
work directory restores it from there instead of training it again: a study that spans
several sessions, each on a fresh machine, trains each start once. The copy is byte for
byte, so an RL run from a restored start is the run it would have been.

Cost: each attempt's wall and CPU seconds (the run's process and its children) and the UTC
time it ended are appended to `reports/NAME/costs.jsonl`, committed with the runs
(`--commit`: a finished run's line with its files, a failed attempt's at once), so a
study's cost outlives the machines that ran it. An attempt killed with the sweep writes
none.

Parallelism: `--jobs` runs at once (default 2, one per core), each process limited to one
XLA CPU thread; JAX's persistent compilation cache (`runs/sweeps/NAME/jax_cache`) lets
every run after the first skip compiling the sampler and the update.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from csa_jax import workdir as workdir_lib

# Per-episode outcomes (csa_jax/rollout/metrics.py, EPISODES_FILE) make paired per-task tests
# possible; runs written before they were kept have none.
# The oracle action's probability per task (eval.oracle_prob) where a run computed it.
RESULT_FILES = ("metrics.jsonl", "config.json", os.path.join("eval", "episodes.jsonl"),
                os.path.join("eval", "oracle_probs.jsonl"))
OPTIONAL_RESULT_FILES = (os.path.join("eval", "episodes.jsonl"),
                         os.path.join("eval", "oracle_probs.jsonl"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What an RL run reads from its SFT start (`sft.init_from`), kept under reports/NAME/STARTS.
START_FILES = (workdir_lib.SFT, "tokenizer.json")
STARTS = "starts"


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # "sft_seed0", "csa_seed0"
  exp: str
  seed: int
  overrides: tuple[str, ...]
  needs: str | None  # the SFT run this one starts from
  prompted: bool = False  # `launch.py --prompted`: the untrained model's evaluation


def plan(family: str | list[str], methods: list[str], seeds: list[int], extra: list[str],
         work_root: str, by_family: bool = False, prompted: bool = False) -> list[Run]:
  """Seed-major: SFT of seed s, then its methods, then seed s + 1 (with several families,
  every family's runs of seed s before seed s + 1). With several families (or
  `by_family`) a run is named FAMILY/RUN, so each family's runs live in a folder of
  their own and one study can hold several families (the horizons of experiments/keydoor.py).
  With `prompted`, each seed begins with `prompted_seed<s>`: the pretrained model with no
  training, evaluated like the SFT start (`launch.py --prompted`, the same overrides)."""
  families = [family] if isinstance(family, str) else list(family)
  by_family = by_family or len(families) > 1
  runs = []
  for s in seeds:
    for fam in families:
      where = f"{fam}/" if by_family else ""
      sft = f"{where}sft_seed{s}"
      if prompted:
        runs.append(Run(f"{where}prompted_seed{s}", f"{fam}_grpo", s, (f"seed={s}", *extra),
                        None, prompted=True))
      # rl_iterations=0 last: an `--set rl_iterations=N` meant for the RL runs must not
      # turn the SFT start into an RL run (the later override wins).
      runs.append(Run(sft, f"{fam}_grpo", s, (f"seed={s}", *extra, "rl_iterations=0"), None))
      for m in methods:
        runs.append(Run(f"{where}{m}_seed{s}", f"{fam}_{m}", s,
                        (f"seed={s}", f"sft.init_from={os.path.join(work_root, sft)}", *extra),
                        sft))
  return runs


class Sweep:
  def __init__(self, args: argparse.Namespace):
    self.args = args
    self.work_root = os.path.join(args.runs_dir, "sweeps", args.name)
    self.report_root = os.path.join(args.reports_dir, args.name, "runs")
    self.costs_path = os.path.join(args.reports_dir, args.name, "costs.jsonl")
    os.makedirs(self.work_root, exist_ok=True)
    os.makedirs(self.report_root, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    self.runs = plan(args.family.split(","), methods, args.seed_list, list(args.overrides),
                     self.work_root, by_family=args.by_family, prompted=args.prompted)
    self._check_experiments()

  def _check_experiments(self) -> None:
    import experiments
    known = experiments.list_experiments()
    missing = sorted({r.exp for r in self.runs} - set(known))
    if missing:
      sys.exit(f"sweep: unknown experiments {', '.join(missing)} (family "
               f"{self.args.family!r}; `python launch.py --list` shows them)")

  def done(self, run: Run) -> bool:
    return os.path.exists(os.path.join(self.report_root, run.name, "DONE"))

  def _sft_ready(self, sft: str) -> bool:
    """The SFT run has saved its parameters (workdir/sft holds a finished step; the
    directory itself exists from the run's first second), here or as a kept start of a
    finished run, which is then restored here."""
    work = os.path.join(self.work_root, sft)
    kept = self._kept(sft)
    if (not workdir_lib.has_sft_checkpoint(work) and workdir_lib.has_sft_checkpoint(kept)
        and os.path.exists(os.path.join(self.report_root, sft, "DONE"))):
      copy_start(kept, work)
      print(f"  {sft}: its kept start restored from {kept}", flush=True)
    return workdir_lib.has_sft_checkpoint(work)

  def _kept(self, sft: str) -> str:
    return os.path.join(self.args.reports_dir, self.args.name, STARTS, sft)

  def command(self, run: Run) -> list[str]:
    workdir = os.path.join(self.work_root, run.name)
    cmd = [sys.executable, os.path.join(ROOT, "launch.py"), "--exp", run.exp,
           "--workdir", workdir]
    for o in run.overrides:
      cmd += ["--set", o]
    if run.prompted:  # one evaluation, no checkpoint: an interrupted one starts again
      return cmd + ["--prompted"]
    if self._has_checkpoint(run):
      cmd.append("--resume")
    return cmd

  def _has_checkpoint(self, run: Run) -> bool:
    """A checkpoint to resume from: an RL one, or SFT's progress (a run stopped during
    SFT), as launch.py counts them."""
    from csa_jax.run import sft_progress  # pylint: disable=import-outside-toplevel
    workdir = os.path.join(self.work_root, run.name)
    ckpt = os.path.join(workdir, "checkpoints")
    return ((os.path.isdir(ckpt) and any(d.isdigit() for d in os.listdir(ckpt)))
            or sft_progress.exists(workdir))

  def _env(self) -> dict[str, str]:
    env = dict(os.environ)
    # One XLA CPU thread per run: `--jobs` runs share the cores without oversubscribing.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                        " intra_op_parallelism_threads=1").strip()
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.abspath(os.path.join(self.work_root, "jax_cache"))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    env["TQDM_MININTERVAL"] = "30"
    return env

  def execute(self, run: Run) -> tuple[Run, int, float]:
    t0 = time.time()
    log = os.path.join(self.work_root, f"{run.name}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    if run.prompted or not self._has_checkpoint(run):  # killed before a checkpoint: anew
      shutil.rmtree(os.path.join(self.work_root, run.name), ignore_errors=True)
    with open(log, "a") as f:
      f.write("$ " + shlex.join(self.command(run)) + "\n")
      f.flush()
      proc = subprocess.Popen(self.command(run), stdout=f, stderr=subprocess.STDOUT,
                              env=self._env(), cwd=ROOT)
      # wait4: this run's own CPU seconds (with its children), which a shared machine's
      # wall time does not tell; each attempt of a resumed run is one line.
      _, status, usage = os.wait4(proc.pid, 0)
      proc.returncode = rc = os.waitstatus_to_exitcode(status)
    cost = {"run": run.name, "rc": rc, "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if rc == 0:
      self._publish(run, cost)
    else:
      self._record_cost(cost, [], f"sweep {self.args.name}: {run.name} failed (its cost)")
    return run, rc, time.time() - t0

  def _record_cost(self, cost: dict, paths: list[str], message: str) -> None:
    """Appends the attempt's cost line and commits it with `paths` in one hold of the git
    lock: costs.jsonl is tracked, so the shorter it stays changed, the less chance a run
    starting meanwhile records an unclean tree."""
    with _GIT_LOCK:
      with open(self.costs_path, "a") as f:
        f.write(json.dumps(cost) + "\n")
      if self.args.commit:
        commit_paths(paths + [self.costs_path], message)

  def _publish(self, run: Run, cost: dict) -> None:
    """Copies the run's small result files to reports/ and marks it DONE."""
    src = os.path.join(self.work_root, run.name)
    dst = os.path.join(self.report_root, run.name)
    os.makedirs(dst, exist_ok=True)
    for f in RESULT_FILES:
      if f in OPTIONAL_RESULT_FILES and not os.path.exists(os.path.join(src, f)):
        continue
      os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
      shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    open(os.path.join(dst, "DONE"), "w").close()
    paths = [dst]
    if self.args.keep_starts and run.needs is None and not run.prompted:
      copy_start(src, self._kept(run.name))
      paths.append(self._kept(run.name))
    self._record_cost(cost, paths, f"sweep {self.args.name}: {run.name}")

  def run(self) -> int:
    todo = [r for r in self.runs if not self.done(r)]
    print(f"sweep {self.args.name}: {len(self.runs)} runs, {len(self.runs) - len(todo)} "
          f"already done, {len(todo)} to run with {self.args.jobs} jobs; logs in "
          f"{self.work_root}", flush=True)
    commands = self._write_commands()
    if self.args.commit:  # before any run starts, so that no run records an unclean tree
      commit_paths([commands], f"sweep {self.args.name}: commands.txt")
    failed: set[str] = set()
    pending = list(todo)
    running = {}
    finished = len(self.runs) - len(todo)
    with ThreadPoolExecutor(self.args.jobs) as pool:
      while pending or running:
        # Start what can start: an RL run waits for its seed's SFT start.
        for run in list(pending):
          if len(running) >= self.args.jobs:
            break
          if run.needs and run.needs in failed:
            pending.remove(run)
            failed.add(run.name)
            print(f"  skip {run.name}: its SFT run failed", flush=True)
            continue
          if run.needs and not self._sft_ready(run.needs):
            if any(r.name == run.needs for r in list(pending) + list(running.values())):
              continue  # its SFT run is queued or running
            sft = next(r for r in self.runs if r.name == run.needs)  # rebuild a lost start
            pending.insert(0, sft)
            continue
          pending.remove(run)
          running[pool.submit(self.execute, run)] = run
        if not running:
          continue
        fut = next(as_completed(running))
        del running[fut]
        run, rc, secs = fut.result()
        finished += rc == 0
        if rc != 0:
          failed.add(run.name)
        print(f"[{finished}/{len(self.runs)}] {run.name} {'done' if rc == 0 else f'FAILED rc={rc}'}"
              f" in {secs:.0f} s{self._headline(run) if rc == 0 else ''}", flush=True)
    if failed:
      print(f"sweep {self.args.name}: {len(failed)} runs failed: {', '.join(sorted(failed))}"
            f" (logs in {self.work_root})")
      return 1
    print(f"sweep {self.args.name}: all {len(self.runs)} runs done; report with "
          f"`python -m studies.report --name {self.args.name}`")
    return 0

  def _headline(self, run: Run) -> str:
    from csa_jax.rollout.metrics import read_jsonl
    recs = read_jsonl(os.path.join(self.report_root, run.name, "metrics.jsonl"))
    last = [r for r in recs if "eval_sampled/success" in r or "eval/success" in r]
    if not last:
      return ""
    r = last[-1]
    parts = [f"{k.split('/')[0]} {r[k]:.3f}" for k in ("eval/success", "eval_sampled/success")
             if k in r]
    return " (held-out success: " + ", ".join(parts) + ")"

  def _write_commands(self) -> str:
    """reports/NAME/commands.txt: every sweep command that added runs to the study (a
    study can be filled by several, e.g. one arm per set of families), then the report's;
    returns its path."""
    path = os.path.join(self.args.reports_dir, self.args.name, "commands.txt")
    argv = shlex.join(["python", "-m", "studies.sweep"] + self.args.argv)
    old = open(path).read().splitlines() if os.path.exists(path) else []
    # Studies begun before the tools moved to studies/ name the old module.
    old = [line.replace("-m experiments.sweep", "-m studies.sweep") for line in old]
    sweeps = [line for line in old if line.startswith("python -m studies.sweep")]
    sweeps += [argv] if argv not in sweeps else []
    with open(path, "w") as f:
      f.writelines(line + "\n" for line in sweeps)
      f.write(f"python -m studies.report --name {self.args.name}\n")
    return path


def copy_start(src: str, dst: str) -> None:
  """An SFT start's START_FILES from one run directory to another, which they replace."""
  shutil.rmtree(dst, ignore_errors=True)
  os.makedirs(dst)
  for f in START_FILES:
    copy = shutil.copytree if os.path.isdir(os.path.join(src, f)) else shutil.copy
    copy(os.path.join(src, f), os.path.join(dst, f))


# The jobs' threads commit one at a time: two runs ending together raced for git's index
# lock, and the loser's files stayed uncommitted.
_GIT_LOCK = threading.RLock()  # _record_cost holds it around commit_paths


def commit_paths(paths: list[str], message: str, cwd: str = ROOT) -> None:
  """Commits these paths' changes alone (nothing where they have none). A run records
  whether the checkout had uncommitted changes to tracked files (config.json
  `provenance.git_dirty`), and a report flags it, so the sweep's own writes (a run's
  files, commands.txt) are committed as they are made."""
  with _GIT_LOCK:
    subprocess.call(["git", "add", "--", *paths], cwd=cwd)
    if subprocess.call(["git", "diff", "--cached", "--quiet", "--", *paths], cwd=cwd) == 1:
      subprocess.call(["git", "commit", "-q", "-m", message, "--", *paths], cwd=cwd)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--family", required=True,
                 help="experiment family, e.g. coin_doors, or several, comma-separated "
                      "(keydoor_h4,keydoor_h16,keydoor_h48): runs go to FAMILY/RUN")
  p.add_argument("--by-family", action="store_true",
                 help="name runs FAMILY/RUN with one family too (to add to such a study)")
  p.add_argument("--methods", default="grpo,dr_grpo,rloo,dapo,gigpo,csa,csa_dapo,csa_lam0,csa_lam1")
  p.add_argument("--seeds", type=int, default=5, help="how many seeds")
  p.add_argument("--seed-offset", type=int, default=0, help="first seed")
  p.add_argument("--seed-list", default=None, metavar="S,S,...",
                 help="these seeds instead of --seeds and --seed-offset (a study whose seeds "
                      "are chosen by a rule on their SFT starts)")
  p.add_argument("--name", default=None, help="study name (default: the family)")
  p.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="config override for every run (repeatable)")
  p.add_argument("--prompted", action="store_true",
                 help="also evaluate the untrained pretrained model per seed (prompted_seedS)")
  p.add_argument("--commit", action="store_true", help="git-commit each finished run's files")
  p.add_argument("--keep-starts", action="store_true",
                 help="also keep each SFT start's weights under reports/NAME/starts/ "
                      "(restored from there on a machine that lacks them)")
  p.add_argument("--runs-dir", default=os.path.join(ROOT, "runs"))
  p.add_argument("--reports-dir", default=os.path.join(ROOT, "reports"))
  args = p.parse_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)  # for commands.txt
  args.name = args.name or args.family
  if args.seeds < 1 or args.jobs < 1:
    p.error("--seeds and --jobs must be >= 1")
  try:
    args.seed_list = (list(range(args.seed_offset, args.seed_offset + args.seeds))
                      if args.seed_list is None
                      else [int(x) for x in args.seed_list.split(",") if x.strip()])
  except ValueError:
    p.error(f"--seed-list {args.seed_list!r}: comma-separated integers, e.g. 0,1,3")
  seeds = args.seed_list
  if not seeds or min(seeds) < 0 or len(set(seeds)) < len(seeds):
    p.error(f"--seed-list {args.seed_list}: distinct seeds >= 0, at least one")
  owned = [o for o in args.overrides if o.split("=", 1)[0].strip() in ("seed", "sft.init_from")]
  if owned:
    p.error(f"--set {owned[0]}: the sweep sets seed and sft.init_from itself "
            "(--seeds, --seed-offset; every RL run starts from its seed's SFT run)")
  return args


def main(argv=None) -> int:
  return Sweep(parse_args(argv)).run()


if __name__ == "__main__":
  sys.exit(main())
