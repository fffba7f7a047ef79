"""A host-side pool of text environments with batched reset/step and fault tolerance.

The rollout side of agent-RL systems such as verl-agent (arXiv 2505.10978) and EnvPool
(arXiv 2206.10558): N environments of one kind, one per slot, stepped in parallel with
a batched API. Two backends:

  "thread": one daemon thread per slot, for engines whose work happens outside Python
    (TextWorldExpress / ScienceWorld JVMs behind py4j release the GIL while they wait).
  "process": one worker process per slot (forkserver), for engines whose Python work
    dominates (ALFWorld's TextWorld + planner).

Environments are built lazily inside their worker on the slot's first call, so all slots
start in parallel. Fault tolerance: when a slot's call raises, exceeds `step_timeout_s`,
or its worker (or the JVM under it) dies, that slot's result is
`StepResult(done=True, info.truncated=True, info.error=...)`, its worker is discarded
(a hung thread is abandoned after its env is closed; a process is killed), and a fresh
env is built on the slot's next reset. The other slots of the batch are unaffected.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import queue
import signal
import threading
import time
import traceback
from typing import Any, Sequence

import environments.faulty  # noqa: F401  (registers "faulty" here and in worker processes)
from environments.base import StepInfo, StepResult
from environments.registry import list_envs, make_env

BACKENDS = ("thread", "process")
_CLOSE = "__close__"


def _call_env(env_holder: dict, env_name: str, env_kwargs: dict, method: str, args: tuple):
  if env_holder.get("env") is None:
    if method == "close":
      return None
    env_holder["env"] = make_env(env_name, **env_kwargs)
  return getattr(env_holder["env"], method)(*args)


def _short_traceback(exc: BaseException) -> str:
  lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
  return "".join(lines).strip()[-2000:]


class _ThreadWorker:
  """One daemon thread that owns one env; calls are queued to it."""

  def __init__(self, env_name: str, env_kwargs: dict, name: str):
    self._env_name, self._env_kwargs = env_name, env_kwargs
    self._holder: dict[str, Any] = {}
    self._queue: queue.Queue = queue.Queue()
    self._future: concurrent.futures.Future | None = None
    # Daemon: a thread stuck in an engine call must not block interpreter exit.
    self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
    self._thread.start()

  @property
  def env(self):
    return self._holder.get("env")

  @property
  def pid(self) -> int | None:
    return None

  def _loop(self):
    while True:
      item = self._queue.get()
      if item is None:
        return
      future, method, args = item
      if not future.set_running_or_notify_cancel():
        continue
      try:
        future.set_result(_call_env(self._holder, self._env_name, self._env_kwargs, method, args))
      except BaseException as e:  # pylint: disable=broad-except
        future.set_exception(e)

  def start(self, method: str, args: tuple) -> None:
    self._future = concurrent.futures.Future()
    self._queue.put((self._future, method, args))

  def finish(self, deadline: float) -> tuple[bool, Any]:
    try:
      return True, self._future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
      return False, "timed out"
    except BaseException as e:  # pylint: disable=broad-except
      return False, _short_traceback(e)

  def kill(self) -> None:
    """Abandons the thread; closing its env from here unblocks a call stuck in the engine."""
    self._queue.put(None)
    env = self._holder.get("env")
    if env is not None:
      closer = threading.Thread(target=_quiet_close, args=(env,), daemon=True)
      closer.start()
      # Wait a little so that teardown does not overlap the caller's next work; a close
      # that itself hangs is left behind (daemon).
      closer.join(timeout=10.0)

  def close(self, timeout: float) -> None:
    future = concurrent.futures.Future()
    self._queue.put((future, "close", ()))
    self._queue.put(None)
    try:
      if self._holder.get("env") is not None:
        future.result(timeout=timeout)
    except BaseException:  # pylint: disable=broad-except
      self.kill()
    self._thread.join(timeout=0.1)


def _quiet_close(env) -> None:
  try:
    env.close()
  except Exception:  # pylint: disable=broad-except
    pass


def _process_main(conn, env_name: str, env_kwargs: dict) -> None:
  # Ctrl-C reaches the whole terminal process group; the parent decides when workers end
  # (it saves a checkpoint after the current iteration first), so they ignore it.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  holder: dict[str, Any] = {}
  try:
    while True:
      method, args = conn.recv()
      if method == _CLOSE:
        break
      try:
        conn.send((True, _call_env(holder, env_name, env_kwargs, method, args)))
      except BaseException as e:  # pylint: disable=broad-except
        conn.send((False, _short_traceback(e)))
  except (EOFError, KeyboardInterrupt):
    pass
  finally:
    if holder.get("env") is not None:
      _quiet_close(holder["env"])


def _mp_context():
  ctx = multiprocessing.get_context("forkserver")
  # Children fork from a server that has imported the environments package once.
  ctx.set_forkserver_preload(["environments"])
  return ctx


class _ProcessWorker:
  """One worker process that owns one env; requests and results go over a pipe."""

  def __init__(self, env_name: str, env_kwargs: dict, name: str):
    ctx = _mp_context()
    self._conn, child = ctx.Pipe()
    self._proc = ctx.Process(target=_process_main, args=(child, env_name, env_kwargs),
                             name=name, daemon=True)
    self._proc.start()
    child.close()
    self._send_error: Exception | None = None

  @property
  def env(self):
    return None

  @property
  def pid(self) -> int | None:
    return self._proc.pid

  def start(self, method: str, args: tuple) -> None:
    self._send_error = None
    try:
      self._conn.send((method, args))
    except (OSError, ValueError) as e:
      self._send_error = e

  def finish(self, deadline: float) -> tuple[bool, Any]:
    if self._send_error is not None:
      self._proc.join(timeout=1.0)
      return False, (f"worker process died (exit code {self._proc.exitcode}): "
                     f"{self._send_error!r}")
    try:
      if not self._conn.poll(max(0.0, deadline - time.monotonic())):
        return False, "timed out"
      return self._conn.recv()
    except (EOFError, OSError) as e:
      self._proc.join(timeout=1.0)
      return False, f"worker process died (exit code {self._proc.exitcode}): {e!r}"

  def kill(self) -> None:
    if self._proc.is_alive():
      self._proc.kill()
    self._proc.join(timeout=5.0)
    self._conn.close()

  def close(self, timeout: float) -> None:
    try:
      self._conn.send((_CLOSE, ()))
      self._proc.join(timeout=timeout)
    except (OSError, ValueError):
      pass
    self.kill()


def failed_result(task: str, error: str) -> StepResult:
  """What a slot returns for a call that raised, hung or lost its worker."""
  info = StepInfo(task=task, admissible_actions=(), anchor="", truncated=True, error=error)
  return StepResult(observation="", reward=0.0, done=True, info=info)


class EnvPool:
  """`num_envs` environments of one kind, addressed by slot, stepped in parallel."""

  def __init__(self, env_name: str, env_kwargs: dict | None = None, num_envs: int = 1, *,
               backend: str = "thread", step_timeout_s: float = 60.0,
               start_timeout_s: float = 120.0):
    if env_name not in list_envs():
      raise KeyError(f"unknown environment {env_name!r}; known: {', '.join(list_envs())}")
    if backend not in BACKENDS:
      raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if step_timeout_s <= 0:
      raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
    self.env_name = env_name
    self.env_kwargs = dict(env_kwargs or {})
    self.backend = backend
    self.step_timeout_s = float(step_timeout_s)
    # Extra time for a call that first builds the env (JVM start, game loading).
    self.start_timeout_s = float(start_timeout_s)
    self._workers: list[_ThreadWorker | _ProcessWorker | None] = [None] * num_envs
    self._tasks = [""] * num_envs
    # A slot whose call failed answers steps with an error until it is reset.
    self._broken: list[str | None] = [None] * num_envs
    self.num_restarts = 0

  @property
  def num_envs(self) -> int:
    return len(self._workers)

  def worker_pid(self, slot: int) -> int | None:
    """The slot's worker process id (process backend, once started), else None."""
    worker = self._workers[slot]
    return None if worker is None else worker.pid

  # --- batched API --------------------------------------------------------------------

  def reset(self, slots: Sequence[int], tasks: Sequence[tuple[str, int]]) -> list[StepResult]:
    slots = self._check_slots(slots, tasks, "tasks")
    for slot in slots:
      self._broken[slot] = None
    outcomes = self._run(slots, "reset", [tuple(t) for t in tasks])
    results = []
    for slot, (ok, value) in zip(slots, outcomes):
      if ok:
        self._tasks[slot] = value.info.task
        results.append(value)
      else:
        results.append(failed_result(self._tasks[slot], value))
    return results

  def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
    slots = self._check_slots(slots, actions, "actions")
    live = [i for i, s in enumerate(slots) if self._broken[s] is None]
    outcomes = self._run([slots[i] for i in live], "step", [(actions[i],) for i in live])
    results: list[StepResult | None] = [None] * len(slots)
    for i, (ok, value) in zip(live, outcomes):
      results[i] = value if ok else failed_result(self._tasks[slots[i]], value)
    for i, slot in enumerate(slots):
      if results[i] is None:
        results[i] = failed_result(self._tasks[slot], self._broken[slot])
    return results

  def expert_action(self, slots: Sequence[int]) -> list[str | None]:
    slots = self._check_slots(slots, slots, "slots")
    live = [s for s in slots if self._broken[s] is None]
    outcomes = dict(zip(live, self._run(live, "expert_action", [()] * len(live))))
    return [outcomes[s][1] if s in outcomes and outcomes[s][0] else None for s in slots]

  def close(self) -> None:
    for slot, worker in enumerate(self._workers):
      if worker is not None:
        worker.close(timeout=5.0)
        self._workers[slot] = None

  def __enter__(self) -> EnvPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # --- internals ----------------------------------------------------------------------

  def _check_slots(self, slots, values, what) -> list[int]:
    slots = [int(s) for s in slots]
    if len(values) != len(slots):
      raise ValueError(f"got {len(slots)} slots but {len(values)} {what}")
    if len(set(slots)) != len(slots):
      raise ValueError(f"slots must be distinct, got {slots}")
    bad = [s for s in slots if not 0 <= s < self.num_envs]
    if bad:
      raise IndexError(f"slots {bad} out of range 0..{self.num_envs - 1}")
    return slots

  def _worker(self, slot: int):
    """The slot's worker and whether it is new (its env is built during this call)."""
    if self._workers[slot] is not None:
      return self._workers[slot], False
    cls = _ThreadWorker if self.backend == "thread" else _ProcessWorker
    self._workers[slot] = cls(self.env_name, self.env_kwargs, f"envpool-{self.env_name}-{slot}")
    return self._workers[slot], True

  def _run(self, slots: list[int], method: str, args: list[tuple]) -> list[tuple[bool, Any]]:
    """Starts `method` on every slot, then collects; a failed slot is torn down."""
    started: dict[int, tuple[Any, bool]] = {}
    outcomes: dict[int, tuple[bool, Any]] = {}
    for slot, a in zip(slots, args):
      try:
        worker, fresh = self._worker(slot)
        worker.start(method, a)
        started[slot] = (worker, fresh)
      except Exception as e:  # pylint: disable=broad-except
        outcomes[slot] = (False, f"could not start the worker: {e!r}")
    deadline = time.monotonic() + self.step_timeout_s
    for slot, (worker, fresh) in started.items():
      outcomes[slot] = worker.finish(deadline + (self.start_timeout_s if fresh else 0.0))
    for slot in slots:
      ok, value = outcomes[slot]
      if not ok:
        if value == "timed out":
          value = f"{method} timed out (step_timeout_s={self.step_timeout_s:g})"
        value = f"slot {slot}: {method} failed: {value}"
        outcomes[slot] = (False, value)
        self._restart(slot, value)
    return [outcomes[s] for s in slots]

  def _restart(self, slot: int, error: str) -> None:
    worker, self._workers[slot] = self._workers[slot], None
    if worker is not None:
      worker.kill()
    self._broken[slot] = error
    self.num_restarts += 1
