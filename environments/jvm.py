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


def _new_session_kwargs() -> dict:
  return {"start_new_session": True}


@functools.cache
def safe_process_groups() -> None:
  """Makes py4j's `create_new_process_group=True` start the JVM in a new session without a
  Python preexec_fn (idempotent; py4j reads the kwargs from its module at each launch)."""
  from py4j import java_gateway  # pylint: disable=import-outside-toplevel
  java_gateway.get_create_new_process_group_kwargs = _new_session_kwargs
