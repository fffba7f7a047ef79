"""SWE-bench task instances, repository checkouts and grading (host side).

Faithful to SWE-bench (Jimenez et al., ICLR 2024; the `swebench.harness` code):
  * an instance has SWE-bench's fields: instance_id, repo, base_commit, problem_statement,
    patch (the gold fix), test_patch, FAIL_TO_PASS, PASS_TO_PASS (JSON lists, or JSON
    strings holding lists as in the Hugging Face release); loaded from a .json file (one
    instance or a list), a .jsonl file, or a directory of those;
  * grading: a fresh checkout of base_commit, the model patch applied with `git apply`,
    the test files that test_patch touches restored to base_commit and test_patch applied,
    only those test files run (`get_test_directives`), the log parsed as
    `parse_log_pytest` does (the `-rA` summary lines "PASSED id", "FAILED id - msg"), and
    `resolved` iff every FAIL_TO_PASS and every PASS_TO_PASS test has status PASSED or
    XFAIL; a test missing from the log counts as failed (ResolvedStatus.FULL).
Differs: no per-instance Docker image or conda environment: tests run with this Python
(`sys.executable`) in the sandbox of `sandbox.py`, so an instance whose repository needs
other dependencies must have them importable here; one test command for every repository
(`python -m pytest -rA -p no:cacheprovider FILES`, plugin autoload off) instead of
SWE-bench's per-repo-version specs; the repository checkout comes from a local git clone
(`repos_dir/owner__name`, `repos_dir/name` or `repos_dir/owner/name`) instead of GitHub.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

from environments.swe.sandbox import Limits, Sandbox

PASSING = ("PASSED", "XFAIL")
_STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")
_GIT_ENV = {"GIT_AUTHOR_NAME": "swe", "GIT_AUTHOR_EMAIL": "swe@localhost",
            "GIT_COMMITTER_NAME": "swe", "GIT_COMMITTER_EMAIL": "swe@localhost",
            "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


@dataclasses.dataclass(frozen=True)
class Instance:
  instance_id: str
  repo: str
  base_commit: str
  problem_statement: str
  patch: str
  test_patch: str
  fail_to_pass: tuple[str, ...]
  pass_to_pass: tuple[str, ...]
  extra: tuple[tuple[str, str], ...] = ()  # other string fields (version, hints_text, ...)


def _tests(value) -> tuple[str, ...]:
  if isinstance(value, str):
    value = json.loads(value)
  if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
    raise ValueError(f"FAIL_TO_PASS / PASS_TO_PASS must be a list of test ids, got {value!r}")
  return tuple(value)


def instance_from_dict(d: dict) -> Instance:
  missing = [k for k in ("instance_id", "repo", "base_commit", "problem_statement", "patch",
                         "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS") if k not in d]
  if missing:
    raise ValueError(f"instance {d.get('instance_id', '?')} lacks fields {missing}")
  known = {"instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
           "FAIL_TO_PASS", "PASS_TO_PASS"}
  extra = tuple(sorted((k, str(v)) for k, v in d.items() if k not in known))
  return Instance(d["instance_id"], d["repo"], d["base_commit"], d["problem_statement"],
                  d["patch"], d["test_patch"], _tests(d["FAIL_TO_PASS"]),
                  _tests(d["PASS_TO_PASS"]), extra)


def instance_to_dict(inst: Instance) -> dict:
  d = dict(inst.extra)
  d.update(instance_id=inst.instance_id, repo=inst.repo, base_commit=inst.base_commit,
           problem_statement=inst.problem_statement, patch=inst.patch,
           test_patch=inst.test_patch, FAIL_TO_PASS=list(inst.fail_to_pass),
           PASS_TO_PASS=list(inst.pass_to_pass))
  return d


def load_instances(path: str) -> list[Instance]:
  """Instances from a .json / .jsonl file or a directory of them (files in name order)."""
  if os.path.isdir(path):
    files = sorted(os.path.join(path, f) for f in os.listdir(path)
                   if f.endswith((".json", ".jsonl")))
  elif os.path.exists(path):
    files = [path]
  else:
    raise FileNotFoundError(f"no SWE-bench instances at {path}")
  out = []
  for f in files:
    with open(f) as fh:
      text = fh.read()
    if f.endswith(".jsonl"):
      rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
      rows = json.loads(text)
      rows = rows if isinstance(rows, list) else [rows]
    out.extend(instance_from_dict(r) for r in rows)
  ids = [i.instance_id for i in out]
  if len(set(ids)) != len(ids):
    raise ValueError(f"duplicate instance ids in {path}")
  return out


# ---- git on the host (never on a git directory the sandboxed command can write) --------------

def git(args: list[str], cwd: str | None = None, stdin: bytes | None = None,
        check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  env = dict(os.environ, **_GIT_ENV, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
             **(env or {}))
  p = subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null"] + args,
                     cwd=cwd, input=stdin, capture_output=True, env=env)
  if check and p.returncode:
    raise RuntimeError(f"git {' '.join(args[:3])} failed: {p.stderr.decode(errors='replace')}")
  return p


def find_repo(repos_dir: str, repo: str) -> str:
  owner, _, name = repo.partition("/")
  for cand in (f"{owner}__{name}", name, os.path.join(owner, name)):
    path = os.path.join(repos_dir, cand)
    if os.path.isdir(path):
      return path
  raise FileNotFoundError(f"no local clone of {repo} under {repos_dir} "
                          f"(looked for {owner}__{name}, {name}, {owner}/{name})")


def export_tree(repo_path: str, commit: str, dest: str) -> None:
  """The files of `commit` into `dest` (no .git), as `git archive` writes them."""
  tar = git(["archive", "--format=tar", commit], cwd=repo_path).stdout
  os.makedirs(dest, exist_ok=True)
  with tarfile.open(fileobj=io.BytesIO(tar)) as t:
    t.extractall(dest, filter="tar")


def init_snapshot(tree: str, git_dir: str) -> str:
  """A private git dir (outside `tree`) with `tree`'s files committed; returns the commit."""
  base = ["--git-dir", git_dir, "--work-tree", tree]
  git(["init", "-q", "--bare", git_dir])
  git(base + ["config", "core.bare", "false"])
  git(base + ["add", "-A", "-f", "."])
  git(base + ["commit", "-q", "--no-verify", "-m", "base"])
  return git(base + ["rev-parse", "HEAD"]).stdout.decode().strip()


def diff_against(tree: str, git_dir: str, commit: str) -> str:
  """The working tree's changes against `commit` (new files included) as a patch."""
  base = ["--git-dir", git_dir, "--work-tree", tree]
  git(base + ["add", "-A", "-f", "."])
  return git(base + ["diff", "--cached", "--binary", commit]).stdout.decode(errors="replace")


def apply_patch(tree: str, patch: str) -> tuple[bool, str]:
  if not patch.strip():
    return True, ""
  p = git(["apply", "--whitespace=nowarn", "-"], cwd=tree, stdin=patch.encode(), check=False)
  return p.returncode == 0, p.stderr.decode(errors="replace")


def patch_files(patch: str) -> list[str]:
  """Paths a unified git diff touches (b/ side), in order."""
  return list(dict.fromkeys(re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, re.MULTILINE)))


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@[^\n]*\n", re.MULTILINE)


def hunks(patch: str) -> list[tuple[str, int, str, str]]:
  """(path, first old line, old text, new text) per hunk of a unified git diff."""
  edits = []
  for block in re.split(r"^(?=diff --git )", patch, flags=re.MULTILINE):
    m = re.match(r"diff --git a/\S+ b/(\S+)", block)
    if not m:
      continue
    path = m.group(1)
    found = list(_HUNK_RE.finditer(block))
    for h, nxt in zip(found, found[1:] + [None]):
      body = block[h.end():nxt.start() if nxt else len(block)]
      old, new = [], []
      for line in body.splitlines(keepends=True):
        if line.startswith("\\"):
          continue  # "\ No newline at end of file"
        tag, text = line[:1], line[1:]
        if tag in (" ", "-"):
          old.append(text)
        if tag in (" ", "+"):
          new.append(text)
      edits.append((path, int(h.group(1)), "".join(old), "".join(new)))
  return edits


# ---- SWE-bench's log parsing and resolution -------------------------------------------------

def parse_log_pytest(log: str) -> dict[str, str]:
  """test id -> status from pytest's `-rA` summary, as swebench's parse_log_pytest."""
  status = {}
  for line in log.splitlines():
    if any(line.startswith(s) for s in _STATUSES):
      if line.startswith("FAILED"):
        line = line.replace(" - ", " ")
      parts = line.split()
      if len(parts) > 1:
        status[parts[1]] = parts[0]
  return status


@dataclasses.dataclass(frozen=True)
class Report:
  resolved: bool
  f2p_passed: int
  f2p_total: int
  p2p_passed: int
  p2p_total: int
  patch_applied: bool
  log: str


def resolution(status: dict[str, str], inst: Instance, log: str = "",
               applied: bool = True) -> Report:
  f2p = sum(status.get(t) in PASSING for t in inst.fail_to_pass)
  p2p = sum(status.get(t) in PASSING for t in inst.pass_to_pass)
  ok = applied and f2p == len(inst.fail_to_pass) and p2p == len(inst.pass_to_pass)
  return Report(ok, f2p, len(inst.fail_to_pass), p2p, len(inst.pass_to_pass), applied, log)


def test_command(files: list[str], python: str = sys.executable) -> str:
  import shlex  # pylint: disable=import-outside-toplevel
  # Plugin autoload off: this venv's plugins (hypothesis, ...) are not the repository's
  # test environment, and loading them costs ~1.5 s of CPU per run.
  return " ".join(["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", shlex.quote(python), "-m", "pytest",
                   "-rA", "-p", "no:cacheprovider"]
                  + [shlex.quote(f) for f in files])


def grade(inst: Instance, base_tree: str, model_patch: str, scratch: str,
          limits: Limits = Limits(time_s=120, cpu_s=120), mechanism: str | None = None) -> Report:
  """SWE-bench's evaluation of `model_patch` on a fresh copy of `base_tree` (in `scratch`)."""
  if os.path.exists(scratch):
    shutil.rmtree(scratch)
  shutil.copytree(base_tree, scratch, symlinks=True)
  try:
    applied, err = apply_patch(scratch, model_patch)
    if not applied:
      return resolution({}, inst, f"model patch does not apply: {err}", applied=False)
    tests = patch_files(inst.test_patch)
    for f in tests:  # test files back to base_commit, then the hidden tests applied
      src, dst = os.path.join(base_tree, f), os.path.join(scratch, f)
      if os.path.exists(src):
        shutil.copy2(src, dst)
      elif os.path.exists(dst):
        os.remove(dst)
    ok, err = apply_patch(scratch, inst.test_patch)
    if not ok:
      raise RuntimeError(f"{inst.instance_id}: test_patch does not apply to base: {err}")
    with Sandbox(scratch, limits, mechanism) as box:
      result = box.run(test_command(tests))
    log = result.output + (f"\n[killed: {result.killed}]" if result.killed else "")
    return resolution(parse_log_pytest(result.output), inst, log)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
