"""The command line: --list, and one clear line (no traceback) for each bad input."""

import json
import os
import subprocess
import sys

import pytest

from tests.refusals import assert_refused

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


# What launch.py imports before it answers: the program with sys.modules read at exit.
_IMPORTS = ("import atexit, json, runpy, sys; atexit.register(lambda: print(json.dumps("
            "sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax')))"
            ", file=sys.stderr)); sys.argv = ['launch.py', *sys.argv[1:]]; "
            "runpy.run_path('launch.py', run_name='__main__')")


@pytest.mark.parametrize("args, code", [(["--list"], 0), (["--exp", "nope"], 2)],
                         ids=["list", "unknown-experiment"])
def test_listing_and_an_unknown_experiment_import_no_jax(args, code):
  """Catches a jax, flax or optax import on the way to the experiments' configs (a top-level
  import in csa_jax/config.py, config_fields.py or csa_jax/model/): `--list` and a wrong
  --exp would take 4 s of CPU on a slow machine instead of 0.2 s. (A config that is
  validated imports jax: the estimator's name is checked against the registry of
  csa_jax/estimators/.)"""
  out = subprocess.run([sys.executable, "-c", _IMPORTS, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == code, out.stderr[-2000:]
  assert json.loads(out.stderr.strip().splitlines()[-1]) == []


def test_resume_without_checkpoint(tmp_path):
  out = launch("--resume", "--workdir", str(tmp_path / "w"))
  assert out.returncode == 2 and "no checkpoint" in out.stderr
  assert "Traceback" not in out.stderr


# Start-up refusals: one line naming the problem, exit code 2, and no work directory left
# behind. A tiny budget keeps the runs that get as far as the demonstrations short.
TINY = ["--exp", "quickstart_coin", "--set", "sft.num_demos=4", "--set", "env.kwargs.step_limit=4",
        "--set", "rollout.num_envs=2", "--set", "eval.num_episodes=2"]


def _refused(workdir, *args, needles, env=None) -> str:
  """launch.py's refusal of `args` in a subprocess (tests/refusals.py)."""
  def run():
    out = launch(*args, "--workdir", str(workdir), env=env)
    return out.returncode, out.stderr

  return assert_refused(run, workdir, *needles, only_line=False)


@pytest.mark.parametrize("args, needles", [
    (["--exp", "quickstart_coin", "--set", "env.kwargs.game=nosuchgame"],
     ["unknown TextWorldExpress game 'nosuchgame'"]),
    (["--set", "env.eval_split=nosplit"], ["split 'nosplit'", "unknown split"]),
    (["--set", "env.train_split=dev", "--set", "env.num_train_tasks=100000"],
     ["env.num_train_tasks = 100000", "tasks in split 'dev'"]),
    (["--exp", "alfworld_tiny_csa", "--set", "env.kwargs.source=official"],
     ["no official ALFWorld data at", "alfworld-download"]),
    (["--exp", "scienceworld_csa", "--set", "env.kwargs.task=boil-nothing"],
     ["unknown ScienceWorld task 'boil-nothing'"]),
], ids=["twx-game", "split", "task-range", "alfworld-data", "scienceworld-task"])
def test_bad_environment_settings_are_refused_before_anything_is_written(tmp_path, args, needles):
  work = tmp_path / "w"
  env = dict(os.environ, ALFWORLD_DATA=str(tmp_path / "no_alfworld_data"))
  _refused(work, *args, needles=needles, env=env)


def _malformed_model(tmp_path):
  path = tmp_path / "model"
  path.mkdir()
  (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')
  return path


def test_a_malformed_model_directory_is_one_line(tmp_path):
  work = tmp_path / "w"
  _refused(work, "--set", f"model_path={_malformed_model(tmp_path)}",
           "--set", f"sft.demos_dir={tmp_path / 'demos'}", *TINY,
           needles=["model_path", "malformed JSON in", "config.json"])
  assert not os.path.exists(tmp_path / "demos")  # refused before building demonstrations


@pytest.mark.parametrize("budget, needle", [
    ("rollout.max_prompt_tokens=8", "rollout.max_prompt_tokens=8 cannot hold the task line "
                                    "and the action list"),
    ("rollout.max_action_tokens=2", "rollout.max_action_tokens=2 cannot hold the expert's"),
])
def test_budgets_too_small_for_the_environment_are_refused_with_the_minimum(
    tmp_path, budget, needle):
  work = tmp_path / "w"
  line = _refused(work, "--set", budget, "--set", f"sft.demos_dir={tmp_path / 'demos'}", *TINY,
                  needles=[needle, "at least "])
  minimum = int(line.split("at least ")[1].split()[0])
  assert minimum > int(budget.split("=")[1])


def test_demonstrations_from_another_environment_version_are_refused(tmp_path):
  from environments.demos import VERSION_FILE, build_demos
  demos = tmp_path / "demos"
  import experiments
  cfg = experiments.get_experiment("quickstart_coin")
  kwargs = dict(cfg.env.kwargs, step_limit=4)
  builder = build_demos(str(demos), "twx", kwargs, {"train": 4})
  stamp = os.path.join(str(builder.data_dir), VERSION_FILE)
  with open(stamp) as f:
    assert f.read().startswith("twx r1, textworld-express ")
  with open(stamp, "w") as f:
    f.write("twx r0, textworld-express 0.0.1\n")
  work = tmp_path / "w"
  _refused(work, "--set", f"sft.demos_dir={demos}", *TINY,
           needles=["were made with twx r0, textworld-express 0.0.1", "this is twx r1",
                    "delete that directory"])
