"""The credit report regenerates from the committed runs (reports/credit/runs/*) in place,
byte for byte: the page, its CSV and its figures."""

import os
import shutil

from studies import credit_report
from tests.test_committed_reports import assert_same

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUTS = ("credit.md", "credit/summary.csv", "credit/metrics_G8.png", "credit/vs_G.png")


def test_report_regenerates_from_its_own_committed_runs(tmp_path, monkeypatch):
  committed = os.path.join(ROOT, "reports", "credit")
  reports = tmp_path / "reports"
  shutil.copytree(os.path.join(committed, "runs"), reports / "credit" / "runs")
  shutil.copy(os.path.join(committed, "verdict.md"), reports / "credit")
  monkeypatch.chdir(tmp_path)  # the page records the command with the paths as given
  dirs = sorted(os.path.join("reports", "credit", "runs", d)
                for d in os.listdir(reports / "credit" / "runs"))
  before = {d: open(os.path.join(d, "results.csv")).read() for d in dirs}
  path = credit_report.write_report(dirs, "credit")  # no SameFileError
  assert os.path.exists(path)
  for d in dirs:
    assert open(os.path.join(d, "results.csv")).read() == before[d]
  assert "--report " + " ".join(dirs) in open(path).read()
  command = "python -m studies.credit --report reports/credit/runs/* --name credit"
  for out in OUTPUTS:
    with open(reports / out, "rb") as f:
      assert_same(os.path.join(ROOT, "reports", out), f.read(), command)
