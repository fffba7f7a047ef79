"""The sweep runner: its plan (seed-major, one SFT start per seed shared by its methods),
and a tiny real sweep end to end: runs, published result files, skip on re-run, report."""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from studies import report, sweep

TINY = ["sft.num_demos=6", "sft.epochs=1", "sft.batch_size=16", "rollout.tasks_per_iter=2",
        "rollout.group_size=3", "rollout.num_envs=6", "rollout.max_turns=4",
        "rollout.max_prompt_tokens=112", "rollout.max_action_tokens=6",
        "algo.minibatch_size=8", "eval.num_episodes=3", "rl_iterations=1",
        "tokenizer.vocab_size=512", "model.vocab_size=512", "model.max_seq_len=128",
        "env.kwargs.step_limit=4"]


def test_plan_is_seed_major_and_pairs_methods_on_one_sft_start(tmp_path):
  runs = sweep.plan("coin_doors", ["grpo", "csa"], [0, 1], ["x=1"], str(tmp_path))
  assert [r.name for r in runs] == ["sft_seed0", "grpo_seed0", "csa_seed0",
                                    "sft_seed1", "grpo_seed1", "csa_seed1"]
  assert "rl_iterations=0" in runs[0].overrides and runs[0].needs is None
  for r in runs[1:3]:
    assert r.needs == "sft_seed0" and "seed=0" in r.overrides and "x=1" in r.overrides
    assert f"sft.init_from={tmp_path / 'sft_seed0'}" in r.overrides


def test_prompted_runs_lead_each_seed_and_need_no_sft_start(tmp_path):
  runs = sweep.plan("keydoor_h4", ["csa"], [0, 1], ["x=1"], str(tmp_path), prompted=True)
  assert [r.name for r in runs] == ["prompted_seed0", "sft_seed0", "csa_seed0",
                                    "prompted_seed1", "sft_seed1", "csa_seed1"]
  pr = runs[0]
  assert pr.prompted and pr.needs is None and pr.overrides == ("seed=0", "x=1")
  args = sweep.parse_args(["--family", "keydoor_h4", "--methods", "csa", "--seeds", "1",
                           "--name", "st", "--prompted", "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports")])
  sw = sweep.Sweep(args)
  cmd = sw.command(sw.runs[0])
  assert cmd[-1] == "--prompted" and "--resume" not in cmd
  assert cmd[cmd.index("--exp") + 1] == "keydoor_h4_grpo"
  assert "rl_iterations=0" not in cmd and "--prompted" not in sw.command(sw.runs[1])


def test_several_families_are_one_study_with_a_folder_each(tmp_path):
  runs = sweep.plan(["keydoor_h4", "keydoor_h48"], ["csa"], [0, 1], [], str(tmp_path))
  assert [r.name for r in runs] == [
      "keydoor_h4/sft_seed0", "keydoor_h4/csa_seed0", "keydoor_h48/sft_seed0",
      "keydoor_h48/csa_seed0", "keydoor_h4/sft_seed1", "keydoor_h4/csa_seed1",
      "keydoor_h48/sft_seed1", "keydoor_h48/csa_seed1"]
  assert runs[3].exp == "keydoor_h48_csa" and runs[3].needs == "keydoor_h48/sft_seed0"
  assert f"sft.init_from={tmp_path / 'keydoor_h48' / 'sft_seed0'}" in runs[3].overrides
  # One family added to such a study later keeps its folder (and shares the SFT starts).
  more = sweep.plan(["keydoor_h48"], ["gigpo"], [0], [], str(tmp_path), by_family=True)
  assert [r.name for r in more] == ["keydoor_h48/sft_seed0", "keydoor_h48/gigpo_seed0"]


def test_commands_file_keeps_every_sweep_of_a_study(tmp_path):
  for methods in ("grpo", "csa", "grpo"):
    args = sweep.parse_args(["--family", "keydoor_h4", "--methods", methods, "--seeds", "1",
                             "--name", "st", "--runs-dir", str(tmp_path / "runs"),
                             "--reports-dir", str(tmp_path / "reports")])
    sweep.Sweep(args)._write_commands()
  lines = (tmp_path / "reports" / "st" / "commands.txt").read_text().splitlines()
  assert len(lines) == 3 and "--methods grpo" in lines[0] and "--methods csa" in lines[1]
  assert lines[2] == "python -m studies.report --name st"


def test_sft_start_counts_only_once_saved(tmp_path):
  args = sweep.parse_args(["--family", "twx_coin", "--methods", "grpo", "--seeds", "1",
                           "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports")])
  s = sweep.Sweep(args)
  sft = tmp_path / "runs" / "sweeps" / "twx_coin" / "sft_seed0" / "sft"
  sft.mkdir(parents=True)
  assert not s._sft_ready("sft_seed0")  # a running SFT stage has the directory already
  (sft / "0").mkdir()
  assert s._sft_ready("sft_seed0")


@pytest.mark.slow  # three launches: about 2 minutes on 2 idle cores
def test_tiny_sweep_end_to_end(tmp_path):
  argv = ["--family", "twx_coin", "--methods", "grpo", "--seeds", "1", "--name", "t",
          "--runs-dir", str(tmp_path / "runs"), "--reports-dir", str(tmp_path / "reports"),
          "--set", f"sft.demos_dir={tmp_path / 'demos'}"]
  for o in TINY:
    argv += ["--set", o]
  assert sweep.main(argv) == 0
  out = tmp_path / "reports" / "t" / "runs"
  for run in ("sft_seed0", "grpo_seed0"):
    assert sorted(os.listdir(out / run)) == ["DONE", "config.json", "eval", "metrics.jsonl"]
    assert os.listdir(out / run / "eval") == ["episodes.jsonl"]  # per-episode outcomes
  assert (tmp_path / "reports" / "t" / "commands.txt").read_text().startswith(
      "python -m studies.sweep --family twx_coin")
  # A second call finds everything done and launches nothing.
  logs = tmp_path / "runs" / "sweeps" / "t"
  before = {f: os.path.getmtime(logs / f) for f in os.listdir(logs) if f.endswith(".log")}
  assert sweep.main(argv) == 0
  assert before == {f: os.path.getmtime(logs / f) for f in before}
  report.main(["--name", "t", "--reports-dir", str(tmp_path / "reports")])
  with open(tmp_path / "reports" / "t" / "summary.csv") as f:
    rows = {r["method"]: r for r in csv.DictReader(f)}
  assert rows["grpo"]["seeds"] == "1" and float(rows["grpo"]["delta_vs_grpo_mean"]) == 0.0


@pytest.mark.slow  # three launches: about 2 minutes on 2 idle cores
def test_an_rl_run_from_a_kept_start_is_the_run_from_the_trained_one(tmp_path):
  argv = ["--family", "twx_coin", "--methods", "grpo", "--seeds", "1", "--name", "t",
          "--runs-dir", str(tmp_path / "runs"), "--reports-dir", str(tmp_path / "reports"),
          "--set", f"sft.demos_dir={tmp_path / 'demos'}", "--keep-starts"]
  for o in TINY:
    argv += ["--set", o]
  assert sweep.main(argv) == 0
  out = tmp_path / "reports" / "t" / "runs"
  first = (out / "grpo_seed0" / "metrics.jsonl").read_text()
  # A fresh machine (no runs/) with the RL run still to do: its start is restored, not
  # trained again, and the RL run writes the same numbers.
  shutil.rmtree(tmp_path / "runs")
  shutil.rmtree(out / "grpo_seed0")
  assert sweep.main(argv) == 0
  assert not (tmp_path / "runs" / "sweeps" / "t" / "sft_seed0.log").exists()

  def numbers(text):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in text.splitlines()]
  assert numbers((out / "grpo_seed0" / "metrics.jsonl").read_text()) == numbers(first)


def test_a_set_rl_iterations_reaches_the_rl_runs_but_not_the_sft_start(tmp_path):
  """Catches the bug that turned a study's SFT starts into 40-iteration RL runs: `--set
  rl_iterations=40` came after the SFT start's rl_iterations=0 and won."""
  from csa_jax.config import apply_overrides
  from experiments import get_experiment
  runs = sweep.plan("coin_doors", ["spa"], [0], ["rl_iterations=40"], str(tmp_path))
  # sft.init_from left out: apply_overrides checks that its checkpoint exists.
  sft, spa = (apply_overrides(get_experiment(r.exp),
                              [o for o in r.overrides if not o.startswith("sft.init_from=")])
              for r in runs)
  assert (sft.rl_iterations, spa.rl_iterations) == (0, 40)


@pytest.mark.parametrize("owned", ["seed=3", "sft.init_from=/elsewhere"])
def test_set_refuses_what_the_sweep_owns(owned, capsys):
  with pytest.raises(SystemExit):
    sweep.parse_args(["--family", "coin_doors", "--set", owned])
  assert "the sweep sets seed and sft.init_from itself" in capsys.readouterr().err


def test_a_seed_list_replaces_the_range_and_bad_lists_are_refused(capsys):
  assert sweep.parse_args(["--family", "coin_doors", "--seed-list", "0,1,3,8"]).seed_list \
      == [0, 1, 3, 8]
  assert sweep.parse_args(["--family", "coin_doors", "--seeds", "2", "--seed-offset", "4"]
                          ).seed_list == [4, 5]
  for bad in ("0,x", "1,1", "-1", ""):
    with pytest.raises(SystemExit):
      sweep.parse_args(["--family", "coin_doors", "--seed-list", bad])
    assert "--seed-list" in capsys.readouterr().err


def _git(cwd, *args):
  return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                        check=True).stdout


def test_commit_paths_commits_only_its_paths_and_only_changes(tmp_path):
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "config", "user.email", "t@t")
  _git(tmp_path, "config", "user.name", "t")
  (tmp_path / "commands.txt").write_text("a\n")
  (tmp_path / "other.txt").write_text("x\n")
  sweep.commit_paths(["commands.txt"], "first", cwd=str(tmp_path))
  assert _git(tmp_path, "log", "--format=%s").splitlines() == ["first"]
  sweep.commit_paths(["commands.txt"], "unchanged", cwd=str(tmp_path))  # nothing to commit
  (tmp_path / "commands.txt").write_text("a\nb\n")
  sweep.commit_paths(["commands.txt"], "second", cwd=str(tmp_path))
  assert _git(tmp_path, "log", "--format=%s").splitlines() == ["second", "first"]
  assert _git(tmp_path, "status", "--porcelain", "--untracked-files=no") == ""
  assert _git(tmp_path, "ls-files").split() == ["commands.txt"]  # other.txt left alone


def test_runs_ending_together_are_all_committed(tmp_path):
  """The jobs' threads commit as their runs end; two at once raced for git's index lock."""
  from concurrent.futures import ThreadPoolExecutor
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "config", "user.email", "t@t")
  _git(tmp_path, "config", "user.name", "t")
  names = [f"run{i}" for i in range(8)]
  for n in names:
    (tmp_path / n).mkdir()
    (tmp_path / n / "metrics.jsonl").write_text(n + "\n")
  with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda n: sweep.commit_paths([n], f"sweep: {n}", cwd=str(tmp_path)), names))
  assert sorted(_git(tmp_path, "log", "--format=%s").splitlines()) == [f"sweep: {n}" for n in names]
  assert _git(tmp_path, "status", "--porcelain") == ""


def test_commit_commits_commands_before_any_run(tmp_path, monkeypatch):
  """A sweep that adds its line to a committed commands.txt would otherwise leave a tracked
  file changed, and every run after it would record an unclean tree."""
  committed = []
  monkeypatch.setattr(sweep, "commit_paths", lambda paths, msg: committed.append((paths, msg)))
  args = sweep.parse_args(["--family", "keydoor_h4", "--methods", "", "--seeds", "1",
                           "--name", "st", "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports"), "--commit"])
  done = tmp_path / "reports" / "st" / "runs" / "sft_seed0"
  done.mkdir(parents=True)
  (done / "DONE").write_text("")  # the one planned run is finished: nothing runs
  assert sweep.Sweep(args).run() == 0
  assert committed == [([str(tmp_path / "reports" / "st" / "commands.txt")],
                        "sweep st: commands.txt")]


def _fake_start(workdir) -> dict[str, bytes]:
  """A finished SFT start's work directory as an RL run reads it: a saved step under sft/
  and the tokenizer; returns its files' bytes by relative path."""
  (workdir / "sft" / "0" / "default").mkdir(parents=True)
  (workdir / "sft" / "0" / "default" / "params").write_bytes(os.urandom(64))
  (workdir / "tokenizer.json").write_text('{"vocab": 512}')
  (workdir / "metrics.jsonl").write_text("{}\n")
  (workdir / "config.json").write_text("{}")
  return {str(p.relative_to(workdir)): p.read_bytes()
          for p in workdir.rglob("*") if p.is_file() and p.name in ("params", "tokenizer.json")}


def test_a_kept_start_is_restored_byte_for_byte_on_a_machine_without_it(tmp_path):
  args = sweep.parse_args(["--family", "keydoor_h4", "--methods", "grpo", "--seeds", "1",
                           "--name", "st", "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports"), "--keep-starts"])
  s = sweep.Sweep(args)
  work = tmp_path / "runs" / "sweeps" / "st" / "sft_seed0"
  files = _fake_start(work)
  s._publish(s.runs[0], {"run": "sft_seed0", "rc": 0})
  kept = tmp_path / "reports" / "st" / "starts" / "sft_seed0"
  assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(files)
  shutil.rmtree(tmp_path / "runs")  # a fresh machine: the committed reports alone
  assert sweep.Sweep(args)._sft_ready("sft_seed0")
  assert {f: (work / f).read_bytes() for f in files} == files


def test_a_start_is_kept_only_when_asked_and_restored_only_when_its_run_finished(tmp_path):
  argv = ["--family", "keydoor_h4", "--methods", "grpo", "--seeds", "1", "--name", "st",
          "--runs-dir", str(tmp_path / "runs"), "--reports-dir", str(tmp_path / "reports")]
  s = sweep.Sweep(sweep.parse_args(argv))
  _fake_start(tmp_path / "runs" / "sweeps" / "st" / "sft_seed0")
  s._publish(s.runs[0], {"run": "sft_seed0", "rc": 0})
  assert not (tmp_path / "reports" / "st" / "starts").exists()
  kept = tmp_path / "reports" / "st" / "starts" / "sft_seed0"
  _fake_start(kept)  # a kept copy whose run is not DONE (its files not published)
  os.remove(tmp_path / "reports" / "st" / "runs" / "sft_seed0" / "DONE")
  shutil.rmtree(tmp_path / "runs")
  assert not sweep.Sweep(sweep.parse_args(argv + ["--keep-starts"]))._sft_ready("sft_seed0")


def test_each_attempt_costs_a_line_committed_with_the_runs(tmp_path, monkeypatch):
  """The work directory goes with the machine, so an attempt's cost lives beside the study's
  runs: a finished run's line is committed with its files, a failed attempt's at once (a
  tracked file left changed would make every later run record an unclean tree)."""
  committed = []
  monkeypatch.setattr(sweep, "commit_paths", lambda paths, msg: committed.append(paths))
  args = sweep.parse_args(["--family", "keydoor_h4", "--methods", "", "--seeds", "2",
                           "--name", "st", "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports"), "--commit"])
  sw = sweep.Sweep(args)
  fail, ok = sw.runs
  writes = ("import os, sys; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
            "[open(os.path.join(d, f), 'w').write('{}') for f in ('metrics.jsonl', 'config.json')];"
            " sum(range(3_000_000))")
  monkeypatch.setattr(sw, "command", lambda run: (
      [sys.executable, "-c", "raise SystemExit(3)"] if run is fail
      else [sys.executable, "-c", writes, os.path.join(sw.work_root, run.name)]))
  costs = tmp_path / "reports" / "st" / "costs.jsonl"
  assert sw.execute(fail)[1] == 3 and committed == [[str(costs)]]
  assert sw.execute(ok)[1] == 0
  lines = [json.loads(line) for line in costs.read_text().splitlines()]
  assert [(c["run"], c["rc"]) for c in lines] == [(fail.name, 3), (ok.name, 0)]
  assert lines[1]["cpu_s"] > 0 and lines[1]["wall_s"] >= lines[1]["cpu_s"] * 0.5
  assert all(c["end"].endswith("Z") and c["end"].startswith("20") for c in lines)
  assert committed[1:] == [[str(tmp_path / "reports" / "st" / "runs" / ok.name), str(costs)]]
