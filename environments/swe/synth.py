"""`source=synth`: bugs injected into a real package's real code, checked by its own tests.

In the manner of SWE-smith (Yang et al., 2025, "SWE-smith: Scaling Data for Software
Engineering Agents"; its procedural modifiers): one function of `toolz` (a pure-Python
package, installed from PyPI, whose test suite ships inside it and runs in about 2 s on one
core) is mutated by one of
  compare_op   a comparison operator swapped (< and >=, == and !=, in and not in, ...)
  binary_op    + and - swapped
  bool_op      and / or swapped
  off_by_one   an integer literal n made n+1 or n-1
  remove_stmt  one simple statement (assignment, augmented assignment, call) removed
  wrong_branch an `if` condition negated
and the mutation is kept only when, run against the package's whole suite (in the
sandbox), at least one test that passed now fails (these are FAIL_TO_PASS, at most
`MAX_F2P`), every other test still passes (PASS_TO_PASS: the other tests of the files
holding FAIL_TO_PASS tests, as SWE-bench runs only the test_patch's files), and nothing
fails to collect. Each task is stored as a SWE-bench instance (`grading.Instance`) over a
git repository in the cache: its base_commit holds the mutated module and the test files
without their FAIL_TO_PASS test functions, `patch` (the gold fix) restores the function and
`test_patch` adds the hidden tests back, so the environment, the grading and the expert are
exactly those of real SWE-bench instances.

Splits are disjoint by module (train: itertoolz, dicttoolz, recipes; test: functoolz) so
test tasks are bugs in code no training task touched (train has 248 candidate mutations in
37 functions, test 211 in 38; about 3 in 4 are kept). Candidates of a split are shuffled
with `seed` and validated in that order (a function may carry several tasks, each a
different mutation); a candidate whose gold hunk would not be unique for the `replace`
action is dropped too. Tasks are made lazily (task k of a split needs the first k+1 kept
candidates) and cached on disk under a key of the package version, this generator's
revision and the seed, with a lock so pool workers share one cache. The same seed gives
the same tasks, commits, patches and issue text (validation runs with PYTHONHASHSEED=0,
COLUMNS=100 and address randomisation off).

Issue text: the first FAIL_TO_PASS test's id and its pytest traceback (`--tb=short`), and
how many tests fail, as a user's bug report that pastes a failing test would read.

Not faithful to SWE-bench: the issues are not written by people (no prose, no hints of
intent, but a traceback that names the failing line), every fix is a one-line or
one-statement change in one function of one file, the difficulty is far below real GitHub
issues, and there is one small repository. It is not SWE-bench and is never called so.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import shutil
import tempfile

from environments.swe import grading
from environments.swe.sandbox import Limits, Sandbox, make_temp_dir

PACKAGE = "toolz"
TOP_LEVEL = ("toolz", "tlz")  # tlz is toolz's own alias package, imported by its tests
TEST_DIR = "toolz/tests"
SPLIT_MODULES = {"train": ("toolz/itertoolz.py", "toolz/dicttoolz.py", "toolz/recipes.py"),
                 "test": ("toolz/functoolz.py",)}
REPO = "synth/toolz"
GEN_REVISION = 7  # bump when the candidates, the checks or the issue text change
MAX_F2P = 10
_COMPARE_SWAP = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "==",
                 "in": "not in", "not in": "in", "is": "is not", "is not": "is"}
_BIN_SWAP = {"+": "-", "-": "+"}
_BOOL_SWAP = {"and": "or", "or": "and"}
# The pristine suite runs in ~2 s; a mutation that makes a test loop is cut off (and, its
# summary missing, rejected) after 15 s. The task set is the same on every machine as long
# as no valid run comes near that limit.
_VALIDATE_LIMITS = Limits(time_s=15, cpu_s=15, output_bytes=16_000_000)


@dataclasses.dataclass(frozen=True)
class Mutation:
  path: str  # file in the repository
  function: str  # qualified name of the function mutated
  kind: str
  line: int  # 1-based first line edited
  old: str  # the lines [line, line + n) as they were
  new: str  # what replaces them

  @property
  def key(self) -> str:
    return f"{self.path}:{self.function}:{self.kind}:{self.line}:{self.new.strip()[:40]}"


# ---- candidates -------------------------------------------------------------------------

def _segment(lines, a, b) -> str | None:
  """Source between two (line, col) points on one line, else None."""
  (l1, c1), (l2, c2) = a, b
  return lines[l1 - 1][c1:c2] if l1 == l2 else None


def _replace_on_line(path, fn, kind, lines, line, c1, c2, new_text) -> Mutation:
  old = lines[line - 1]
  return Mutation(path, fn, kind, line, old, old[:c1] + new_text + old[c2:])


def _op_swaps(path, fn, lines, node) -> list[Mutation]:
  out = []
  if isinstance(node, ast.Compare):
    operands = [node.left] + node.comparators
    pairs = zip(operands, operands[1:])
    table, kind = _COMPARE_SWAP, "compare_op"
  elif isinstance(node, ast.BinOp):
    pairs, table, kind = [(node.left, node.right)], _BIN_SWAP, "binary_op"
  elif isinstance(node, ast.BoolOp):
    pairs, table, kind = zip(node.values, node.values[1:]), _BOOL_SWAP, "bool_op"
  else:
    return out
  for left, right in pairs:
    seg = _segment(lines, (left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset))
    op = " ".join(seg.split()) if seg is not None else None
    if op in table:
      c1 = left.end_col_offset + seg.index(op.split()[0])
      c2 = c1 + len(seg.strip())
      out.append(_replace_on_line(path, fn, kind, lines, left.end_lineno, c1, c2, table[op]))
  return out


def _constant(path, fn, lines, node) -> list[Mutation]:
  if (not isinstance(node, ast.Constant) or type(node.value) is not int
      or node.lineno != node.end_lineno
      or _segment(lines, (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))
      != str(node.value)):
    return []
  return [_replace_on_line(path, fn, "off_by_one", lines, node.lineno, node.col_offset,
                           node.end_col_offset, str(v))
          for v in (node.value + 1, node.value - 1) if v >= 0]


def _branch(path, fn, lines, node) -> list[Mutation]:
  if not isinstance(node, ast.If):
    return []
  t = node.test
  seg = _segment(lines, (t.lineno, t.col_offset), (t.end_lineno, t.end_col_offset))
  if seg is None:
    return []
  return [_replace_on_line(path, fn, "wrong_branch", lines, t.lineno, t.col_offset,
                           t.end_col_offset, f"not ({seg})")]


def _removals(path, fn, lines, node) -> list[Mutation]:
  out = []
  for field in ("body", "orelse", "finalbody"):
    block = getattr(node, field, None)
    if not isinstance(block, list) or len(block) < 2:
      continue  # removing a block's only statement would not parse
    for stmt in block:
      simple = isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or (
          isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call))
      if not simple:
        continue
      first = lines[stmt.lineno - 1]
      last = lines[stmt.end_lineno - 1]
      if first[:stmt.col_offset].strip() or last[stmt.end_col_offset:].strip():
        continue  # shares a line with other code
      old = "".join(lines[stmt.lineno - 1:stmt.end_lineno])
      out.append(Mutation(path, fn, "remove_stmt", stmt.lineno, old, ""))
  return out


def _functions(tree):
  """(qualified name, FunctionDef) for every function and method, outermost first."""
  def walk(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        yield name, child
        yield from walk(child, name + ".")
      elif isinstance(child, ast.ClassDef):
        yield from walk(child, prefix + child.name + ".")
  yield from walk(tree, "")


def candidates(root: str, path: str) -> list[Mutation]:
  """Every mutation of every function in `root/path`, in source order."""
  with open(os.path.join(root, path)) as f:
    src = f.read()
  lines = src.splitlines(keepends=True)
  out = []
  for name, fn in _functions(ast.parse(src)):
    nested = {id(n) for sub in ast.walk(fn) if sub is not fn
              and isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              for n in ast.walk(sub)}
    body_start = fn.body[0].end_lineno + 1 if ast.get_docstring(fn) else fn.body[0].lineno
    for node in ast.walk(fn):
      if id(node) in nested or getattr(node, "lineno", body_start) < body_start:
        continue  # nested functions are their own candidates; skip signature and docstring
      for make in (_op_swaps, _constant, _branch, _removals):
        out.extend(make(path, name, lines, node))
  seen, unique = set(), []
  for m in sorted(out, key=lambda m: (m.line, m.kind, m.new)):
    if m.key not in seen:
      seen.add(m.key)
      unique.append(m)
  return unique


def apply_mutation(root: str, m: Mutation) -> None:
  p = os.path.join(root, m.path)
  with open(p) as f:
    lines = f.read().splitlines(keepends=True)
  n = m.old.count("\n") or 1
  if "".join(lines[m.line - 1:m.line - 1 + n]) != m.old:
    raise ValueError(f"mutation {m.key} does not match {m.path}")
  lines[m.line - 1:m.line - 1 + n] = [m.new] if m.new else []
  with open(p, "w") as f:
    f.write("".join(lines))


# ---- hiding tests and writing issues ----------------------------------------------------

def remove_tests(root: str, test_ids: list[str]) -> bool:
  """Deletes the functions of `test_ids` from their files; False if one is not found."""
  by_file: dict[str, set[tuple[str, ...]]] = {}
  for tid in test_ids:
    path, *names = tid.split("::")
    by_file.setdefault(path, set()).add(tuple(n.split("[")[0] for n in names))
  for path, targets in by_file.items():
    p = os.path.join(root, path)
    with open(p) as f:
      src = f.read()
    lines = src.splitlines(keepends=True)
    spans = []
    tree = ast.parse(src)
    for target in targets:
      body, node = tree.body, None
      for name in target:
        node = next((n for n in body if getattr(n, "name", None) == name), None)
        if node is None:
          return False
        body = getattr(node, "body", [])
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
      start = min([node.lineno] + [d.lineno for d in node.decorator_list])
      spans.append((start, node.end_lineno))
    for start, end in sorted(set(spans), reverse=True):
      del lines[start - 1:end]
    with open(p, "w") as f:
      f.write("".join(lines))
  return True


def failure_text(log: str, test_id: str, max_lines: int = 30) -> str:
  """The pytest --tb=short section of `test_id` from a log."""
  path, *names = test_id.split("::")
  title = ".".join(names)
  m = re.search(r"^_{3,} " + re.escape(title) + r" _{3,}$\n(.*?)(?=^_{3,} |^={3,} )", log,
                re.MULTILINE | re.DOTALL)
  body = m.group(1).strip("\n") if m else "(no traceback captured)"
  body = re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", body)  # object addresses differ run to run
  lines = body.splitlines()
  if len(lines) > max_lines:
    lines = lines[:max_lines // 2] + ["..."] + lines[-max_lines // 2:]
  return "\n".join(lines)


def issue_text(f2p: list[str], log: str) -> str:
  others = ", ".join(f2p[1:4]) + (f" and {len(f2p) - 4} more" if len(f2p) > 4 else "")
  more = f"\n\n{len(f2p) - 1} other test(s) fail as well: {others}" if len(f2p) > 1 else ""
  return (f"After a recent change, `{f2p[0]}` fails:\n\n```\n{failure_text(log, f2p[0])}\n```"
          f"{more}\n\nThe test is right; the library code is wrong. Please fix the library.")


# ---- the task set ------------------------------------------------------------------------

def package_version() -> str:
  return importlib.metadata.version(PACKAGE)


def _run_suite(tree: str, mechanism: str | None) -> tuple[dict[str, str], str]:
  # The tracebacks become the issue text, which must be the same in every run: a fixed hash
  # seed and width, and address randomisation off (`setarch -R`), as hash(None) is its
  # address before Python 3.12, and sets holding None print in hash order.
  cmd = "setarch -R env " + grading.test_command([TEST_DIR]) + " --tb=short"
  with Sandbox(tree, _VALIDATE_LIMITS, mechanism,
               env={"PYTHONHASHSEED": "0", "COLUMNS": "100"}) as box:
    result = box.run(cmd)
  return grading.parse_log_pytest(result.output), result.output


def _copy_package(dest: str) -> None:
  for name in TOP_LEVEL:
    src = os.path.dirname(importlib.util.find_spec(name).origin)
    shutil.copytree(src, os.path.join(dest, name),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


class SynthTasks:
  """The cached, lazily grown task set of one seed; `repos_dir` holds its git repository."""

  def __init__(self, cache_dir: str, seed: int = 0, mechanism: str | None = None):
    key = f"synth-{PACKAGE}-{package_version()}-r{GEN_REVISION}-seed{seed}"
    self.root = os.path.join(os.path.expanduser(cache_dir), key)
    self.repos_dir = os.path.join(self.root, "repos")
    self.repo = os.path.join(self.repos_dir, REPO.replace("/", "__"))
    self.seed = seed
    self.mechanism = mechanism
    os.makedirs(self.root, exist_ok=True)
    self._tasks: dict[str, list[grading.Instance]] = {}

  @contextlib.contextmanager
  def _lock(self):
    with open(os.path.join(self.root, "lock"), "w") as f:
      fcntl.flock(f, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)

  def _state_path(self, split: str) -> str:
    return os.path.join(self.root, f"{split}.json")

  def _load(self, split: str) -> dict:
    p = self._state_path(split)
    if not os.path.exists(p):
      return {"tried": 0, "tasks": []}
    with open(p) as f:
      return json.load(f)

  def _save(self, split: str, state: dict) -> None:
    tmp = self._state_path(split) + ".tmp"
    with open(tmp, "w") as f:
      json.dump(state, f, indent=1)
    os.replace(tmp, self._state_path(split))

  def instance(self, split: str, index: int) -> grading.Instance:
    if split not in SPLIT_MODULES:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLIT_MODULES)}")
    tasks = self._tasks.get(split, [])
    if index >= len(tasks):
      with self._lock():
        state = self._load(split)
        if index >= len(state["tasks"]):
          self._grow(split, state, index + 1)
      tasks = [grading.instance_from_dict(d) for d in state["tasks"]]
      self._tasks[split] = tasks
    return tasks[index]

  # -- generation (under the lock) --

  def _pristine(self) -> tuple[str, str, dict[str, str]]:
    """(pristine tree dir, its commit, the suite's statuses there)."""
    tree = os.path.join(self.root, "pristine")
    meta = os.path.join(self.root, "pristine.json")
    if not os.path.exists(meta):
      shutil.rmtree(tree, ignore_errors=True)
      shutil.rmtree(self.repo, ignore_errors=True)
      os.makedirs(tree)
      _copy_package(tree)
      os.makedirs(self.repos_dir, exist_ok=True)
      commit = grading.init_snapshot(tree, os.path.join(self.repo, ".git"))
      status, log = _run_suite(self._scratch_copy(tree), self.mechanism)
      if not status or any(s not in ("PASSED", "SKIPPED", "XFAIL") for s in status.values()):
        last = (log.strip().splitlines() or ["no output"])[-1][:200]
        raise RuntimeError(f"{PACKAGE}'s own suite does not pass here: "
                           f"{status or 'no test ran'} (last line of its log: {last})")
      with open(meta, "w") as f:
        json.dump({"commit": commit, "status": status}, f)
    with open(meta) as f:
      d = json.load(f)
    return tree, d["commit"], d["status"]

  def _scratch_copy(self, tree: str) -> str:
    scratch = os.path.join(make_temp_dir("swe_synth_"), "t")
    shutil.copytree(tree, scratch)
    return scratch

  def _ordered(self, split: str, pristine: str) -> list[Mutation]:
    cands = [m for path in SPLIT_MODULES[split] for m in candidates(pristine, path)]
    random.Random(f"{self.seed}:{split}").shuffle(cands)
    return cands

  def _grow(self, split: str, state: dict, want: int) -> None:
    pristine, commit, base_status = self._pristine()
    cands = self._ordered(split, pristine)
    while len(state["tasks"]) < want:
      if state["tried"] >= len(cands):
        raise RuntimeError(f"synth split {split!r} has only {len(state['tasks'])} tasks "
                           f"({len(cands)} candidates tried)")
      m = cands[state["tried"]]
      state["tried"] += 1
      task = self._validate(m, pristine, commit, base_status, split, len(state["tasks"]))
      if task is not None:
        task["function"] = f"{m.path}:{m.function}"
        state["tasks"].append(task)
      self._save(split, state)

  def _validate(self, m: Mutation, pristine: str, commit: str, base: dict[str, str],
                split: str, k: int) -> dict | None:
    scratch = self._scratch_copy(pristine)
    try:
      apply_mutation(scratch, m)
      status, log = _run_suite(scratch, self.mechanism)
      if set(status) != set(base):
        return None  # a test vanished or appeared: collection broke
      f2p = sorted(t for t, s in base.items() if s == "PASSED" and status[t] != "PASSED")
      if not f2p or len(f2p) > MAX_F2P or any(
          status[t] not in ("PASSED", "SKIPPED", "XFAIL") for t in base if t not in f2p):
        return None
      files = sorted({t.split("::")[0] for t in f2p})
      p2p = sorted(t for t, s in status.items() if s == "PASSED" and t.split("::")[0] in files)
      if not remove_tests(scratch, f2p):
        return None
      base_commit = self._commit(scratch, commit, f"synth {split} {k}: {m.key}")
      git_dir = os.path.join(self.repo, ".git")
      patch = grading.git(["--git-dir", git_dir, "diff", "--binary", base_commit, commit, "--",
                           m.path]).stdout.decode()
      test_patch = grading.git(["--git-dir", git_dir, "diff", "--binary", base_commit,
                                commit, "--"] + files).stdout.decode()
      with open(os.path.join(scratch, m.path)) as f:
        source = f.read()
      if any(source.count(old) != 1 for _, _, old, _ in grading.hunks(patch)):
        return None  # the expert's replacement would be ambiguous
      inst = grading.Instance(
          instance_id=f"synth__toolz-{self.seed}-{split}-{k:04d}", repo=REPO,
          base_commit=base_commit, problem_statement=issue_text(f2p, log), patch=patch,
          test_patch=test_patch, fail_to_pass=tuple(f2p), pass_to_pass=tuple(p2p),
          extra=(("mutation", m.kind), ("version", package_version())))
      return grading.instance_to_dict(inst)
    finally:
      shutil.rmtree(os.path.dirname(scratch), ignore_errors=True)

  def _commit(self, tree: str, parent: str, message: str) -> str:
    git_dir = os.path.join(self.repo, ".git")
    with tempfile.TemporaryDirectory(dir=self.root) as tmp:
      env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}  # a private index: no checkout
      grading.git(["--git-dir", git_dir, "--work-tree", tree, "add", "-A", "-f", "."], env=env)
      sha_tree = grading.git(["--git-dir", git_dir, "write-tree"], env=env).stdout.decode().strip()
    return grading.git(["--git-dir", git_dir, "commit-tree", sha_tree, "-p", parent,
                        "-m", message]).stdout.decode().strip()
