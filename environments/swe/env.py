"""`swe`: a software-engineering agent environment over SWE-bench-format instances.

Each episode is one instance (`grading.Instance`): its repository at base_commit, exported
into a fresh working copy in a temporary directory; the agent acts with the commands of
`actions.py` (run / view / search / replace / submit); commands run in `sandbox.py`'s
sandbox with a time limit and an output cap. At `submit` the working copy's diff against
base_commit is graded as SWE-bench grades a model patch (`grading.grade`: the hidden
test_patch applied only then, FAIL_TO_PASS and PASS_TO_PASS run): reward 1 when resolved,
else 0. Reaching `step_limit` grades the current diff the same way (SWE-agent's
auto-submission at its limits) and marks the step truncated.

Sources:
  source="synth" (default): `synth.py`'s bugs in `toolz`, made offline and cached
    (splits "train" and "test", disjoint modules). Not SWE-bench; see synth.py.
  source="swebench": instances from `instances` (a SWE-bench .json/.jsonl file or a
    directory of them; e.g. SWE-bench Lite exported from its dataset) with repository
    clones under `repos_dir`; every split is the whole file. Not run here (no data, no
    per-instance images): tested only on a tiny instance in that exact format.

StepInfo:
  * task: the problem statement; the reset observation says where the repository is and
    the command syntax.
  * admissible_actions: the five command templates (`actions.TEMPLATES`); a policy fills them.
  * anchor: a hash of the working copy's diff against base_commit: the repository state,
    without history (two steps that leave the same files have the same anchor).
  * action_valid: False when the text does not parse, a path leaves the working copy, or a
    replacement's old text is not found exactly once; a command that runs and fails is valid.
  * oracle_label (only with `oracle_labels=True`, for the study, never for training): the
    change in the number of FAIL_TO_PASS tests that pass, grading the current diff after
    each step (a test run per changed state; cached by diff).
  * extra: instance_id, split, f2p_passed / p2p_passed after grading, killed (a command's
    runaway kill reason), sandbox mechanism.

Expert: the gold patch applied through the agent's own actions: for each hunk a `view` of
its lines and a `replace` of its old lines by its new lines, then `submit`. Off that path
(the diff is neither base, a prefix of the plan, nor gold) it first restores the working
copy with `run git checkout -q -- . && git clean -fdq` and starts the plan again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile

from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import register_env
from environments.swe import actions as A
from environments.swe import grading
from environments.swe import synth
from environments.swe.sandbox import Limits, Sandbox

_RESTORE = "run git checkout -q -- . && git clean -fdq"


def _default_cache() -> str:
  root = (os.environ.get("CSA_JAX_CACHE")
          or os.path.join(os.path.expanduser("~"), ".cache", "csa_jax"))
  return os.path.join(root, "swe")


@register_env("swe", revision=1, engines=("toolz",))
class SweEnv(TextEnv):
  """A repository working copy, shell and edit commands, SWE-bench grading at submit."""

  def __init__(self, source: str = "synth", instances: str = "", repos_dir: str = "",
               cache_dir: str = "", seed: int = 0, num_train: int = 100, num_test: int = 10,
               step_limit: int = 30, max_obs_chars: int = 2000, command_time_s: float = 20.0,
               grade_time_s: float = 120.0, max_processes: int = 512, mechanism: str = "",
               oracle_labels: bool = False):
    if source not in ("synth", "swebench"):
      raise ValueError(f"source={source!r}; valid: synth, swebench")
    if not isinstance(step_limit, int) or step_limit < 1:
      raise ValueError(f"step_limit={step_limit!r}; must be a positive integer")
    self._source = source
    self._mechanism = mechanism or None
    self._limits = Limits(time_s=command_time_s, cpu_s=int(command_time_s),
                          nproc=max_processes)
    self._grade_limits = Limits(time_s=grade_time_s, cpu_s=int(grade_time_s),
                                output_bytes=16_000_000)
    self._step_limit = step_limit
    self._max_obs = max_obs_chars
    self._oracle = bool(oracle_labels)
    # Grading runs the repository's tests with `python -m pytest` (grading.py): a
    # run-time dependency of this environment (requirements.txt), not only of the suite.
    if importlib.util.find_spec("pytest") is None:
      raise ValueError("the swe environment grades with pytest, which is not installed: "
                       "pip install -r requirements.txt (or pip install pytest)")
    if source == "synth":
      self._synth = synth.SynthTasks(cache_dir or _default_cache(), seed, self._mechanism)
      self._repos_dir = self._synth.repos_dir
      self._counts = {"train": num_train, "test": num_test}
      self.splits = ("train", "test")
    else:
      if not instances or not repos_dir:
        raise ValueError("source='swebench' needs instances=PATH and repos_dir=PATH")
      self._instances = grading.load_instances(instances)
      self._repos_dir = repos_dir
      self.splits = ("train", "dev", "test")
    self._root = os.path.realpath(tempfile.mkdtemp(prefix="swe_env_"))
    self._bases: dict[str, str] = {}  # instance_id -> exported base tree (cached per env)
    self._inst: grading.Instance | None = None
    self._box: Sandbox | None = None
    self._done = True

  # ---- tasks --------------------------------------------------------------------------------

  def num_tasks(self, split: str) -> int:
    if split not in self.splits:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(self.splits)}")
    return self._counts[split] if self._source == "synth" else len(self._instances)

  def instance(self, split: str, index: int) -> grading.Instance:
    n = self.num_tasks(split)
    if not isinstance(index, int) or not 0 <= index < n:
      raise IndexError(f"index {index!r} out of range for split {split!r} with {n} tasks")
    if self._source == "synth":
      return self._synth.instance(split, index)
    return self._instances[index]

  def _base_tree(self, inst: grading.Instance) -> str:
    return self._base(inst)[0]

  def _base(self, inst: grading.Instance) -> tuple[str, str, str]:
    """(exported base tree, a git dir with it committed, that commit), made once per env."""
    if inst.instance_id not in self._bases:
      dest = os.path.join(self._root, "bases", inst.instance_id)
      grading.export_tree(grading.find_repo(self._repos_dir, inst.repo), inst.base_commit, dest)
      git_dir = dest + ".git"
      self._bases[inst.instance_id] = (dest, git_dir, grading.init_snapshot(dest, git_dir))
    return self._bases[inst.instance_id]

  # ---- episode ------------------------------------------------------------------------------

  def reset(self, split: str, index: int) -> StepResult:
    inst = self.instance(split, index)
    base, base_git, self._base_commit = self._base(inst)
    self._close_episode()
    self._work = os.path.join(self._root, "work")
    self._git = os.path.join(self._root, "git")  # private: the sandbox never sees it
    shutil.copytree(base, self._work, symlinks=True)
    shutil.copytree(base_git, self._git)
    # The agent's own git repository, a copy: its `git diff` works; grading uses ours.
    shutil.copytree(self._git, os.path.join(self._work, ".git"))
    self._box = Sandbox(self._work, self._limits, self._mechanism)
    self._inst, self._split = inst, split
    self._steps, self._done = 0, False
    self._graded: dict[str, grading.Report] = {}
    self._f2p = 0 if self._oracle else None
    self._plan = self._expert_plan()
    self._plan_pos = 0
    obs = (f"The repository {inst.repo} is checked out in the current directory "
           f"(a git repository). Commands, one per action:\n" + "\n".join(A.TEMPLATES))
    return StepResult(obs, 0.0, False, self._info(valid=True))

  def step(self, action: str) -> StepResult:
    if self._inst is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    if not isinstance(action, str):
      raise TypeError(f"action must be a string, got {type(action).__name__}")
    self._steps += 1
    killed = None
    try:
      if "\x00" in action:
        raise A.ParseError("the action holds a NUL byte")
      act = A.parse(action)
      valid = True
      if act.kind == "submit":
        return self._finish(truncated=False)
      obs, valid, killed = getattr(self, f"_do_{act.kind}")(*act.args)
    except A.ParseError as e:
      obs, valid = f"Invalid action: {e}", False
    except (OSError, ValueError) as e:  # a host-side file operation the path does not allow
      obs, valid = f"Error: {e}", False
    self._track_expert(action)
    label = self._oracle_label()
    if self._steps >= self._step_limit:
      return self._finish(truncated=True, observation=A.truncate(obs, self._max_obs),
                          valid=valid, label=label)
    return StepResult(A.truncate(obs, self._max_obs), 0.0, False,
                      self._info(valid=valid, label=label, killed=killed))

  def _finish(self, truncated: bool, observation: str = "", valid: bool = True,
              label: float | None = None) -> StepResult:
    report = self._grade(self._diff())
    self._done = True
    verdict = "resolved" if report.resolved else "not resolved"
    obs = (observation + "\n" if observation else "") + (
        f"Submitted ({'step limit reached; ' if truncated else ''}{verdict}).")
    won = report.resolved
    if self._oracle and label is None:
      label, self._f2p = float(report.f2p_passed - self._f2p), report.f2p_passed
    return StepResult(obs, 1.0 if won else 0.0, True, self._info(
        valid=valid, label=label, won=won, truncated=truncated and not won, report=report))

  # ---- commands -----------------------------------------------------------------------------

  def _path(self, rel: str) -> str | None:
    """The absolute path of `rel` if it stays inside the working copy (symlinks resolved)."""
    p = os.path.realpath(os.path.join(self._work, rel))
    return p if p == self._work or p.startswith(self._work + os.sep) else None

  def _do_run(self, command: str):
    r = self._box.run(command)
    out = r.output
    if r.dropped_bytes:
      out += f"\n[... {r.dropped_bytes} more bytes of output dropped ...]"
    if r.killed == "timeout":
      out += f"\n[killed: the command ran past its {self._limits.time_s:g} s time limit]"
    elif r.killed == "cpu":
      out += f"\n[killed: the command used up its {self._limits.cpu_s} s CPU limit]"
    elif r.returncode:
      out += f"\n[exit code {r.returncode}]"
    if r.hit_nproc:
      out += f"\n[the command hit its limit of {self._limits.nproc} processes]"
    return out or "(no output)", True, r.killed

  def _do_view(self, rel: str, first: int, last: int):
    p = self._path(rel)
    if p is None or not os.path.exists(p):
      return f"No such file or directory in the repository: {rel}", False, None
    if os.path.isdir(p):
      names = sorted(n + ("/" if os.path.isdir(os.path.join(p, n)) else "")
                     for n in os.listdir(p) if n != ".git")
      return "\n".join(names) or "(empty directory)", True, None
    with open(p, errors="replace") as f:
      lines = f.read().splitlines()
    shown = [f"{i}: {lines[i - 1]}" for i in range(first, min(last, len(lines)) + 1)]
    head = f"[{rel}: lines {first}-{min(last, len(lines))} of {len(lines)}]"
    return "\n".join([head] + shown), True, None

  def _do_search(self, regex: str, rel: str | None):
    if rel is not None and self._path(rel) is None or (
        rel is not None and not os.path.exists(self._path(rel))):
      regex, rel = f"{regex} {rel}", None  # the last word was part of the pattern
    import shlex  # pylint: disable=import-outside-toplevel
    cmd = (f"grep -rnIE --exclude-dir=.git -e {shlex.quote(regex)} -- {shlex.quote(rel or '.')}"
           f" | head -n {A.SEARCH_HITS}")
    r = self._box.run(cmd)
    return r.output or "No matches.", True, r.killed

  def _do_replace(self, rel: str, old: str, new: str):
    p = self._path(rel)
    if p is None:
      return f"The path leaves the repository: {rel}", False, None
    if not os.path.exists(p):
      if old:
        return f"No such file: {rel}", False, None
      os.makedirs(os.path.dirname(p), exist_ok=True)
      with open(p, "w") as f:
        f.write(new)
      return f"Created {rel}.", True, None
    if os.path.isdir(p):
      return f"{rel} is a directory", False, None
    with open(p, errors="replace") as f:
      text = f.read()
    n = text.count(old) if old else 0
    if n != 1:
      return (f"The old text occurs {n} times in {rel}; it must occur exactly once "
              "(copy it exactly, with more lines for context)."), False, None
    with open(p, "w") as f:
      f.write(text.replace(old, new, 1))
    return f"Replaced in {rel}.", True, None

  # ---- grading and labels -------------------------------------------------------------------

  def _diff(self) -> str:
    return grading.diff_against(self._work, self._git, self._base_commit)

  def _grade(self, diff: str) -> grading.Report:
    if diff not in self._graded:
      self._graded[diff] = grading.grade(
          self._inst, self._base_tree(self._inst), diff, os.path.join(self._root, "grade"),
          self._grade_limits, self._mechanism)
    return self._graded[diff]

  def _oracle_label(self) -> float | None:
    if not self._oracle:
      return None
    f2p = self._grade(self._diff()).f2p_passed
    label, self._f2p = float(f2p - self._f2p), f2p
    return label

  def _info(self, valid: bool, label: float | None = None, won: bool = False,
            truncated: bool = False, killed: str | None = None,
            report: grading.Report | None = None) -> StepInfo:
    diff = self._diff()
    extra = {"instance_id": self._inst.instance_id, "split": self._split,
             "mechanism": self._box.mechanism, "killed": killed, "steps": self._steps}
    if report is not None:
      extra.update(f2p_passed=report.f2p_passed, f2p_total=report.f2p_total,
                   p2p_passed=report.p2p_passed, p2p_total=report.p2p_total,
                   patch_applied=report.patch_applied)
    return StepInfo(task=self._inst.problem_statement, admissible_actions=A.TEMPLATES,
                    anchor="diff:" + hashlib.sha1(diff.encode()).hexdigest(), won=won,
                    action_valid=valid, oracle_label=label, truncated=truncated, extra=extra)

  # ---- expert -------------------------------------------------------------------------------

  def _expert_plan(self) -> list[str]:
    plan = []
    for path, line, old, new in grading.hunks(self._inst.patch):
      n_old = max(1, old.count("\n"))
      plan.append(f"view {path} {line} {line + n_old - 1}")
      plan.append(A.replace_action(path, old, new))
    return plan + ["submit"]

  def _track_expert(self, action: str) -> None:
    if self._plan_pos < len(self._plan) and action == self._plan[self._plan_pos]:
      self._plan_pos += 1
    elif action == _RESTORE:
      self._plan_pos = 0
    elif action.lstrip().startswith(("run", "replace")):
      self._plan_pos = -1  # may have changed the files: off the plan

  def expert_action(self) -> str | None:
    if self._inst is None or self._done:
      return None
    if self._plan_pos < 0:
      return _RESTORE
    return self._plan[self._plan_pos]

  # ---- lifetime -----------------------------------------------------------------------------

  def _close_episode(self) -> None:
    if self._box is not None:
      self._box.close()
      self._box = None
    for d in ("work", "git", "grade"):
      shutil.rmtree(os.path.join(self._root, d), ignore_errors=True)

  def close(self) -> None:
    if getattr(self, "_root", None) is None:
      return
    self._close_episode()
    shutil.rmtree(self._root, ignore_errors=True)
    self._root = None

  def __del__(self):
    self.close()
