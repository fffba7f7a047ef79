"""Starting the Java engines (TextWorldExpress, ScienceWorld) safely from a threaded trainer.

Both engines run in a JVM that py4j's `launch_gateway` starts. Its
`create_new_process_group=True` (which keeps Ctrl-C in a terminal from reaching the engines
the trainer still needs while it saves) is done with `preexec_fn=os.setpgrp`: Python code
run in the child between fork and exec. In a process with other threads (the environment
pool's workers, TensorBoard's writer, XLA's) a lock held by one of them at fork time stays
held forever in the child, which then never execs: the launching thread waits for it
without end. This hung a test run here (an env-pool thread in `Popen._execute_child`, its
forked child in a futex). `start_new_session=True` does the same separation (setsid, a new
session and process group) in C inside `fork_exec`, with no Python code in the child.
"""

from __future__ import annotations

import functools
import os


def _new_session_kwargs() -> dict:
  return {"start_new_session": True}


@functools.cache
def safe_process_groups() -> None:
  """Makes py4j's `create_new_process_group=True` start the JVM in a new session without a
  Python preexec_fn (idempotent; py4j reads the kwargs from its module at each launch)."""
  from py4j import java_gateway  # pylint: disable=import-outside-toplevel
  java_gateway.get_create_new_process_group_kwargs = _new_session_kwargs


def extra_java_opts(engine: str) -> list[str]:
  """JVM options for one engine's JVMs from the environment, `CSA_JAX_<ENGINE>_JAVA_OPTS`
  (engine "twx" or "scienceworld"; space-separated), after the engine's own options.

  For work that starts many short-lived engines, where the JVM's start-up is most of its
  cost: `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC` (the client compiler only, one GC
  thread) cut a TextWorldExpress JVM's CPU by about 40 % and halve a warm engine's steps
  per second, so the test suite sets it and a training run leaves it unset. The variable is
  per engine because the same options slow ScienceWorld, whose engine works hard per step.
  """
  return os.environ.get(f"CSA_JAX_{engine.upper()}_JAVA_OPTS", "").split()
