"""How a test checks that launch.py refused its input, by launch.py's convention: exit code
2, no traceback, one line `launch.py: error: ...` that names the problem, and the work
directory left as it was."""

from __future__ import annotations

import os
from typing import Callable

import pytest


def workdir_state(path) -> object:
  """What "left as it was" compares: absent, a file, or a directory's entries."""
  if not os.path.exists(path):
    return None
  return "a file" if os.path.isfile(path) else sorted(os.listdir(path))


def launch_in_process(capsys, argv: list[str]) -> tuple[int, str]:
  """(exit code, stderr) of launch.main(argv) run in this process."""
  import launch  # pylint: disable=import-outside-toplevel

  with pytest.raises(SystemExit) as e:
    launch.main(argv)
  return e.value.code, capsys.readouterr().err


def assert_refused(run: Callable[[], tuple[int, str]], workdir, *needles: str,
                   only_line: bool = True) -> str:
  """Runs `run()` -> (exit code, stderr) and checks the refusal; returns its line, which
  holds every needle. `only_line=False` lets a subprocess's stderr carry other lines
  before it (library warnings)."""
  before = workdir_state(workdir)
  code, err = run()
  assert code == 2, err[-2000:]
  assert "Traceback" not in err, err[-2000:]
  lines = err.strip().splitlines()
  if only_line:
    assert len(lines) == 1, err
  assert lines[-1].startswith("launch.py: error: "), err[-2000:]
  for needle in needles:
    assert needle in lines[-1], lines[-1]
  assert workdir_state(workdir) == before, (before, workdir_state(workdir))
  return lines[-1]
