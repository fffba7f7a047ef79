"""The `swe` environment: SWE-bench grading on a tiny instance in SWE-bench's own format, the
sandbox's limits, the synth task generator (real toolz, real tests), the expert, the pool."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from environments import make_env
from environments.pool import EnvPool
from environments.swe import actions as A
from environments.swe import grading, synth
from environments.swe.sandbox import Limits, Sandbox

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
VISIBLE_TESTS = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
GOLD = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def mul(a, b):
"""
# Fixes add and breaks mul: FAIL_TO_PASS passes, PASS_TO_PASS fails.
BREAKS_P2P = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,6 +1,6 @@
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def mul(a, b):
-    return a * b
+    return a ** b
"""
TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,5 +1,9 @@
-from calc import mul
+from calc import add, mul
 
 
 def test_mul():
     assert mul(2, 3) == 6
+
+
+def test_add():
+    assert add(2, 3) == 5
"""


def _git(cwd, *args):
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                 check=True, capture_output=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A SWE-bench-format instance (.jsonl, FAIL_TO_PASS as a JSON string as on the Hub) and
  a local clone of its repository at repos/acme__calc."""
  root = tmp_path_factory.mktemp("tiny")
  repo = root / "repos" / "acme__calc"
  (repo / "tests").mkdir(parents=True)
  (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
  _git(repo, "init", "-q")
  _git(repo, "add", "-A")
  _git(repo, "commit", "-qm", "first")
  (repo / "calc.py").write_text(BUGGY)
  (repo / "tests" / "test_calc.py").write_text(VISIBLE_TESTS)
  _git(repo, "add", "-A")
  _git(repo, "commit", "-qm", "mul, and a bug in add")
  base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                        text=True, check=True).stdout.strip()
  (repo / "calc.py").write_text("broken at a later commit\n")  # HEAD is not the base
  _git(repo, "commit", "-qam", "later")
  inst = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base,
          "problem_statement": "add(2, 3) returns -1", "patch": GOLD, "test_patch": TEST_PATCH,
          "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
          "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"]),
          "version": "0.1", "environment_setup_commit": base}
  path = root / "lite.jsonl"
  path.write_text(json.dumps(inst) + "\n")
  return {"instances": str(path), "repos_dir": str(root / "repos"), "root": root}


def _grade(tiny, patch):
  inst = grading.load_instances(tiny["instances"])[0]
  base = str(tiny["root"] / f"base{time.monotonic_ns()}")
  grading.export_tree(grading.find_repo(tiny["repos_dir"], inst.repo), inst.base_commit, base)
  return grading.grade(inst, base, patch, str(tiny["root"] / "scratch"))


def test_load_instances_reads_swebench_fields(tiny):
  (inst,) = grading.load_instances(tiny["instances"])
  assert inst.fail_to_pass == ("tests/test_calc.py::test_add",)
  assert inst.pass_to_pass == ("tests/test_calc.py::test_mul",)
  assert dict(inst.extra)["version"] == "0.1"
  assert grading.instance_from_dict(grading.instance_to_dict(inst)) == inst
  d = grading.instance_to_dict(inst)
  del d["test_patch"]
  with pytest.raises(ValueError, match="test_patch"):
    grading.instance_from_dict(d)


def test_grading_follows_swebench_definition(tiny):
  gold = _grade(tiny, GOLD)
  assert (gold.resolved, gold.f2p_passed, gold.p2p_passed) == (True, 1, 1), gold.log
  none = _grade(tiny, "")
  assert (none.resolved, none.f2p_passed, none.p2p_passed) == (False, 0, 1), none.log
  broke = _grade(tiny, BREAKS_P2P)
  assert (broke.resolved, broke.f2p_passed, broke.p2p_passed) == (False, 1, 0), broke.log
  bad = _grade(tiny, GOLD.replace("return a - b", "return a / b"))
  assert not bad.patch_applied and not bad.resolved


def test_hunks_of_a_patch():
  old = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
  assert grading.hunks(GOLD) == [("calc.py", 1, old, old.replace("a - b", "a + b"))]
  two = GOLD + TEST_PATCH
  assert [h[0] for h in grading.hunks(two)] == ["calc.py", "tests/test_calc.py"]
  assert grading.patch_files(two) == ["calc.py", "tests/test_calc.py"]


def test_parse_log_pytest_as_swebench():
  log = ("PASSED a.py::test_x\nFAILED a.py::test_y - AssertionError: 1 - 2\n"
         "ERROR b.py::test_z\nXFAIL a.py::test_w - reason\nsome PASSED noise\n")
  assert grading.parse_log_pytest(log) == {
      "a.py::test_x": "PASSED", "a.py::test_y": "FAILED", "b.py::test_z": "ERROR",
      "a.py::test_w": "XFAIL"}
  inst = grading.Instance("i", "r", "c", "", "", "", ("a.py::test_w",), ("a.py::test_x", "nope"))
  rep = grading.resolution(grading.parse_log_pytest(log), inst)
  assert (rep.f2p_passed, rep.p2p_passed, rep.resolved) == (1, 1, False)  # missing = failed


def _play(env, actions):
  r = None
  for a in actions:
    r = env.step(a)
  return r


def test_env_expert_resolves_tiny_instance_and_hides_tests(tiny):
  env = make_env("swe", source="swebench", instances=tiny["instances"],
                 repos_dir=tiny["repos_dir"], oracle_labels=True)
  try:
    r = env.reset("test", 0)
    assert r.info.task == "add(2, 3) returns -1" and r.info.admissible_actions == A.TEMPLATES
    obs = env.step("view tests/test_calc.py").observation
    assert "test_mul" in obs and "test_add" not in obs  # the hidden test is not there yet
    labels, rewards, steps = [], [], 0
    while not r.done:
      a = env.expert_action()
      r = env.step(a)
      labels.append(r.info.oracle_label)
      rewards.append(r.reward)
      steps += 1
    assert r.info.won and rewards == [0.0, 0.0, 1.0] and steps == 3
    assert labels == [0.0, 1.0, 0.0]  # the replace made test_add pass
    assert r.info.extra["f2p_passed"] == 1 and r.info.extra["p2p_passed"] == 1
    # Nothing done: not resolved. Off the expert's path, it restores first and still wins.
    r = env.reset("test", 0)
    r = env.step("submit")
    assert r.done and r.reward == 0.0 and not r.info.won
    env.reset("test", 0)
    a0 = env.step("run echo 'x = 1' >> calc.py").info.anchor
    assert env.expert_action() == "run git checkout -q -- . && git clean -fdq"
    while not r.done or r.info.extra.get("steps", 0) == 1:
      r = env.step(env.expert_action())
      if r.done:
        break
    assert r.info.won and r.info.anchor != a0
  finally:
    env.close()


def test_actions_and_invalid_ones(tiny):
  env = make_env("swe", source="swebench", instances=tiny["instances"],
                 repos_dir=tiny["repos_dir"], step_limit=20, max_obs_chars=100)
  try:
    r0 = env.reset("test", 0)
    bad = ["", "frobnicate", "view", "view calc.py 3 1", "view ../../etc/passwd",
           "replace calc.py\nno block", "submit now",
           A.replace_action("calc.py", "return a / b\n", "x\n"),
           A.replace_action("calc.py", "\n", "x\n"),  # a blank line occurs twice
           A.replace_action("calc.py/sub.py", "", "x\n"),  # under a file
           "view calc.py/x"]
    for a in bad:
      r = env.step(a)
      assert not r.info.action_valid and not r.done, a
      assert r.info.anchor == r0.info.anchor  # nothing changed
    assert "2: " in env.step("view calc.py 1 2").observation
    assert "calc.py:2:" in env.step("search return a - b").observation
    r = env.step("run python3 -c 'print(\"y\" * 500)'")
    assert len(r.observation) <= 100 + len("\n[... 401 characters elided ...]\n")
    assert "characters elided" in r.observation
    r = env.step(A.replace_action("new/mod.py", "", "z = 1\n"))
    assert r.info.action_valid and r.info.anchor != r0.info.anchor
    assert env.step("run cat new/mod.py && git status --short").observation.startswith("z = 1")
  finally:
    env.close()


def test_parse_and_truncate_rule():
  act = A.parse(A.replace_action("a.py", "x = 1\ny = 2\n", "x = 2\n"))
  assert act == A.Action("replace", ("a.py", "x = 1\ny = 2\n", "x = 2\n"))
  assert A.parse("view a.py") == A.Action("view", ("a.py", 1, A.VIEW_LINES))
  assert A.parse("  run ls -la ") == A.Action("run", ("ls -la",))
  assert A.truncate("abcdefghij", 10) == "abcdefghij"
  assert A.truncate("abcdefghijk", 4) == "ab\n[... 7 characters elided ...]\njk"


# ---- sandbox limits ---------------------------------------------------------------------

MECHANISMS = ["bwrap", "rlimit"]


@pytest.fixture(params=MECHANISMS)
def box(request, tmp_path):
  if request.param == "bwrap":
    assert shutil.which("bwrap"), \
        "bubblewrap is not installed: apt-get install bubblewrap"
  b = Sandbox(str(tmp_path), Limits(time_s=2, cpu_s=1, nproc=64, output_bytes=5000),
              mechanism=request.param)
  yield b
  b.close()


def test_infinite_loop_is_killed_and_reported(box):
  t = time.monotonic()
  r = box.run("while true; do :; done")
  assert time.monotonic() - t < 2 + 2.0
  assert r.killed in ("timeout", "cpu") and r.returncode in (None, 152, -24)


def test_fork_bomb_is_contained(box):
  t = time.monotonic()
  # The shell stays (sleep) while the bomb forks: without it the command's own shell
  # exits at once and whether the bomb reached the process cap first is a race.
  r = box.run(":(){ :|:& };:; sleep 10")
  assert time.monotonic() - t < 2 + 2.0
  assert r.killed == "timeout" or "Resource temporarily unavailable" in r.output
  assert r.hit_nproc == (box.nproc_mechanism == "cgroup")
  after = box.run("echo alive")  # the sandbox works again: the bomb is gone
  assert after.output == "alive\n" and after.killed is None
  if box.nproc_mechanism == "cgroup":  # no process of the bomb is alive
    with open(os.path.join(box._cgroup, "cgroup.procs")) as f:  # pylint: disable=protected-access
      assert f.read().split() == []


def test_background_process_does_not_outlive_command(box, tmp_path):
  r = box.run("(sleep 0.5; echo late > late.txt) &")
  assert r.returncode == 0 and r.seconds < 0.5
  time.sleep(0.8)
  assert not (tmp_path / "late.txt").exists()


def test_network_is_blocked(box):
  r = box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), "
              "timeout=2)\"")
  assert r.returncode != 0 and ("unreachable" in r.output or "disabled" in r.output), r.output


def test_output_cap(box):
  r = box.run("yes | head -c 20000")
  assert len(r.output) == 5000 and r.dropped_bytes == 15000


def test_write_outside_working_copy_is_refused(tmp_path):
  # Outside /tmp (the sandbox has a private /tmp): a directory beside the tests.
  outside = tempfile.mkdtemp(prefix=".swe_outside_", dir=os.path.dirname(__file__))
  marker = f"swe_probe_{os.getpid()}_{time.monotonic_ns()}.txt"
  try:
    work = tmp_path / "work"
    work.mkdir()
    with Sandbox(str(work), Limits(time_s=5), mechanism="bwrap") as b:
      r = b.run(f"echo x > {outside}/f.txt; echo y > inside.txt; echo z > /tmp/{marker}; "
                f"cat /tmp/{marker}")
    assert "Read-only file system" in r.output and r.output.endswith("z\n"), r.output
    assert not os.path.exists(os.path.join(outside, "f.txt"))
    assert not os.path.exists(f"/tmp/{marker}")  # /tmp inside was private
    assert (work / "inside.txt").read_text() == "y\n"
  finally:
    shutil.rmtree(outside)


def test_env_reports_runaway_command(tiny):
  env = make_env("swe", source="swebench", instances=tiny["instances"],
                 repos_dir=tiny["repos_dir"], command_time_s=2, max_processes=32)
  try:
    env.reset("test", 0)
    r = env.step("run sleep 30")
    assert "[killed: the command ran past its 2 s time limit]" in r.observation
    assert r.info.extra["killed"] == "timeout" and not r.done and r.info.action_valid
    assert "[exit code 3]" in env.step("run exit 3").observation
    # A fork bomb that stays in the sandbox until its time limit: with `; wait` the
    # command could end (its first pipeline's two processes return at once) before the
    # bomb's orphans reached the limit, a race a loaded machine lost (no output, rc 0).
    obs = env.step("run :(){ :|:& };:; sleep 10").observation
    assert ("[the command hit its limit of 32 processes]" in obs
            or env._box.nproc_mechanism != "cgroup"), obs  # pylint: disable=protected-access
  finally:
    env.close()


# ---- synth: real bugs in toolz ----------------------------------------------------------

@pytest.fixture(scope="module")
def synth_dirs(tmp_path_factory):
  return str(tmp_path_factory.mktemp("synth_a")), str(tmp_path_factory.mktemp("synth_b"))


def test_candidates_of_each_kind():
  root = os.path.dirname(os.path.dirname(importlib.util.find_spec("toolz").origin))
  cands = synth.candidates(root, "toolz/itertoolz.py")
  assert {m.kind for m in cands} == {"compare_op", "binary_op", "bool_op", "off_by_one",
                                     "remove_stmt", "wrong_branch"}
  by_kind = {m.kind: m for m in cands}
  assert by_kind["compare_op"].old != by_kind["compare_op"].new
  assert by_kind["remove_stmt"].new == ""


def test_generator_is_deterministic_and_tasks_are_real(synth_dirs):
  a = synth.SynthTasks(synth_dirs[0], seed=0)
  b = synth.SynthTasks(synth_dirs[1], seed=0)
  ia, ib = a.instance("train", 0), b.instance("train", 0)
  assert ia == ib  # same commits, patches, tests and issue text
  assert ia.fail_to_pass and ia.fail_to_pass[0] in ia.problem_statement
  assert not set(ia.fail_to_pass) & set(ia.pass_to_pass)
  # The gold patch restores exactly the installed toolz source (the independent reference).
  base = os.path.join(synth_dirs[0], "check")
  grading.export_tree(grading.find_repo(a.repos_dir, ia.repo), ia.base_commit, base)
  assert grading.apply_patch(base, ia.patch)[0]
  (path,) = grading.patch_files(ia.patch)
  installed = os.path.join(os.path.dirname(os.path.dirname(
      importlib.util.find_spec("toolz").origin)), path)
  assert open(os.path.join(base, path)).read() == open(installed).read()
  # The hidden FAIL_TO_PASS tests are absent from the base commit's test files.
  name = ia.fail_to_pass[0].split("::")[-1].split("[")[0]
  test_file = os.path.join(base, ia.fail_to_pass[0].split("::")[0])
  assert f"def {name}(" not in open(test_file).read()
  # Cached: a new object reads the stored tasks without running anything.
  assert synth.SynthTasks(synth_dirs[0], seed=0).instance("train", 0) == ia


def test_synth_expert_wins_and_no_patch_loses(synth_dirs):
  env = make_env("swe", cache_dir=synth_dirs[0], seed=0, num_train=1, num_test=1)
  try:
    r = env.reset("train", 0)
    while not r.done:
      r = env.step(env.expert_action())
    assert r.info.won and r.reward == 1.0
    env.reset("train", 0)
    r = env.step("submit")
    assert not r.info.won and r.reward == 0.0
    extra = r.info.extra
    assert extra["f2p_passed"] == 0 and extra["p2p_passed"] == extra["p2p_total"] > 0
  finally:
    env.close()


def test_pool_process_backend_survives_hostile_actions_and_a_killed_worker(tiny):
  kwargs = {"source": "swebench", "instances": tiny["instances"],
            "repos_dir": tiny["repos_dir"], "step_limit": 50, "command_time_s": 2}
  with EnvPool("swe", kwargs, 2, backend="process", step_timeout_s=60) as pool:
    pool.reset([0, 1], [("test", 0), ("test", 0)])
    for a in ["", "\x00", "run a\x00b", "view a\x00", "run " + "x" * 10000, "view \ud7ff",
              "replace", "run :(){ :|:& };:", "search (", "拿起硬币"]:
      for r in pool.step([0, 1], [a, a]):
        assert r.info.error is None and not r.done, (a, r.info.error)
    os.kill(pool.worker_pid(1), 9)
    r0, r1 = pool.step([0, 1], ["view calc.py", "view calc.py"])
    assert r0.info.error is None and r1.info.error is not None
    (r,) = pool.reset([1], [("test", 0)])
    assert r.info.error is None


@pytest.mark.slow
def test_launch_swe_csa_sft_then_rl(tmp_path):
  """`launch.py --exp swe_csa` on a tiny budget: expert demos (gold patches through the
  agent's edit commands), SFT, one RL iteration, evaluation on unseen-module tasks."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sets = [f"env.kwargs.cache_dir={tmp_path / 'synth'}", f"sft.demos_dir={tmp_path / 'demos'}",
          "sft.num_demos=2", "sft.epochs=1", "sft.batch_size=4", "rollout.tasks_per_iter=1",
          "rollout.group_size=2", "rollout.num_envs=2", "rollout.max_turns=2",
          "env.kwargs.step_limit=2", "rollout.max_prompt_tokens=2048",
          "rollout.max_action_tokens=256", "algo.minibatch_size=4", "eval.num_episodes=2",
          "eval.every=0", "rl_iterations=1", "env.num_train_tasks=2", "env.kwargs.num_train=2",
          "env.kwargs.num_test=2", "model.max_seq_len=2304", "tokenizer.vocab_size=512",
          "model.vocab_size=512", "model.num_layers=1", "model.hidden_size=64",
          "model.intermediate_size=128"]
  args = ["--exp", "swe_csa", "--workdir", str(tmp_path / "run")]
  for s in sets:
    args += ["--set", s]
  out = subprocess.run([sys.executable, "launch.py", *args], cwd=root, capture_output=True,
                       text=True, timeout=1800)
  assert out.returncode == 0, out.stderr[-3000:]
  recs = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  rl = [r for r in recs if "rollout/success" in r]
  assert len(rl) == 1 and rl[0]["rollout/episodes"] == 2
  assert any("sft/nll" in r for r in recs)
