"""The command line: --list, and one clear line (no traceback) for each bad input."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(*args, env=None):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=env)


def test_list_names_experiments():
  out = launch("--list")
  assert out.returncode == 0, out.stderr
  assert "quickstart" in out.stdout


@pytest.mark.parametrize("args, needle", [
    (["--exp", "nope"], "unknown experiment 'nope'; known: "),
    (["--set", "rollout.grup_size=3"], "unknown config key 'rollout.grup_size'"),
    (["--set", "rollout.group_size=x"], "expected int"),
    (["--mesh", "4x2"], "XLA_FLAGS=--xla_force_host_platform_device_count"),
    (["--mesh", "banana"], "mesh"),
])
def test_bad_input_is_one_clear_line(args, needle):
  out = launch(*args)
  assert out.returncode == 2
  assert needle in out.stderr
  assert "Traceback" not in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_resume_without_checkpoint(tmp_path):
  out = launch("--resume", "--workdir", str(tmp_path / "w"))
  assert out.returncode == 2 and "no checkpoint" in out.stderr
  assert "Traceback" not in out.stderr
