"""Everything a new user can get wrong is refused at start: one line `launch.py: error: ...`
on stderr, exit code 2, and nothing in the work directory.

Driven through launch.py's `main` in this process (a refusal is `SystemExit(2)`), except the
budget refusal, which needs the demonstrations and a tokenizer, and runs as a real process.
Every config leaf with a range (csa_jax/config_fields.py) is also set just outside it.
"""

import errno
import math
import os
import subprocess
import sys
import tempfile

import pytest

import experiments
import launch
from csa_jax import config_fields
from csa_jax.config import ConfigError, ExperimentConfig, apply_overrides
from environments import demo
from tests.refusals import assert_refused, launch_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _refused_in_process(capsys, argv, workdir, *needles) -> str:
  """launch.py's refusal of `argv` in this process (tests/refusals.py)."""
  return assert_refused(lambda: launch_in_process(capsys, argv + ["--workdir", str(workdir)]),
                        workdir, *needles)


def _sets(*pairs):
  return [a for p in pairs for a in ("--set", p)]


# The mistakes a new user makes first, and more: (id, argv, needles).
TABLE = [
    ("num_demos=0", _sets("sft.num_demos=0"), ["sft.num_demos must be >= 1 (got 0)"]),
    ("sft.batch_size=0", _sets("sft.batch_size=0"), ["sft.batch_size must be >= 1"]),
    ("checkpoint_every=0", _sets("checkpoint_every=0"), ["checkpoint_every must be >= 1"]),
    ("estimator=nosuch", _sets("algo.estimator=nosuch"),
     ["algo.estimator must be one of", "'csa'", "'grpo'", "(got 'nosuch')"]),
    ("rl_iterations=-3", _sets("rl_iterations=-3"), ["rl_iterations must be >= 0 (got -3)"]),
    ("learning_rate=-1", _sets("optim.learning_rate=-1"),
     ["optim.learning_rate must be > 0 (got -1.0)"]),
    ("lam=2", _sets("algo.lam=2"), ["algo.lam must be in [0, 1] (got 2.0)"]),
    ("temperature=inf", _sets("rollout.temperature=inf"),
     ["rollout.temperature=inf: expected a finite number"]),
    ("temperature=nan", _sets("rollout.temperature=nan"), ["expected a finite number"]),
    ("log_every=0", _sets("log_every=0"), ["log_every must be >= 1"]),
    ("set-foo", ["--set", "foo"], ["--set expects key=value, got 'foo'"]),
    ("method=nosuch", _sets("algo.method=nosuch"), ["algo.method must be one of"]),
    ("env=nosuch", _sets("env.name=nosuch"), ["env.name must be one of", "'twx'"]),
    ("seed=-1", _sets("seed=-1"), ["seed must be >= 0"]),
    ("vocab", _sets("tokenizer.vocab_size=4096"),
     ["tokenizer.vocab_size=4096 exceeds model.vocab_size=512"]),
    # The rules across fields (config.validate; a rule on one field is config_fields'):
    ("prefill-divides", _sets("rollout.prefill_chunk=5"),
     ["rollout.prefill_chunk=5 must divide the sampler's rows per call"]),
    ("seq-len", _sets("rollout.max_prompt_tokens=100000"),
     ["rollout.max_prompt_tokens + rollout.max_action_tokens =", "exceeds model.max_seq_len"]),
    ("top_k", _sets("rollout.top_k=5"), ["rollout.top_k/top_p truncate the sampling"]),
    ("top_p", _sets("rollout.top_p=0.9"), ["rollout.top_k/top_p truncate the sampling"]),
    ("model_path", _sets("model_path=/nonexistent/model"),
     ["model_path '/nonexistent/model' is not a directory"]),
    ("mtdpo-kl", _sets("algo.method=mtdpo"),
     ["algo.method=mtdpo trains the DPO loss alone", "set algo.kl_coef=0"]),
    ("init_from", _sets("sft.init_from=/nonexistent/run"),
     ["sft.init_from '/nonexistent/run' holds no SFT checkpoint"]),
    ("micro-batch", _sets("optim.micro_batch_size=7"),
     ["optim.micro_batch_size=7 must divide algo.minibatch_size"]),
    ("eval-on-train", _sets("env.eval_split=train"),
     ["eval.first_task=0 would evaluate on training tasks"]),
    ("eval-off", _sets("eval.greedy=false", "eval.sampled=false"),
     ["eval.greedy and eval.sampled are both off"]),
    ("unknown-exp", ["--exp", "nosuch"], ["unknown experiment 'nosuch'; known: "]),
    ("unknown-key", _sets("rollout.grup_size=3"), ["unknown config key 'rollout.grup_size'"]),
    ("list-family", ["--list", "nosuch"], ["no experiment family 'nosuch'"]),
    ("step-alone", ["--step", "3"], ["--step and --sample go with --eval"]),
]


@pytest.mark.parametrize("argv, needles", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_bad_input_is_refused_at_start(tmp_path, capsys, argv, needles):
  _refused_in_process(capsys, argv, tmp_path / "w", *needles)


def test_a_workdir_that_is_a_file_is_refused(tmp_path, capsys):
  path = tmp_path / "f"
  path.write_text("x")
  _refused_in_process(capsys, [], path, "is a file, not a directory")
  assert path.read_text() == "x"
  _refused_in_process(capsys, [], path / "run", f"{path} is a file, not a directory")


def _read_only(monkeypatch, directory):
  """`directory` as a read-only mount: chmod where that binds (not root); as root, the
  probe's mkdtemp there fails as on a read-only file system."""
  os.chmod(directory, 0o555)
  if os.access(directory, os.W_OK):  # root
    real = tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **kw):  # pylint: disable=redefined-builtin
      if dir is not None and os.path.abspath(dir).startswith(str(directory)):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
      return real(*a, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)


@pytest.mark.parametrize("where", ["mount", "under"])
def test_a_read_only_workdir_is_refused(tmp_path, capsys, monkeypatch, where):
  mount = tmp_path / "ro"
  mount.mkdir()
  _read_only(monkeypatch, mount)
  try:
    workdir = mount if where == "mount" else mount / "a" / "run"
    line = _refused_in_process(capsys, [], workdir, "cannot write in")
    assert "read-only file system" in line or "Permission denied" in line, line
    assert os.listdir(mount) == []
  finally:
    os.chmod(mount, 0o755)


FLOAT_BAD = ("inf", "-inf", "nan")


def _leaf_cases():
  """(experiment, key, text) for every ranged leaf and every float leaf."""
  cases = []
  have = {}
  for exp in ("quickstart", "alfworld_csa"):  # alfworld_csa: model.rope_scaling.*
    for leaf in config_fields.leaves(experiments.get_experiment(exp)):
      have.setdefault(leaf.key, (exp, leaf))
  for key, (exp, leaf) in sorted(have.items()):
    field = config_fields.FIELDS.get(key)
    bad = list(field.rule.bad) if field and field.rule else []
    if leaf.declared is int:
      bad = [int(b) for b in bad if not isinstance(b, str)]
    if leaf.declared is float:
      bad += list(FLOAT_BAD)
    for b in bad:
      cases.append((exp, key, str(b)))
  return cases


LEAF_CASES = _leaf_cases()


def test_every_ranged_field_is_covered():
  keys = {k for _, k, _ in LEAF_CASES}
  ranged = {k for k, f in config_fields.FIELDS.items() if f.rule is not None}
  assert ranged <= keys, sorted(ranged - keys)
  assert len(LEAF_CASES) > 150


@pytest.mark.parametrize("exp, key, text", LEAF_CASES,
                         ids=[f"{k}={t}" for _, k, t in LEAF_CASES])
def test_each_field_out_of_range_is_refused(tmp_path, capsys, exp, key, text):
  line = _refused_in_process(capsys, ["--exp", exp, "--set", f"{key}={text}"], tmp_path / "w")
  assert key in line or key.split(".")[-1] in line, line


def test_every_leaf_of_every_experiment_has_help():
  """A field added to a config dataclass needs its entry in csa_jax/config_fields.py."""
  missing = set()
  for name in experiments.list_experiments():
    for leaf in config_fields.leaves(experiments.get_experiment(name)):
      f = config_fields.field_for(leaf.key)
      if f is None or not f.help.strip():
        missing.add(leaf.key)
  assert not missing, f"no help in csa_jax/config_fields.py FIELDS for {sorted(missing)}"
  declared = set(config_fields.declared_keys(ExperimentConfig))
  assert declared - set(config_fields.FIELDS) == set(), (
      f"no help in csa_jax/config_fields.py FIELDS for "
      f"{sorted(declared - set(config_fields.FIELDS))}")
  stale = set(config_fields.FIELDS) - declared
  assert not stale, f"FIELDS entries for keys no config declares: {sorted(stale)}"


def test_every_registered_experiment_validates():
  from csa_jax.config import validate
  for name in experiments.list_experiments():
    validate(experiments.get_experiment(name))


def test_estimators_come_from_the_registry(monkeypatch):
  """A newly registered estimator is valid at once (no list to keep in step)."""
  from csa_jax.estimators import registry
  cfg = experiments.get_experiment("quickstart")
  with pytest.raises(ConfigError, match="algo.estimator must be one of"):
    apply_overrides(cfg, ["algo.estimator=brand_new"])
  monkeypatch.setitem(registry._REGISTRY, "brand_new", registry._REGISTRY["csa"])
  assert apply_overrides(cfg, ["algo.estimator=brand_new"]).algo.estimator == "brand_new"


def test_python_configs_are_checked_too():
  """A config built in Python (an experiment file) is not parsed: types are checked."""
  import dataclasses

  from csa_jax.config import validate
  cfg = experiments.get_experiment("quickstart")
  for sub, field, value, needle in (
      ("rollout", "num_envs", 2.5, "expected an int"),
      ("algo", "lam", math.inf, "expected a finite number"),
      ("eval", "greedy", 1, "expected true or false"),
  ):
    bad = dataclasses.replace(cfg, **{sub: dataclasses.replace(getattr(cfg, sub),
                                                               **{field: value})})
    with pytest.raises(ConfigError, match=needle):
      validate(bad)


def test_show_config_lists_every_leaf_with_type_default_and_help(capsys):
  assert launch.main(["--exp", "twx_coin_grpo", "--show-config", "--set", "algo.lam=0.25"]) == 0
  out = capsys.readouterr().out
  cfg = experiments.get_experiment("twx_coin_grpo")
  lines = out.splitlines()
  for leaf in config_fields.leaves(cfg):
    row = next((l for l in lines if l.split() and l.split()[0] == leaf.key), None)
    assert row is not None, leaf.key
    assert leaf.type in row
  lam = next(l for l in lines if l.startswith("algo.lam "))
  assert "0.25" in lam and "[in [0, 1]]" in lam and "CSA" in lam


def test_list_groups_by_family_quickstart_first(capsys):
  assert launch.main(["--list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("quickstart ") and "[CPU]" in lines[0]
  assert len(lines) < 30
  full = next(l for l in lines if l.startswith("alfworld_* "))
  assert "[accelerator, needs model_path]" in full
  cpu = [i for i, l in enumerate(lines) if "[CPU]" in l]
  acc = [i for i, l in enumerate(lines) if "[accelerator" in l]
  assert max(cpu) < min(acc)
  assert launch.main(["--list", "twx_coin"]) == 0
  names = [l.split()[0] for l in capsys.readouterr().out.splitlines()]
  from experiments.variants import VARIANTS
  assert "twx_coin_csa" in names and "twx_coin_grpo" in names
  assert sorted(names) == sorted(f"twx_coin_{v}" for v in VARIANTS)


@pytest.mark.parametrize("argv, needle", [
    (["nosuch"], "unknown environment 'nosuch'; known: "),
    (["twx", "--expret", "1"], "--expret is neither a demo option"),
    (["twx", "--game", "nosuchgame"], "unknown TextWorldExpress game 'nosuchgame'"),
    (["twx", "--expert", "x"], "argument --expert: invalid int value"),
    (["twx", "--split", "nosplit"], "unknown split 'nosplit'"),
], ids=["env", "flag", "game", "int", "split"])
def test_the_demo_refuses_bad_arguments_in_one_line(capsys, argv, needle):
  with pytest.raises(SystemExit) as e:
    demo.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2
  assert len(err) == 1 and err[0].startswith("python -m environments.demo: error: "), err
  assert needle in err[0]


def test_the_demo_says_when_it_stops_at_max_steps(capsys):
  demo.main(["twx", "--game", "coin", "--expert", "1", "--random", "0", "--max_steps", "1"])
  out = capsys.readouterr().out
  assert "stopped at --max_steps 1 before the episode ended" in out


def test_a_budget_too_small_is_one_line_on_stderr(tmp_path):
  """Refused after the demonstrations are built (the tokenizer decides): tfds's progress
  bars and warnings stay off stderr."""
  work = tmp_path / "w"

  def run():
    out = subprocess.run(
        [sys.executable, "launch.py", "--exp", "quickstart_coin", "--workdir", str(work),
         *_sets("rollout.max_prompt_tokens=8", f"sft.demos_dir={tmp_path / 'demos'}",
                "sft.num_demos=4", "env.kwargs.step_limit=4", "rollout.num_envs=2",
                "eval.num_episodes=2")],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    return out.returncode, out.stderr

  line = assert_refused(run, work, "rollout.max_prompt_tokens=8 cannot hold")
  assert line.startswith("launch.py: error: rollout.max_prompt_tokens=8 cannot hold")


def test_swe_names_pytest_when_it_is_missing(capsys, monkeypatch):
  """The swe environment grades with pytest: without it, one line says what to install."""
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "pytest" else real(name, *a))
  with pytest.raises(SystemExit) as e:
    demo.main(["swe", "--expert", "1", "--random", "0"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert "grades with pytest, which is not installed" in err[0]
  assert "requirements.txt" in err[0]
