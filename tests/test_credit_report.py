"""The credit report regenerates from the committed runs (reports/credit/runs/*) in place."""

import os
import shutil

from studies import credit_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_report_regenerates_from_its_own_committed_runs(tmp_path):
  reports = tmp_path / "reports"
  shutil.copytree(os.path.join(ROOT, "reports", "credit", "runs"), reports / "credit" / "runs")
  dirs = sorted(str(p) for p in (reports / "credit" / "runs").iterdir())
  before = {d: open(os.path.join(d, "results.csv")).read() for d in dirs}
  path = credit_report.write_report(dirs, "credit", reports_dir=str(reports))  # no SameFileError
  assert os.path.exists(path)
  for png in ("metrics_G8.png", "vs_G.png"):
    assert os.path.getsize(reports / "credit" / png) > 10_000
  for d in dirs:
    assert open(os.path.join(d, "results.csv")).read() == before[d]
  md = open(path).read()
  assert "--report " + " ".join(dirs) in md
